"""Settings for gpupool, read from environment variables.

With nothing set, gpupool runs in *embedded mode*: a SQLite file under ``GPUPOOL_DATA_DIR``, an in-process
Celery broker (``memory://``, the worker runs in the web process) and an in-memory Channels layer.
Setting ``GPUPOOL_REDIS_URL`` switches Celery's broker/result backend and the Channels layer to Redis;
setting ``GPUPOOL_DATABASE_URL`` switches the database (PostgreSQL in production).

``portal.production_settings`` layers the production checks on top of this module.
"""

from __future__ import annotations

import json
from pathlib import Path

import dj_database_url

from kernel.env import env_bool, env_float, env_int, env_list, env_str
from kernel.security import DEFAULT_CSP as _DEFAULT_CSP

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env_str("GPUPOOL_DATA_DIR", str(BASE_DIR / "var")))

# A development-only key; portal.production_settings refuses to start with it.
DEFAULT_SECRET_KEY = "gpupool-insecure-development-key-change-me"
SECRET_KEY = env_str("GPUPOOL_SECRET_KEY", DEFAULT_SECRET_KEY)
DEBUG = env_bool("GPUPOOL_DEBUG", default=False)
ALLOWED_HOSTS = env_list("GPUPOOL_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("GPUPOOL_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "django_tables2",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "axes",
    "django_otp",
    "django_otp.plugins.otp_totp",
    "portal",
    "catalog",
    "tenants",
    "scheduler",
    "scheduler.fleet",
    "audit",
    "frontend",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "kernel.security.ContentSecurityPolicyMiddleware",
    "audit.context.RequestIdMiddleware",
    # Before sessions, CSRF and authentication: NUL bytes, over-deep JSON and oversize bodies are a 400/413.
    "kernel.request_limits.RequestLimitsMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django_otp.middleware.OTPMiddleware",
    "tenants.middleware.RequireSecondFactorMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes requires: turns a locked-out sign-in into its lockout response.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "portal.urls"
ASGI_APPLICATION = "portal.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.template.context_processors.i18n",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "frontend.context_processors.audit_integrity",
            ],
        },
    },
]

