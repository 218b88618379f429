"""moeops settings, read from the environment with small strict helpers.

Defaults suit `make run` on one machine: SQLite under var/, the embedded Redis, DEBUG off.
"""

import os
from pathlib import Path
from urllib.parse import unquote, urlparse

import plotly
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def envbool(name, default):
    value = os.getenv(name)
    if value is None or value == "":
        return default
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (1/0, true/false), got {value!r}")


def envint(name, default, *, minimum=None):
    value = os.getenv(name)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {value!r}") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {number}")
    return number


def envlist(name, default):
    value = os.getenv(name)
    if value is None or value == "":
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


def database_from_url(url):
    """postgres://user:pass@host:port/name or sqlite:///path -> a DATABASES entry."""
    parsed = urlparse(url)
    if parsed.scheme in ("postgres", "postgresql"):
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(parsed.path.lstrip("/")) or "moeops",
            "USER": unquote(parsed.username or ""),
            "PASSWORD": unquote(parsed.password or ""),
            "HOST": parsed.hostname or "",
            "PORT": str(parsed.port or ""),
            # Each request opens one connection otherwise; keep them for a minute.
            "CONN_MAX_AGE": 60,
        }
    if parsed.scheme == "sqlite":
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": parsed.path or ":memory:"}
    raise ImproperlyConfigured(f"DATABASE_URL scheme must be postgres or sqlite, got {url!r}")


VAR_DIR = Path(os.getenv("MOEOPS_VAR_DIR", BASE_DIR / "var"))

SECRET_KEY = os.getenv("SECRET_KEY", "moeops-local-development-key-not-for-production")
DEBUG = envbool("DEBUG", False)
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", [])
SITE_ROOT = os.getenv("SITE_ROOT", "http://127.0.0.1:8000")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "ninja",
    "django_celery_beat",
    "moeops.fleet",
    "moeops.runs",
    "moeops.kernels",
    "moeops.insights",
    "moeops.engines",
    "moeops.watches",
    "moeops.api",
    "moeops.front",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "moeops.urls"
WSGI_APPLICATION = "moeops.wsgi.application"

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
            ]
        },
    }
]

if os.getenv("DATABASE_URL"):
    DATABASES = {"default": database_from_url(os.environ["DATABASE_URL"])}
else:
    # SQLite opens its file but does not create the folder: a fresh clone has no var/ yet.
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": VAR_DIR / "moeops.sqlite3",
            # Web, worker-facing API and analysis write at once; wait instead of failing.
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# In each process's memory: what the run page reads of a finished run's samples
# (SweepRun.of_samples), a few hundred KB a run, which holds once the run has finished.
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
        "OPTIONS": {"MAX_ENTRIES": 120},
    }
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
# plotly.js comes from the installed plotly package, served as static/plotly/plotly.min.js
STATICFILES_DIRS = [("plotly", Path(plotly.__file__).resolve().parent / "package_data")]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
# Serve static files straight from the finders so `make run` needs no collectstatic.
WHITENOISE_USE_FINDERS = True

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

REDIS_URL = os.getenv("REDIS_URL", "redis://127.0.0.1:6379/0")
CELERY_BROKER_URL = REDIS_URL
# Web-side tasks (analysis) run inline when asked, e.g. by tests without a broker.
CELERY_TASK_ALWAYS_EAGER = envbool("CELERY_TASK_ALWAYS_EAGER", False)

# What a deployment's endpoint may name besides its host's own name (the worker fetches it):
# host names (".lab.example": any name under lab.example), addresses and networks (10.0.0.0/8).
MOEOPS_ENDPOINT_ALLOWLIST = envlist(
    "MOEOPS_ENDPOINT_ALLOWLIST", ["localhost", "127.0.0.0/8", "::1"]
)
# Seconds between the health checks of every deployment that has an endpoint URL (Celery
# beat); 0 turns them off.
MOEOPS_HEALTH_CHECK_INTERVAL_S = envint("MOEOPS_HEALTH_CHECK_INTERVAL_S", 300, minimum=0)
CELERY_BEAT_SCHEDULE = {}
# the health checks' entry in beat's schedule (moeops.celery drops it when the checks are off)
MOEOPS_HEALTH_CHECK_SCHEDULE = "check-deployments"
if MOEOPS_HEALTH_CHECK_INTERVAL_S:
    CELERY_BEAT_SCHEDULE[MOEOPS_HEALTH_CHECK_SCHEDULE] = {
        "task": "moeops.fleet.tasks.check_deployments",
        "schedule": float(MOEOPS_HEALTH_CHECK_INTERVAL_S),
    }
