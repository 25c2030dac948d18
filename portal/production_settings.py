"""Production settings: the base settings plus checks that refuse an unsafe configuration at start-up."""

from django.core.exceptions import ImproperlyConfigured

from kernel.env import env_bool, env_int
from portal.settings import *  # noqa: F403
from portal.settings import DEFAULT_SECRET_KEY, SECRET_KEY

if DEBUG:  # noqa: F405
    raise ImproperlyConfigured("GPUPOOL_DEBUG is on: production settings refuse to start with DEBUG enabled.")
if SECRET_KEY == DEFAULT_SECRET_KEY or len(SECRET_KEY) < 50:
    raise ImproperlyConfigured(
        "GPUPOOL_SECRET_KEY is unset, the development default or shorter than 50 characters; set a random one, "
        "e.g. `python -c 'import secrets; print(secrets.token_urlsafe(64))'`."
    )

# The audit trail refuses its development key ring and signing key (GPUPOOL_AUDIT_MASTER_KEYS/_SIGNING_KEY).
GPUPOOL_AUDIT_REQUIRE_REAL_KEYS = True

SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
LANGUAGE_COOKIE_SECURE = True
LANGUAGE_COOKIE_HTTPONLY = True
LANGUAGE_COOKIE_SAMESITE = "Lax"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# TLS is usually terminated by a reverse proxy; it must set X-Forwarded-Proto.
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env_bool("GPUPOOL_SSL_REDIRECT", default=True)
SECURE_HSTS_SECONDS = env_int("GPUPOOL_HSTS_SECONDS", 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = True
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]