# --- Database -----------------------------------------------------------------------------------------
DATABASE_URL = env_str("GPUPOOL_DATABASE_URL", "")
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=env_int("GPUPOOL_DB_CONN_MAX_AGE", 0))}
else:
    DATABASES = {
        "default": {
            "ENGINE": "kernel.db.sqlite3",
            "NAME": DATA_DIR / "gpupool.sqlite3",
            # The embedded server runs web, worker and beat threads in one process: wait for the write lock
            # instead of failing with "database is locked", and take it up front for write transactions.
            "OPTIONS": {
                "timeout": 30,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }
# Django's backends with a pre-commit hook (kernel/db/precommit.py): the audit trail links its records into
# their hash chains just before COMMIT, so its chain-head locks are always the last a transaction takes.
_BACKENDS_WITH_PRE_COMMIT = {
    "django.db.backends.postgresql": "kernel.db.postgresql",
    "django.db.backends.sqlite3": "kernel.db.sqlite3",
}
DATABASES["default"]["ENGINE"] = _BACKENDS_WITH_PRE_COMMIT.get(
    DATABASES["default"]["ENGINE"], DATABASES["default"]["ENGINE"]
)
DATABASE_ENGINE = DATABASES["default"]["ENGINE"]
IS_POSTGRES = "postgresql" in DATABASE_ENGINE
# A pool of PostgreSQL connections per process (psycopg_pool, through Django's "pool" option): without it every
# request, and every database call of an agent's WebSocket, opened a new connection (a server process forked,
# authenticated and set up each time), and a longer GPUPOOL_DB_CONN_MAX_AGE left one idle connection behind per
# finished request's thread under ASGI. The pool hands a connection back when the request (or call) ends.
# GPUPOOL_DB_POOL_MAX_SIZE: connections a process may hold at once (0: no pool, a connection per request).
DB_POOL_MAX_SIZE = env_int("GPUPOOL_DB_POOL_MAX_SIZE", 10) if IS_POSTGRES else 0
if DB_POOL_MAX_SIZE > 0:
    DATABASES["default"]["CONN_MAX_AGE"] = 0  # Django refuses persistent connections beside a pool
    # Each connection handed out is checked first (an empty query): after a PostgreSQL restart the pool's
    # connections are dead, and without the check each would fail one request before being dropped.
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1,
        "max_size": DB_POOL_MAX_SIZE,
        # Waiting longer than this for a free connection is an error (a 503), not a hang.
        "timeout": env_int("GPUPOOL_DB_POOL_TIMEOUT_S", 20),
    }
if not IS_POSTGRES and "TEST" not in DATABASES["default"]:
    DATABASES["default"]["TEST"] = {"NAME": None}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis: Celery broker and Channels layer ----------------------------------------------------------
REDIS_URL = env_str("GPUPOOL_REDIS_URL", "")
EMBEDDED_MODE = not REDIS_URL

if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    CELERY_RESULT_BACKEND = REDIS_URL
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                # redis-py ≥ 8 reads with a 5 s socket timeout, the same as channels_redis' 5 s BZPOPMIN:
                # under load the read times out first and kills the consumer. Give the read more room.
                # max_connections: redis-py ≥ 8 caps a pool at 100 and then raises instead of waiting, which
                # a few hundred agent sockets joining their groups at once exceed.
                "hosts": [
                    {"address": REDIS_URL, "socket_timeout": 30, "socket_connect_timeout": 5, "max_connections": 2000}
                ],
                "prefix": env_str("GPUPOOL_CHANNELS_PREFIX", "gpupool"),
                # channels_redis drops group sends to a full channel silently; give bursts room.
                "capacity": env_int("GPUPOOL_CHANNELS_CAPACITY", 1000),
                "expiry": 30,
            },
        },
        # Live telemetry to browsers: Redis pub/sub, pushed to each web process by one reader. The default
        # layer hands a process one message per BZPOPMIN under a process-wide lock; with a busy event loop
        # that capped fan-out at a few dozen messages a second per process, and viewers fell seconds behind.
        # Telemetry is latest-wins, so pub/sub's "no one listening, nothing kept" is what it needs.
        "telemetry": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {
                "hosts": [REDIS_URL],
                "prefix": env_str("GPUPOOL_CHANNELS_PREFIX", "gpupool") + ":telemetry",
            },
        },
    }
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}}
else:
    CELERY_BROKER_URL = "memory://localhost/"
    CELERY_RESULT_BACKEND = "cache+memory://"
    # The memory transport polls; the default 1 s makes every in-process round trip slow.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"polling_interval": 0.05}
    CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels.layers.InMemoryChannelLayer"},
        "telemetry": {"BACKEND": "channels.layers.InMemoryChannelLayer"},
    }
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

CELERY_TASK_ALWAYS_EAGER = env_bool("GPUPOOL_CELERY_EAGER", default=False)
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_RESULT_EXPIRES = 3600
CELERY_TIMEZONE = "UTC"
# Periodic tasks; each app adds its entries in portal.celery (one place).
CELERY_BEAT_SCHEDULE: dict = {}

