"""gpupool-agent: the node agent. Imports nothing from Django or the portal."""

__version__ = "0.1.0"
