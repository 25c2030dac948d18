"""The demo users' shared password, alone in a module without Django.

The browser-test and screenshot driver (``portal.livedemo``) logs in with it from a process that has no Django
settings, so it cannot import ``portal.demo`` (models and services at its top).
"""

DEMO_PASSWORD = "gpupool-demo-2026"