# --- Auth ---------------------------------------------------------------------------------------------
AUTH_USER_MODEL = "tenants.User"
PASSWORD_HASHERS = [
    "django.contrib.auth.hashers.Argon2PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2PasswordHasher",
]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 10}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "login"
SESSION_COOKIE_AGE = env_int("GPUPOOL_SESSION_AGE_SECONDS", 8 * 3600)
SESSION_EXPIRE_AT_BROWSER_CLOSE = True
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_HTTPONLY = False
CSRF_COOKIE_SAMESITE = "Lax"
# Content-Security-Policy on every response (kernel.security); no inline scripts or styles.
GPUPOOL_CSP = env_str("GPUPOOL_CSP", _DEFAULT_CSP)
AUTHENTICATION_BACKENDS = [
    "tenants.authentication.LockoutBackend",  # django-axes: refuse locked-out sign-ins first
    "django.contrib.auth.backends.ModelBackend",
]
# Lockout (django-axes): after AXES_FAILURE_LIMIT wrong passwords for one username from one address, that
# pair is locked for AXES_COOLOFF_TIME hours; a success resets the count. Lockouts are audited.
AXES_FAILURE_LIMIT = env_int("GPUPOOL_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = env_int("GPUPOOL_LOGIN_LOCKOUT_MINUTES", 15) / 60
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False
# Two-factor (django-otp TOTP) for platform roles: asked at sign-in once a device is enrolled; with
# GPUPOOL_MFA_REQUIRED platform-role accounts must enrol before they can do anything else.
GPUPOOL_MFA_REQUIRED = env_bool("GPUPOOL_MFA_REQUIRED", default=False)
OTP_TOTP_ISSUER = "gpupool"
# Single sign-on (OpenID Connect, mozilla-django-oidc): on only when the GPUPOOL_OIDC_* variables are set.
GPUPOOL_OIDC_ENABLED = bool(env_str("GPUPOOL_OIDC_CLIENT_ID", "") and env_str("GPUPOOL_OIDC_ISSUER_URL", ""))
if GPUPOOL_OIDC_ENABLED:
    INSTALLED_APPS.append("mozilla_django_oidc")
    AUTHENTICATION_BACKENDS.insert(1, "tenants.oidc.GpupoolOIDCBackend")
    _oidc_issuer = env_str("GPUPOOL_OIDC_ISSUER_URL", "").rstrip("/")
    OIDC_RP_CLIENT_ID = env_str("GPUPOOL_OIDC_CLIENT_ID", "")
    OIDC_RP_CLIENT_SECRET = env_str("GPUPOOL_OIDC_CLIENT_SECRET", "")
    OIDC_RP_SIGN_ALGO = env_str("GPUPOOL_OIDC_SIGN_ALGO", "RS256")
    OIDC_RP_SCOPES = env_str("GPUPOOL_OIDC_SCOPES", "openid email profile")
    OIDC_OP_AUTHORIZATION_ENDPOINT = env_str("GPUPOOL_OIDC_AUTHORIZATION_URL", f"{_oidc_issuer}/authorize")
    OIDC_OP_TOKEN_ENDPOINT = env_str("GPUPOOL_OIDC_TOKEN_URL", f"{_oidc_issuer}/token")
    OIDC_OP_USER_ENDPOINT = env_str("GPUPOOL_OIDC_USERINFO_URL", f"{_oidc_issuer}/userinfo")
    OIDC_OP_JWKS_ENDPOINT = env_str("GPUPOOL_OIDC_JWKS_URL", f"{_oidc_issuer}/jwks")
    OIDC_CREATE_USER = env_bool("GPUPOOL_OIDC_CREATE_USERS", default=True)
# Approvals (quota changes, job admissions): who decides, in order; how long a request stays open.
GPUPOOL_APPROVAL_CHAINS = {
    "quota_change": env_list("GPUPOOL_QUOTA_APPROVAL_CHAIN", ["parent_tenant_admin", "system_admin"]),
    "job_admission": env_list("GPUPOOL_JOB_APPROVAL_CHAIN", ["tenant_admin", "system_admin"]),
}
GPUPOOL_APPROVAL_TTL_HOURS = env_int("GPUPOOL_APPROVAL_TTL_HOURS", 72)
# Jobs above this many millis in total wait for approval (per-tenant override on the tenant); unset = none.
GPUPOOL_JOB_APPROVAL_THRESHOLD_MILLIS = env_int("GPUPOOL_JOB_APPROVAL_THRESHOLD_MILLIS", 0) or None
# Notifiers (dotted paths, comma-separated) and their endpoints; see tenants/notifiers.py.
GPUPOOL_NOTIFIERS = env_list("GPUPOOL_NOTIFIERS", ["tenants.notifiers.EmailNotifier"])
GPUPOOL_NOTIFY_WEBHOOK_URL = env_str("GPUPOOL_NOTIFY_WEBHOOK_URL", "")
GPUPOOL_NOTIFY_WEBHOOK_SECRET = env_str("GPUPOOL_NOTIFY_WEBHOOK_SECRET", "")
GPUPOOL_NOTIFY_DINGTALK_URL = env_str("GPUPOOL_NOTIFY_DINGTALK_URL", "")
GPUPOOL_NOTIFY_WECOM_URL = env_str("GPUPOOL_NOTIFY_WECOM_URL", "")
GPUPOOL_NOTIFY_FEISHU_URL = env_str("GPUPOOL_NOTIFY_FEISHU_URL", "")

# --- REST API -----------------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # First, so an unauthenticated request gets 401 with a "WWW-Authenticate: Bearer" challenge.
        "tenants.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": [
        "rest_framework.permissions.IsAuthenticated",
        "tenants.permissions.PolicyPermission",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # Lists refuse unknown parameters, and ordering/search they do not offer, with a 400 (kernel/filters.py).
    "DEFAULT_FILTER_BACKENDS": [
        "kernel.filters.KnownQueryParameters",
        "django_filters.rest_framework.DjangoFilterBackend",
        "kernel.filters.OfferedOrderingFilter",
        "kernel.filters.OfferedSearchFilter",
    ],
    # LimitOffsetPagination that answers a malformed limit/offset with a 400 instead of the default page.
    "DEFAULT_PAGINATION_CLASS": "kernel.pagination.StrictLimitOffsetPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "kernel.api.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "gpupool API",
    "DESCRIPTION": "GPU compute pooling: tenants, quotas, jobs, nodes, audit.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Every operation documents the API's error answers ({"code", "detail"}): kernel/openapi.py.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "kernel.openapi.document_error_responses",
    ],
    # Served from our own static files: customers' networks are often offline.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Choice sets that share a field name ("kind", "status") get a stable name each (manage.py check is clean).
    "ENUM_NAME_OVERRIDES": {
        "JobKindEnum": "scheduler.models.JobKind",
        "JobStateEnum": "scheduler.models.JobState",
        "NodeStatusEnum": "scheduler.fleet.models.NodeStatus",
        "TenantKindEnum": "tenants.models.TenantKind",
        "TopologyConstraintEnum": "scheduler.models.TopologyConstraint",
        "ApprovalStepRoleEnum": "tenants.models.ApprovalStepRole",
        "MembershipRoleEnum": "tenants.models.MembershipRole",
        "PriorityClassNameEnum": ["critical", "high", "normal", "low", "best_effort"],
    },
}
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("GPUPOOL_MAX_BODY_BYTES", 1024 * 1024)
#: Deepest nesting of objects and arrays a JSON request body may have (kernel/request_limits.py).
GPUPOOL_MAX_JSON_DEPTH = env_int("GPUPOOL_MAX_JSON_DEPTH", 64)
#: Environment variables a job may not set, comma-separated ("X_*" is a prefix); empty: the agent's default list
#: (nodeagent.protocol.DEFAULT_ENV_DENYLIST: LD_*, PATH, the loader and libc variables). Agents check their own.
GPUPOOL_ENV_DENYLIST = [name.strip() for name in env_str("GPUPOOL_ENV_DENYLIST", "").split(",") if name.strip()]
#: Where a job's absolute checkpoint_dir may be, per tenant slug ("*": every tenant), as JSON, e.g.
#: {"acme": ["/ckpt/acme"], "*": ["/scratch/ckpt"]}. None configured: relative checkpoint dirs only.
GPUPOOL_CHECKPOINT_PREFIXES = env_str("GPUPOOL_CHECKPOINT_PREFIXES", "{}")
#: A shared file system mounted at this path on every node (NFS, CephFS, JuiceFS...; the agents' --shared-storage):
#: each tenant gets <path>/tenants/<tenant id>, the only part its jobs see, and each job its checkpoint dir
#: <path>/tenants/<tenant id>/jobs/<job id>/checkpoint there (scheduler/storage_paths.py). "": none (checkpoint
#: dirs in the job's directory on its node, or under GPUPOOL_CHECKPOINT_PREFIXES).
GPUPOOL_SHARED_STORAGE = env_str("GPUPOOL_SHARED_STORAGE", "")
#: The ports a node hands to jobs ("first-last", inclusive; scheduler/launch.py): each replica holds one, replica 0
#: one more (the job's MASTER_PORT), never two live jobs the same port of a node. The default sits below Linux's
#: ephemeral range (32768-60999) and starts at torch's usual 29500.
GPUPOOL_JOB_PORT_RANGE = env_str("GPUPOOL_JOB_PORT_RANGE", "29500-32767")
#: Serving endpoints (scheduler/serving.py): Caddy's admin API ("" = no proxy: embedded mode lists replicas'
#: direct addresses), the Caddy server that gets the /serve/* route (created on GPUPOOL_SERVING_LISTEN if it does
#: not exist; "srv0" is the first site of a Caddyfile), the endpoints' public base URL, the web processes Caddy
#: asks whether a caller may use an endpoint, and how often beat re-syncs the route.
GPUPOOL_SERVING_CADDY_ADMIN = env_str("GPUPOOL_SERVING_CADDY_ADMIN", "")
GPUPOOL_SERVING_CADDY_SERVER = env_str("GPUPOOL_SERVING_CADDY_SERVER", "gpupool-serving")
GPUPOOL_SERVING_LISTEN = env_str("GPUPOOL_SERVING_LISTEN", ":8443")
GPUPOOL_SERVING_URL = env_str("GPUPOOL_SERVING_URL", "http://127.0.0.1:8443")
GPUPOOL_SERVING_PORTAL = env_list("GPUPOOL_SERVING_PORTAL", ["127.0.0.1:8000"])
GPUPOOL_SERVING_SYNC_S = env_int("GPUPOOL_SERVING_SYNC_S", 15)
#: Seconds a replica the route has dropped keeps running before its SIGTERM (requests Caddy had already routed to
#: it finish): workload.stop's drain_s for a job with endpoints.
GPUPOOL_SERVING_DRAIN_S = env_float("GPUPOOL_SERVING_DRAIN_S", 2.0)

