"""Settings, read from the environment in this one place.

Defaults give a working single machine with no servers: SQLite under ``var/``,
Celery over the filesystem transport under ``var/``. ``DATABASE_URL`` and
``REDIS_URL`` move the same code onto PostgreSQL and Redis.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import zoneinfo
from datetime import timedelta
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from whitenoise.compress import Compressor

from quotas.directory.config import LdapConfigError, OidcConfigError, ldap_settings, oidc_settings


class BadSetting(ImproperlyConfigured, ValueError):
    """An environment variable with a value it cannot take; ``str()`` names the variable, the value and why.

    ``manage.py`` prints it as one line (exit 78) instead of a traceback; it is a
    ``ValueError`` too, as these errors were before.
    """


BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("NPUPORTAL_VAR_DIR", BASE_DIR / "var")).resolve()
try:
    # The database, the secret key, the demo agents' tokens and every job's output live here: its owner's only.
    VAR_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
except OSError as _exc:
    raise BadSetting(f"NPUPORTAL_VAR_DIR={str(VAR_DIR)!r}: cannot create it ({_exc.strerror or _exc})") from None


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _env_number(
    name: str, default: float, *, whole: bool = False, minimum: float = 0.0, maximum: float | None = None
) -> Any:
    """A number from the environment, checked at start-up with the variable named, not a bare ValueError."""
    text = os.environ.get(name, "").strip()
    if not text:
        return int(default) if whole else float(default)
    try:
        value: float = int(text) if whole else float(text)
    except ValueError:
        kind = "a whole number" if whole else "a number"
        raise BadSetting(f"{name}={text!r}: expected {kind}") from None
    if not math.isfinite(value) or value < minimum:
        raise BadSetting(f"{name}={text!r}: expected a number of at least {minimum:g}")
    if maximum is not None and value > maximum:
        raise BadSetting(f"{name}={text!r}: expected a number of at most {maximum:g}")
    return value


def _secret_key() -> str:
    """The key from the environment, else one generated once and kept in ``var/``.

    Keeping it on disk means sessions survive a restart of ``make run``
    without anybody having to invent a key.
    """
    key = os.environ.get("SECRET_KEY")
    if key:
        return key
    path = VAR_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = _env_bool("DEBUG", False)
ALLOWED_HOSTS = [
    h.strip() for h in os.environ.get("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",") if h.strip()
]
CSRF_TRUSTED_ORIGINS = [o.strip() for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI and Redoc from our own static files: /api/docs/ works offline
    "django_htmx",
    # Before our apps: quotas/admin.py replaces axes' admin of access attempts with one that unlocks.
    "axes",
    "devices",
    "quotas",
    "scheduling",
]

MIDDLEWARE = [
    # Outermost: under /api/ no HTML error page gets past it (npuportal.api.error_handling).
    "npuportal.api.error_handling.ApiErrorMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # Console pages show times on the policy's clock, labelled (npuportal.display_time).
    "npuportal.display_time.DisplayZoneMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as axes asks: turns a refused sign-in into the console's "sign-in locked" page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "npuportal.urls"
#: A failed CSRF check answers JSON under /api/, Django's page elsewhere.
CSRF_FAILURE_VIEW = "npuportal.api.error_handling.csrf_failure"
WSGI_APPLICATION = "npuportal.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "npuportal.display_time.clock",
                "quotas.tenancy.roles.menu",
            ],
            # ``{{ t|when }}``: a time in the display zone with its zone's name, on every page.
            "builtins": ["npuportal.display_time"],
        },
    },
]

DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'npuportal.sqlite3'}"
try:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60)}
except ValueError:  # an unknown scheme, a bad port; the URL is not repeated: it may hold a password
    _scheme = DATABASE_URL.partition("://")[0] if "://" in DATABASE_URL else ""
    raise BadSetting(
        f"DATABASE_URL: not a database URL like postgres://user@host:5432/name or sqlite:///path (scheme {_scheme!r})"
    ) from None
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # IMMEDIATE makes every transaction take SQLite's write lock up front, so two
    # ticks in two processes queue up instead of failing half way through.
    # WAL lets the web pages read while a tick writes.
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    DATABASES["default"]["CONN_MAX_AGE"] = 0
elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # A database host that is gone (not refusing) would hold every request for the system's connect
    # timeout (minutes); 5 s, then the API answers 503. `?connect_timeout=N` in DATABASE_URL wins.
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault("connect_timeout", 5)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

# --- Sign-in brute force (django-axes) ----------------------------------------
# Axes' backend goes first: it refuses a locked-out sign-in before any password is checked, on the
# console's /login/ and the admin's alike. Failures are kept in the database (AccessAttempt, one row per
# username x address x browser, and the AccessFailureLog audit), so every web worker sees the same count.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

# --- Sign-in with the site's directory (quotas.directory; README "Sign-in with the site's directory") --
# Each is off unless its variable is set; local accounts keep working beside them (the break-glass
# admin). A setting that cannot work stops the start with the variable's name, not the first sign-in.
try:
    _ldap = ldap_settings()
    _oidc = oidc_settings()
except (LdapConfigError, OidcConfigError) as _exc:
    raise ImproperlyConfigured(str(_exc)) from None
globals().update(_ldap)
globals().update(_oidc)
if _ldap:
    AUTHENTICATION_BACKENDS.insert(1, "quotas.directory.ldap.DirectoryLDAPBackend")
if _oidc:
    AUTHENTICATION_BACKENDS.append("quotas.directory.oidc.DirectoryOIDCBackend")
    OIDC_AUTHENTICATE_CLASS = "quotas.directory.oidc.DirectoryOIDCRequestView"
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
#: Failed sign-ins allowed per account, and per client address, within the cool-off; the next is refused.
AXES_FAILURE_LIMIT = _env_number("NPUPORTAL_LOGIN_FAILURE_LIMIT", 10, whole=True, minimum=1)
#: How long failures count, and so how long a lock lasts after the failure that set it.
AXES_COOLOFF_TIME = timedelta(seconds=_env_number("NPUPORTAL_LOGIN_COOLOFF", 900, minimum=1))
# Either one locks: guessing one account's password from many addresses, or many accounts from one.
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
# A refused attempt during a lock is not counted, so the lock ends at the time the page announces
# (not later, each time the attacker tries again) and a stored attempt row stops growing at the limit.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_ENABLE_ACCESS_FAILURE_LOG = True
AXES_LOCKOUT_CALLABLE = "quotas.access.signin.lockout_response"
#: Reverse proxies in front of the web server; 0 counts the connection's address, never X-Forwarded-For.
TRUSTED_PROXY_COUNT = _env_number("NPUPORTAL_TRUSTED_PROXIES", 0, whole=True)
AXES_CLIENT_IP_CALLABLE = "npuportal.client_ip.client_address"
AXES_VERBOSE = False


def _metrics_token() -> str:
    """``NPUPORTAL_METRICS_TOKEN``: empty (no token opens /metrics), or at least 16 visible ASCII characters."""
    token = os.environ.get("NPUPORTAL_METRICS_TOKEN", "").strip()
    if token and (len(token) < 16 or not all("!" <= c <= "~" for c in token)):
        raise BadSetting(
            "NPUPORTAL_METRICS_TOKEN: expected at least 16 visible ASCII characters, no spaces "
            "(it is sent as 'Authorization: Bearer <token>')"
        )
    return token


def _metrics_allow() -> list[Any]:
    """``NPUPORTAL_METRICS_ALLOW``: addresses and networks (CIDR) that may read /metrics without the token."""
    import ipaddress

    text = os.environ.get("NPUPORTAL_METRICS_ALLOW")
    if text is None:
        text = "127.0.0.1,::1"
    networks = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise BadSetting(
                f"NPUPORTAL_METRICS_ALLOW={text!r}: {item!r} is not an address or network (10.0.0.0/8, ::1)"
            ) from None
    return networks


#: A bearer token Prometheus sends to read /metrics (npuportal/metrics.py); empty: none is accepted.
METRICS_TOKEN = _metrics_token()
#: Client addresses (as client_ip counts them) that may read /metrics without it; default the machine itself.
METRICS_ALLOW = _metrics_allow()

LANGUAGE_CODE = "en-us"
TIME_ZONE = os.environ.get("TIME_ZONE", "UTC").strip() or "UTC"
try:
    zoneinfo.ZoneInfo(TIME_ZONE)
except (ValueError, zoneinfo.ZoneInfoNotFoundError):
    raise BadSetting(f"TIME_ZONE={TIME_ZONE!r}: not a time zone name like UTC or Asia/Shanghai") from None
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
# plotly.js (a partial bundle) is vendored in static/vendor/plotly/: served from our own static files,
# never a CDN, gzip- and brotli-compressed by WhiteNoise's storage at collectstatic.
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
# Source maps (the API docs' swagger and redoc bundles ship 6 MB of them) are for a developer's tools,
# never a page: brotli on them was 15 of the 32 CPU-seconds a first collectstatic took.
WHITENOISE_SKIP_COMPRESS_EXTENSIONS = (*Compressor.SKIP_COMPRESS_EXTENSIONS, "map")

# --- Mail (quota request decisions to their lead); none unless NPUPORTAL_EMAIL_HOST is set ----------
EMAIL_HOST = os.environ.get("NPUPORTAL_EMAIL_HOST", "")
EMAIL_PORT = _env_number("NPUPORTAL_EMAIL_PORT", 25, whole=True, minimum=1)
EMAIL_USE_TLS = _env_bool("NPUPORTAL_EMAIL_STARTTLS", False)
EMAIL_HOST_USER = os.environ.get("NPUPORTAL_EMAIL_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("NPUPORTAL_EMAIL_PASSWORD", "")
DEFAULT_FROM_EMAIL = os.environ.get("NPUPORTAL_EMAIL_FROM", "npuportal@localhost")

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"

# --- Celery -----------------------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "")
#: Prefix of every cache key (throttle counters, poll lock), so two deployments can share one Redis.
CACHE_KEY_PREFIX = os.environ.get("NPUPORTAL_CACHE_PREFIX", "")
CELERY_DIR = VAR_DIR / "celery"
if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    CELERY_RESULT_BACKEND = REDIS_URL
    # A publish to a Redis that is down must fail fast, not hold the API call that queues it (a cancel):
    # two quick connection retries (kombu's default keeps trying for broker_connection_timeout, 4 s+),
    # and bounded socket waits (a Redis that hangs without refusing would hold a publish for ever).
    # Workers reconnect under their own broker_connection_retry settings, which this does not change.
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {
        "max_retries": 2,
        "interval_start": 0,
        "interval_step": 0.2,
        "interval_max": 0.5,
        "socket_connect_timeout": 2,
        "socket_timeout": 2,
    }
    CACHES = {
        "default": {
            "BACKEND": "npuportal.cache.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": CACHE_KEY_PREFIX,
        }
    }
else:
    # No server at all: web, worker and beat exchange messages through folders.
    _queue = CELERY_DIR / "queue"
    _processed = CELERY_DIR / "processed"
    _results = CELERY_DIR / "results"
    _control = CELERY_DIR / "control"
    for _folder in (_queue, _processed, _results, _control):
        _folder.mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_URL = "filesystem://"
    # kombu's filesystem transport with atomic writes (npuportal/broker.py says why).
    CELERY_BROKER_TRANSPORT = "npuportal.broker:Transport"
    CELERY_RESULT_BACKEND = f"file://{_results}"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue),
        "data_folder_out": str(_queue),
        "processed_folder": str(_processed),
        "control_folder": str(_control),
        "store_processed": False,
        # A worker whose prefetch slots are full polls again after this long: kombu's default of 1 s
        # let a backlog of ~3 s build up on a slow machine with 1-s ticks, and every tick expired in it.
        "polling_interval": 0.1,
    }
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": str(VAR_DIR / "cache"),
            "KEY_PREFIX": CACHE_KEY_PREFIX,
        }
    }
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_EXPIRES = 3600
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_TASK_ALWAYS_EAGER = _env_bool("CELERY_TASK_ALWAYS_EAGER", False)

#: Each web worker writes one small PDF in the background 30 s after it starts, so the first statement
#: someone opens is not the one that pays WeasyPrint's start-up (quotas/accounting/pdf_warmup.py).
PDF_WARMUP = _env_bool("NPUPORTAL_PDF_WARMUP", True)

#: Seconds between scheduling ticks (Celery beat).
TICK_INTERVAL_S = _env_number("NPUPORTAL_TICK_INTERVAL", 3, minimum=0.1)
#: Seconds between agent polls (health and job states).
AGENT_POLL_INTERVAL_S = _env_number("NPUPORTAL_AGENT_POLL_INTERVAL", 5, minimum=0.1)
#: Seconds an agent call may take before it counts as a missed poll.
AGENT_TIMEOUT_S = _env_number("NPUPORTAL_AGENT_TIMEOUT", 3, minimum=0.1)
# Health state machine (docs/health.md). A device hotter than the warning threshold is ``warning``
# (still schedulable); hotter than the degraded threshold, ``degraded`` (no new work, running jobs stay).
HEALTH_TEMP_WARNING_C = _env_number("NPUPORTAL_HEALTH_TEMP_WARNING_C", 85)
HEALTH_TEMP_DEGRADED_C = _env_number("NPUPORTAL_HEALTH_TEMP_DEGRADED_C", 95)
#: Polls in a row a node may miss before it is ``unreachable`` and its running jobs are requeued.
AGENT_MISSED_POLLS = _env_number("NPUPORTAL_AGENT_MISSED_POLLS", 3, whole=True, minimum=1)
#: Polls in a row an unreachable node must answer before it takes work again (flap damping).
AGENT_REJOIN_POLLS = _env_number("NPUPORTAL_AGENT_REJOIN_POLLS", 3, whole=True, minimum=1)
#: Polls in a row a degraded or failed device must look better before it rejoins (flap damping).
HEALTH_REJOIN_POLLS = _env_number("NPUPORTAL_HEALTH_REJOIN_POLLS", 3, whole=True, minimum=1)
#: Waiting jobs per tick given an estimated start by the planning pass after the decision
#: (``scheduling.engine.estimate``; highest priority first, like Slurm's ``bf_max_job_test``). 0: none.
ESTIMATE_MAX_JOBS = _env_number("NPUPORTAL_ESTIMATE_MAX_JOBS", 2000, whole=True)

# What runs the jobs (devices.executors): "agents", the portal's node agents, or "slurm", a Slurm cluster.
NPUPORTAL_EXECUTOR = os.environ.get("NPUPORTAL_EXECUTOR", "agents").strip() or "agents"
#: The Slurm cluster's slurm.conf for NPUPORTAL_EXECUTOR=slurm (default: the process's own SLURM_CONF).
NPUPORTAL_SLURM_CONF = os.environ.get("NPUPORTAL_SLURM_CONF", "")
#: Where a Slurm run's output goes when its job names no output file (shared storage on several hosts).
NPUPORTAL_SLURM_OUTPUT_DIR = os.environ.get("NPUPORTAL_SLURM_OUTPUT_DIR", "")
#: The partition npuportal's jobs are submitted to (default: Slurm's default partition).
NPUPORTAL_SLURM_PARTITION = os.environ.get("NPUPORTAL_SLURM_PARTITION", "")
#: Seconds a run npuportal started may stay pending in Slurm (it lost its cards to a job submitted to
#: Slurm directly) before it is withdrawn and the job queued again in its place.
NPUPORTAL_SLURM_PENDING_S = _env_number("NPUPORTAL_SLURM_PENDING_S", 60, minimum=1)
#: The one POSIX account every Slurm job runs as when the portal runs as root (``make run
#: EXECUTOR=slurm``: the demo's users have no accounts); empty: each job as its submitter's account.
NPUPORTAL_SLURM_JOBS_AS = os.environ.get("NPUPORTAL_SLURM_JOBS_AS", "").strip()
#: Seconds between those passes (Slurm's ``bf_interval``); the ticks between keep the stored estimates.
ESTIMATE_INTERVAL_S = _env_number("NPUPORTAL_ESTIMATE_INTERVAL", 30)
#: /healthz reports the tick as stale past this age.
TICK_STALE_AFTER_S = _env_number("NPUPORTAL_TICK_STALE_AFTER", 60, minimum=1)

# --- Limits on what one request may carry (docs/api.md#limits) -------------------------------------
#: Longest single argument Linux passes to a program (MAX_ARG_STRLEN, 32 pages, less its NUL): the agent
#: runs a command as one argument of ``sh -c``, so no longer command can ever start.
_LONGEST_ARGUMENT_BYTES = 131071
#: Bytes (UTF-8) of a job's command.
MAX_COMMAND_BYTES = _env_number(
    "NPUPORTAL_MAX_COMMAND_BYTES", 65536, whole=True, minimum=1, maximum=_LONGEST_ARGUMENT_BYTES
)
#: Copies of one job array.
MAX_ARRAY = _env_number("NPUPORTAL_MAX_ARRAY", 1000, whole=True, minimum=1)
#: Bytes of all the jobs one submission writes: copies × (command + name), what lands in the database.
MAX_SUBMIT_BYTES = _env_number("NPUPORTAL_MAX_SUBMIT_BYTES", 8 * 1024 * 1024, whole=True, minimum=1)
#: Bytes of one request body (Django stops reading beyond it; the API answers 413).
MAX_REQUEST_BYTES = _env_number("NPUPORTAL_MAX_REQUEST_BYTES", 2560 * 1024, whole=True, minimum=1)
if MAX_REQUEST_BYTES < 2 * MAX_COMMAND_BYTES:
    # JSON escapes can make a command longer on the wire than it is: leave it room.
    raise ValueError(
        f"NPUPORTAL_MAX_REQUEST_BYTES={MAX_REQUEST_BYTES}: expected at least twice NPUPORTAL_MAX_COMMAND_BYTES "
        f"({2 * MAX_COMMAND_BYTES}), so a command at its limit fits in a request"
    )
DATA_UPLOAD_MAX_MEMORY_SIZE = MAX_REQUEST_BYTES

# --- REST API -----------------------------------------------------------------


def _throttle_rate(name: str, default: str) -> str:
    """A DRF rate like ``600/min`` from the environment, checked now rather than failing every request later."""
    value = os.environ.get(name, "").strip() or default
    count, _, period = value.partition("/")
    if not count.isdigit() or not period or period[0] not in "smhd":
        raise BadSetting(f"{name}={value!r}: expected requests per period, like 600/min, 20/s or 10000/hour")
    return value


#: Requests with a token that does not authenticate allowed per client address and period; past that,
#: every token request from the address answers 429 until the period ends, so keys cannot be guessed.
API_BAD_TOKEN_RATE = _throttle_rate("NPUPORTAL_THROTTLE_BAD_TOKEN", "20/min")
if int(API_BAD_TOKEN_RATE.partition("/")[0]) < 1:  # 0 would refuse every token, good ones too
    raise ValueError(f"NPUPORTAL_THROTTLE_BAD_TOKEN={API_BAD_TOKEN_RATE!r}: expected at least 1 per period")

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # `Token npu_…` keys (several per user, see /api/v1/tokens/), else DRF's authtoken keys.
        "npuportal.api.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_PAGINATION_CLASS": "npuportal.api.pagination.LimitOffsetPagination",
    # JSON bodies only, bounded in size and depth; an unknown ?format= is a 400 (npuportal.api.parsers).
    "DEFAULT_PARSER_CLASSES": ["npuportal.api.parsers.JSONParser"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "npuportal.api.parsers.ContentNegotiation",
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "npuportal.api.error_handling.exception_handler",
    # The throttles' client address: the same rule as the sign-in locks (npuportal/client_ip.py).
    "NUM_PROXIES": TRUSTED_PROXY_COUNT,
    # Counted in the cache (Redis when REDIS_URL is set), so shared by all workers.
    "DEFAULT_THROTTLE_CLASSES": [
        "rest_framework.throttling.AnonRateThrottle",
        "rest_framework.throttling.UserRateThrottle",
    ],
    # "N/s", "N/min", "N/hour" or "N/day"; the HTTP load benchmark raises them for its own server only.
    "DEFAULT_THROTTLE_RATES": {
        "anon": _throttle_rate("NPUPORTAL_THROTTLE_ANON", "120/min"),
        "user": _throttle_rate("NPUPORTAL_THROTTLE_USER", "600/min"),
    },
}
SPECTACULAR_SETTINGS = {
    "TITLE": "npuportal API",
    "DESCRIPTION": "Jobs, teams, quotas, nodes and policies of an npuportal cluster.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Request bodies get their own components, so they carry what input must be (minLength, ...).
    "COMPONENT_SPLIT_REQUEST": True,
    # PATCH bodies keep their required fields (a team change needs its comment).
    "COMPONENT_SPLIT_PATCH": False,
    # Every error an operation can answer, in the one error shape (npuportal.api.schema).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "npuportal.api.schema.document_errors",
    ],
    # Docstrings of shared bases (npuportal.api.parsers.FormatSuffixes) describe code, not operations.
    "GET_LIB_DOC_EXCLUDES": "npuportal.api.schema.doc_excludes",
    "ENUM_NAME_OVERRIDES": {
        "JobStateEnum": "scheduling.models.Job.State",
        "NodeStateEnum": "devices.models.Node.State",
        "DeviceHealthEnum": "devices.models.Device.Health",
    },
}

LOG_LEVEL = os.environ.get("LOG_LEVEL", "INFO").strip().upper() or "INFO"
if not isinstance(logging.getLevelName(LOG_LEVEL), int):
    raise BadSetting(f"LOG_LEVEL={LOG_LEVEL!r}: expected DEBUG, INFO, WARNING, ERROR or CRITICAL")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