# A host's worker sends a heartbeat every MOEOPS_HEARTBEAT_S (workers/heartbeat.py); one not
# heard from for MOEOPS_WORKER_STALE_S is gone: work for its host says so instead of waiting.
MOEOPS_WORKER_STALE_S = envint("MOEOPS_WORKER_STALE_S", 120, minimum=1)
# A running sweep whose own heartbeat (pushed every few seconds) is older than this, or a
# running tune or engine action whose host's worker is gone, has lost its worker: it is failed
# (Celery would hand its task out again only after the broker's visibility timeout, hours).
MOEOPS_RUN_STALE_S = envint("MOEOPS_RUN_STALE_S", 300, minimum=1)
CELERY_BEAT_SCHEDULE["fail-stale-jobs"] = {
    "task": "moeops.jobs.fail_stale_jobs",
    "schedule": 60.0,
}
# beat keeps its schedules in the database (django-celery-beat), where the watches' schedules
# are edited in the admin and the API; the entries above are written there when beat starts
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
# beat reads a changed schedule within this many seconds
CELERY_BEAT_MAX_LOOP_INTERVAL = envint("MOEOPS_BEAT_MAX_LOOP_S", 60, minimum=1)

# A watch whose host is held by another sweep, tune or engine action tries again every
# MOEOPS_WATCH_WAIT_S, and is skipped, saying so, once it has waited MOEOPS_WATCH_WAIT_LIMIT_S.
MOEOPS_WATCH_WAIT_S = envint("MOEOPS_WATCH_WAIT_S", 60, minimum=1)
MOEOPS_WATCH_WAIT_LIMIT_S = envint("MOEOPS_WATCH_WAIT_LIMIT_S", 6 * 3600, minimum=1)
# An alert's delivery is tried this many times in all, the n-th retry after
# MOEOPS_ALERT_BACKOFF_S × 2^(n−1) s.
MOEOPS_ALERT_ATTEMPTS = envint("MOEOPS_ALERT_ATTEMPTS", 5, minimum=1)
MOEOPS_ALERT_BACKOFF_S = envint("MOEOPS_ALERT_BACKOFF_S", 30, minimum=0)
# Where alerts' webhooks may be sent (a webhook is a request moeops makes on someone's word, as
# an engine endpoint is): host names (".slack.com": any name under slack.com), addresses and
# networks, matched as MOEOPS_ENDPOINT_ALLOWLIST is (fleet.endpoints).
MOEOPS_WEBHOOK_ALLOWLIST = envlist("MOEOPS_WEBHOOK_ALLOWLIST", ["localhost", "127.0.0.0/8", "::1"])
# Alert mail goes through Django's mail framework with these SMTP settings.
EMAIL_HOST = os.getenv("EMAIL_HOST", "localhost")
EMAIL_PORT = envint("EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = os.getenv("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.getenv("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = envbool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = envbool("EMAIL_USE_SSL", False)
EMAIL_TIMEOUT = envint("EMAIL_TIMEOUT_S", 20, minimum=1)
DEFAULT_FROM_EMAIL = os.getenv("DEFAULT_FROM_EMAIL", "moeops@localhost")

# Largest request body the API accepts (bytes); a telemetry batch of 5,000 samples is ~1 MB.
DATA_UPLOAD_MAX_MEMORY_SIZE = envint("MOEOPS_MAX_BODY_BYTES", 16 * 1024 * 1024)
# Largest trace file (a .zip, .json.gz or .json) a profile uploaded by hand may be (bytes); the
# web tier reads it in the request: 40 decode steps of one GPU rank gzip to some 20-60 MB.
TRACE_UPLOAD_MAX_BYTES = envint("MOEOPS_MAX_TRACE_BYTES", 256 * 1024 * 1024)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.getenv("LOG_LEVEL", "WARNING")},
}