# --- i18n, static -------------------------------------------------------------------------------------
LANGUAGE_CODE = "en"
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
LOCALE_PATHS = [BASE_DIR / "frontend" / "locale"]
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = Path(env_str("GPUPOOL_STATIC_ROOT", str(DATA_DIR / "static")))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
    # Jobs' collected outputs (scheduler/services/outputs.py): files under GPUPOOL_DATA_DIR/outputs, or any Django
    # storage backend, e.g. GPUPOOL_OUTPUTS_STORAGE=storages.backends.s3.S3Storage (pip install 'gpupool[s3]')
    # with GPUPOOL_OUTPUTS_STORAGE_OPTIONS='{"bucket_name": "gpupool-outputs", "endpoint_url": "https://minio:9000"}'.
    "outputs": {
        "BACKEND": env_str("GPUPOOL_OUTPUTS_STORAGE", "django.core.files.storage.FileSystemStorage"),
        "OPTIONS": json.loads(env_str("GPUPOOL_OUTPUTS_STORAGE_OPTIONS", "") or "null")
        or {"location": str(DATA_DIR / "outputs")},
    },
}
#: The largest output a job's replica may leave (its output_dir, packed): above it nothing is collected and the
#: job's history says so.
GPUPOOL_OUTPUT_MAX_BYTES = env_int("GPUPOOL_OUTPUT_MAX_BYTES", 1024 * 1024 * 1024)
WHITENOISE_USE_FINDERS = True

# --- gpupool ------------------------------------------------------------------------------------------
# Simulated agents the embedded demo starts (``gpupool demo``).
GPUPOOL_DEMO_AGENTS = env_int("GPUPOOL_DEMO_AGENTS", 3)  # one per node of nodeagent.demo.DEMO_NODES

# Start-time estimates of pending jobs (scheduler.eta, docs/eta.md): recomputed at most every INTERVAL_S (and
# never more often than one takes), and soon after a cycle that starts or preempts CHANGE_JOBS jobs or more.
# Runtimes are predicted from each user's last HISTORY_JOBS finished jobs of the same name (or command) finished
# in the last HISTORY_DAYS, else the job's runtime estimate, else the tenant's or the pool's recent jobs, else
# DEFAULT_RUNTIME_S. The forecast looks HORIZON_S ahead in at most MAX_CYCLES engine cycles and MAX_SECONDS.
# The cycle keeps the pool's state between cycles and reads only what changed (scheduler/live_snapshot.py,
# PostgreSQL): 0 reads it in full every cycle. Every CHECK_S the kept state is compared with a full read.
GPUPOOL_SNAPSHOT_INCREMENTAL = env_bool("GPUPOOL_SNAPSHOT_INCREMENTAL", True)
GPUPOOL_SNAPSHOT_CHECK_S = env_float("GPUPOOL_SNAPSHOT_CHECK_S", 300.0)

GPUPOOL_ETA_INTERVAL_S = env_int("GPUPOOL_ETA_INTERVAL_S", 30)
GPUPOOL_ETA_CHANGE_JOBS = env_int("GPUPOOL_ETA_CHANGE_JOBS", 10)
#: Job arrays are one record; before each cycle an array's waiting tasks become job rows, as many as the free
#: cards could take and at least this many (scheduler/services/arrays.py).
GPUPOOL_ARRAY_WINDOW = env_int("GPUPOOL_ARRAY_WINDOW", 64)
#: Concurrent single submits of a web process share one transaction (kernel/db/group_commit.py); 0 turns it off.
GPUPOOL_GROUP_COMMIT = env_bool("GPUPOOL_GROUP_COMMIT", True)
GPUPOOL_ETA_HISTORY_JOBS = env_int("GPUPOOL_ETA_HISTORY_JOBS", 20)
GPUPOOL_ETA_HISTORY_DAYS = env_int("GPUPOOL_ETA_HISTORY_DAYS", 30)
GPUPOOL_ETA_DEFAULT_RUNTIME_S = env_int("GPUPOOL_ETA_DEFAULT_RUNTIME_S", 3600)
GPUPOOL_ETA_HORIZON_S = env_int("GPUPOOL_ETA_HORIZON_S", 7 * 86400)
GPUPOOL_ETA_MAX_CYCLES = env_int("GPUPOOL_ETA_MAX_CYCLES", 100)
GPUPOOL_ETA_MAX_SECONDS = env_int("GPUPOOL_ETA_MAX_SECONDS", 240)  # wall clock for the three forecasts together

# Node agents and telemetry (scheduler.fleet). A node is not_ready after LEASE_MISSES missed heartbeats and
# its jobs are requeued NODE_LOST_GRACE_S later. METRICS_TOKEN: bearer token for /metrics (empty = admins only).
# FENCING: an agent cut off from the portal stops its workloads (FENCE_GRACE_S to checkpoint) before that requeue,
# at lease + grace - FENCE_GRACE_S - 10 s without an answer (scheduler.fleet.fencing; 40 s with these defaults).
GPUPOOL_HEARTBEAT_INTERVAL_S = env_int("GPUPOOL_HEARTBEAT_INTERVAL_S", 5)
GPUPOOL_LEASE_MISSES = env_int("GPUPOOL_LEASE_MISSES", 3)
GPUPOOL_NODE_LOST_GRACE_S = env_int("GPUPOOL_NODE_LOST_GRACE_S", 45)
GPUPOOL_FENCING = env_bool("GPUPOOL_FENCING", True)
GPUPOOL_FENCE_GRACE_S = env_int("GPUPOOL_FENCE_GRACE_S", 10)
GPUPOOL_TELEMETRY_INTERVAL_S = env_int("GPUPOOL_TELEMETRY_INTERVAL_S", 1)
# AGENT_DB_THREADS: threads of a web process that run the agent sockets' database work, a node always on the same
# one (scheduler.fleet.batching.socket_executor); each keeps a pooled connection. 0: all on one thread.
GPUPOOL_AGENT_DB_THREADS = env_int("GPUPOOL_AGENT_DB_THREADS", 4)
GPUPOOL_BOOTSTRAP_TOKEN_TTL_S = env_int("GPUPOOL_BOOTSTRAP_TOKEN_TTL_S", 3600)
GPUPOOL_METRICS_TOKEN = env_str("GPUPOOL_METRICS_TOKEN", "")
# METRICS_PER_CARD: /metrics includes the per-card series (dcgm-exporter's names, gpupool_device_allocated_millis).
# Off for a fleet whose Prometheus scrapes dcgm-exporter on each node: a scrape of 10,000 nodes is then not 82 MiB.
GPUPOOL_METRICS_PER_CARD = env_bool("GPUPOOL_METRICS_PER_CARD", True)
# Live logs of jobs (scheduler.logs): each replica's log keeps its newest MAX_BYTES (0 = no limit); the logs of
# jobs finished more than RETENTION_DAYS ago are deleted (0 = kept).
GPUPOOL_JOB_LOG_MAX_BYTES = env_int("GPUPOOL_JOB_LOG_MAX_BYTES", 8 * 1024 * 1024)
GPUPOOL_JOB_LOG_RETENTION_DAYS = env_int("GPUPOOL_JOB_LOG_RETENTION_DAYS", 30)

# --- Audit trail (audit/, README "Audit trail") --------------------------------------------------------
# Master key ring "kid1:BASE64,kid2:BASE64" (last = active); unset = a development ring derived from
# SECRET_KEY (portal.production_settings refuses that).
GPUPOOL_AUDIT_MASTER_KEYS = env_str("GPUPOOL_AUDIT_MASTER_KEYS", "")
GPUPOOL_AUDIT_CIPHER = env_str("GPUPOOL_AUDIT_CIPHER", "aes-256-gcm")  # or sm4-gcm (国密)
GPUPOOL_AUDIT_SIGNER = env_str("GPUPOOL_AUDIT_SIGNER", "audit.signing.Ed25519Signer")
GPUPOOL_AUDIT_SIGNING_KEY = env_str("GPUPOOL_AUDIT_SIGNING_KEY", "")  # base64 Ed25519 seed; unset = dev-derived
# The witness (docs/audit-trail.md): production runs `python -m audit.witness_service serve` under its own user and
# points GPUPOOL_AUDIT_WITNESS_URL at it; unset, an embedded witness keeps its state in a directory named after
# GPUPOOL_AUDIT_WITNESS_PATH (development and the demo only: the portal's own user can write it).
GPUPOOL_AUDIT_WITNESS_URL = env_str("GPUPOOL_AUDIT_WITNESS_URL", "")
GPUPOOL_AUDIT_WITNESS_PATH = env_str("GPUPOOL_AUDIT_WITNESS_PATH", str(DATA_DIR / "audit-witness.jsonl"))
# The trust-root fingerprint the verifiers pin (printed by `gpupool audit_trust_root`, shown in the console); unset,
# the online check takes the witness's and says it is unpinned.
GPUPOOL_AUDIT_TRUST_ROOT = env_str("GPUPOOL_AUDIT_TRUST_ROOT", "")
GPUPOOL_AUDIT_INTEGRITY_CHECK_SECONDS = env_int("GPUPOOL_AUDIT_INTEGRITY_CHECK_SECONDS", 60)
GPUPOOL_AUDIT_CHECKPOINT_RECORDS = env_int("GPUPOOL_AUDIT_CHECKPOINT_RECORDS", 1000)
# Every changed stream's head is sealed to the witness this often (the tail a DBA can cut undetected); audit_verify
# fails when records older than this + the slack are not covered by a witnessed checkpoint.
GPUPOOL_AUDIT_CHECKPOINT_SECONDS = env_int("GPUPOOL_AUDIT_CHECKPOINT_SECONDS", 1)
GPUPOOL_AUDIT_WITNESS_SLACK_SECONDS = env_int("GPUPOOL_AUDIT_WITNESS_SLACK_SECONDS", 25)
GPUPOOL_AUDIT_RETENTION_DAYS = env_int("GPUPOOL_AUDIT_RETENTION_DAYS", 365)  # audit refuses < 180
GPUPOOL_AUDIT_ALERT_HOOK = env_str("GPUPOOL_AUDIT_ALERT_HOOK", "")  # dotted path: hook(event, message, details)
GPUPOOL_AUDIT_SIEM_URL = env_str("GPUPOOL_AUDIT_SIEM_URL", "")  # udp://host:514?format=rfc5424 | tcp://…?format=cef
GPUPOOL_AUDIT_TRUST_FORWARDED_FOR = env_bool("GPUPOOL_AUDIT_TRUST_FORWARDED_FOR", default=False)
CELERY_BEAT_SCHEDULE["audit-checkpoint"] = {
    "task": "audit.checkpoint",
    "schedule": float(GPUPOOL_AUDIT_CHECKPOINT_SECONDS),
}
CELERY_BEAT_SCHEDULE["audit-integrity-check"] = {
    "task": "audit.integrity_check",
    "schedule": float(GPUPOOL_AUDIT_INTEGRITY_CHECK_SECONDS),
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("GPUPOOL_LOG_LEVEL", "INFO")},
    "loggers": {
        "django.server": {"level": "WARNING"},
        "daphne": {"level": "WARNING"},
        "celery": {"level": "WARNING"},
    },
}
