"""Settings, configured from the environment (one module; every variable is listed in docs/reference/settings.md).

Importing this module never starts a database: without ``DATABASE_URL`` the
entry point (``manage.py``, ``manage.py up``, the test session) starts the
embedded PostgreSQL first and exports its URL.
"""

import os
import sys
from datetime import timedelta
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from django.utils.csp import CSP

from config import dbpool
from config.logging import logging_config

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value else default


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


# Development mode: Django's debug pages, the development SECRET_KEY, plain HTTP and readable logs.
# Never in production (`manage.py up`, which `make run` starts, turns it on).
DEBUG = env_bool("DEBUG", False)

# Only ever used with DEBUG on (`manage.py up` turns it on); the test session
# brings a key of its own. With DEBUG off the project refuses to start
# without a SECRET_KEY of its own.
DEVELOPMENT_SECRET_KEY = "dev-insecure-change-me-0123456789abcdefghijklmnopqrstuvwxyz"


# The marker of deploy/agentruns.env.example's values that must be replaced.
PLACEHOLDER_MARKER = "replace-me"
GENERATE_HINT = "python -c 'import secrets; print(secrets.token_urlsafe(50))'"


def _secret_key() -> str:
    key = os.environ.get("SECRET_KEY", "")
    if DEBUG:
        return key or DEVELOPMENT_SECRET_KEY
    if not key or key == DEVELOPMENT_SECRET_KEY:
        raise ImproperlyConfigured(
            "SECRET_KEY is not set (or is the development key) and DEBUG is off: set SECRET_KEY to 50 or "
            f"more random characters, for example the output of {GENERATE_HINT}, or set DEBUG=1 for development."
        )
    # Django's own W009 thresholds: a guessable key signs sessions and stream tokens anyone could forge.
    if PLACEHOLDER_MARKER in key or len(key) < 50 or len(set(key)) < 5:
        problem = (
            "is still the placeholder of the example env file"
            if PLACEHOLDER_MARKER in key
            else f"is too short or too simple ({len(key)} characters, {len(set(key))} distinct)"
        )
        raise ImproperlyConfigured(
            f"SECRET_KEY {problem} and DEBUG is off: anyone who knows it can forge sessions and stream tokens. "
            f"Set SECRET_KEY to 50 or more random characters, for example the output of {GENERATE_HINT}."
        )
    return key


def _metrics_token() -> str:
    token = os.environ.get("RUNS_METRICS_TOKEN", "")
    if token and not DEBUG and (PLACEHOLDER_MARKER in token or len(token) < 32):
        problem = (
            "is still the placeholder of the example env file"
            if PLACEHOLDER_MARKER in token
            else f"is too short ({len(token)} characters)"
        )
        raise ImproperlyConfigured(
            f"RUNS_METRICS_TOKEN {problem} and DEBUG is off: set it to 32 or more random characters, for "
            f"example the output of {GENERATE_HINT} (and give Prometheus the same), or unset it to turn "
            "/metrics off."
        )
    return token


def _proxy_ssl_header() -> tuple[str, str] | None:
    """``X-Forwarded-Proto`` (or ``X-Forwarded-Proto=https``): the header a TLS-terminating proxy sets."""
    value = os.environ.get("SECURE_PROXY_SSL_HEADER", "").strip()
    if not value:
        return None
    name, _, expected = value.partition("=")
    return "HTTP_" + name.strip().upper().replace("-", "_"), expected.strip() or "https"


# Signs sessions, CSRF tokens and stream tokens: 50 or more random characters, required with DEBUG
# off (the placeholder of deploy/agentruns.env.example and short or simple keys are refused).
SECRET_KEY = _secret_key()
# The host names this site answers to, comma-separated (its public name in production).
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")
# Origins trusted for unsafe requests from the dashboard and the admin, comma-separated
# (https://runs.example.com), when they differ from the host the request names.
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")

# HTTPS: on by default with DEBUG off, so that `manage.py check --deploy` is
# clean with nothing but DEBUG=0, SECRET_KEY, ALLOWED_HOSTS and DATABASE_URL;
# each of SECURE_SSL_REDIRECT, SESSION_COOKIE_SECURE, CSRF_COOKIE_SECURE,
# SECURE_HSTS_SECONDS, SECURE_HSTS_INCLUDE_SUBDOMAINS and SECURE_HSTS_PRELOAD
# can be turned off (the test session serves plain HTTP). Behind a
# proxy that terminates TLS, set SECURE_PROXY_SSL_HEADER=X-Forwarded-Proto
# (only if the proxy always sets or strips that header).
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", not DEBUG)
# Load balancers probe the health check, and Prometheus scrapes, over plain HTTP from inside.
SECURE_REDIRECT_EXEMPT = [r"^api/health$", r"^metrics$"]
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 365 * 24 * 3600)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", not DEBUG)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", not DEBUG)
SECURE_PROXY_SSL_HEADER = _proxy_ssl_header()
# Content-Security-Policy on every page (django.middleware.csp): scripts, styles and everything else
# from this site only, no inline script or style and no eval; the dashboard, htmx (configured in
# templates/base.html) and the admin work under it.
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF],
    "style-src": [CSP.SELF],
    "img-src": [CSP.SELF, "data:"],  # the blank favicon, and the admin's icons
    "object-src": [CSP.NONE],
    "base-uri": [CSP.NONE],
    "form-action": [CSP.SELF],
    "frame-ancestors": [CSP.NONE],
}

# The API's interactive docs (/api/docs) and its schema (/api/openapi.json); RUNS_API_DOCS=0 hides both.
RUNS_API_DOCS = env_bool("RUNS_API_DOCS", True)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "django_htmx",
    "ninja",
    "runs",
    "workers",
    "config.serving",  # manage.py serve
    "axes",
]
# Demo and example content (the examples package): the research kinds, the demo CRM and deploys apps
# with their kinds, the framework example kinds. Development only (`make run` sets it): their kinds
# would be open to every tenant, and `manage.py check --deploy` warns when it is on with DEBUG off.
RUNS_EXAMPLES = env_bool("RUNS_EXAMPLES", False)
if RUNS_EXAMPLES:
    # The demo apps keep their labels (crm, deploys): their migrations and tables stand.
    INSTALLED_APPS += ["examples", "examples.crm", "examples.deploys"]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "axes.middleware.AxesMiddleware",
    "runs.logins.LoginsBusyMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

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
            ],
        },
    },
]


def _parse_database_url(url: str) -> dj_database_url.DBConfig:
    """``DATABASE_URL`` as Django's settings, with libpq's several hosts too.

    ``postgres://user@10.0.0.1:5432,10.0.0.2:5432/db?target_session_attrs=read-write``
    names a primary and its standbys, as libpq's URIs do: each connection
    tries them in turn and keeps the first that takes writes, so that after a
    failover every process finds the promoted server by itself
    (docs/how-to/failover.md). dj-database-url reads one host; the list is
    handed to libpq whole, in HOST and PORT.
    """
    split = urlsplit(url)
    userinfo, at, hostlist = split.netloc.rpartition("@")
    if "," not in hostlist:
        return dj_database_url.parse(url, conn_max_age=0)
    hosts, ports = [], []
    for member in hostlist.split(","):
        host, colon, port = member.rpartition(":") if not member.endswith("]") else (member, "", "")
        if not colon:
            host, port = member, ""
        hosts.append(unquote(host.strip("[]")))  # a socket's directory is written %2F-quoted
        ports.append(port or "5432")
    config = dj_database_url.parse(
        urlunsplit(split._replace(netloc=f"{userinfo}{at}placeholder")), conn_max_age=0
    )
    config["HOST"] = ",".join(hosts)
    config["PORT"] = ",".join(ports)
    return config


def _database(url: str | None) -> dj_database_url.DBConfig:
    # DATABASE_URL: the PostgreSQL database, postgres://user:password@host:5432/name. Unset, the
    # entry points (manage.py, the test session) start the embedded server and set it.
    if not url:
        # Only reached when Django is started by something other than our
        # entry points (for example a bare `django-admin`).
        raise ImproperlyConfigured(
            "DATABASE_URL is not set. Start through manage.py (which starts the embedded "
            "PostgreSQL under .data/) or set DATABASE_URL=postgres://user@host:5432/dbname."
        )
    config = _parse_database_url(url)
    if config["ENGINE"] != "django.db.backends.postgresql":
        raise ImproperlyConfigured("PostgreSQL is the only supported database.")
    options = config.setdefault("OPTIONS", {})
    # Names each process in pg_stat_activity: "agentruns runworker", "agentruns reap"..., or
    # RUNS_APPLICATION_NAME when set (a startup parameter PgBouncer tracks itself: no
    # ignore_startup_parameters needed).
    command = sys.argv[1] if len(sys.argv) > 1 and sys.argv[0].endswith("manage.py") else "web"
    options.setdefault(
        "application_name", os.environ.get("RUNS_APPLICATION_NAME") or f"agentruns {command}"[:63]
    )
    # RUNS_LISTEN=0 means a transaction-pooling proxy (PgBouncer's
    # pool_mode=transaction; docs/how-to/pgbouncer.md): each transaction may get another
    # server connection, so nothing may outlive one. Django's .iterator()
    # outside a transaction declares a WITH HOLD cursor, which would.
    pooled = not env_bool("RUNS_LISTEN", True)
    config["DISABLE_SERVER_SIDE_CURSORS"] = pooled
    # Server-side prepared statements after a few executions on a connection:
    # the claim, checkpoint and exit statements cost more to plan than to
    # run. Off by default behind a transaction-pooling proxy, which keeps
    # them only from PgBouncer 1.21 on with max_prepared_statements set
    # (then RUNS_DB_PREPARE=1 turns them back on).
    # Session settings, sent when the connection starts (a transaction pooler
    # refuses them: there, set them on the database role, docs/how-to/pgbouncer.md).
    # JIT off: it compiles any statement whose estimated cost passes
    # jit_above_cost, which the claim's can at scale, and spends 100-250 ms
    # doing it on every execution of a statement that runs in a millisecond.
    session = ["-c jit=off"]
    if env_bool("RUNS_DB_PREPARE", not pooled):
        # How many executions of a statement on a connection before it is prepared on the server.
        options.setdefault("prepare_threshold", env_int("RUNS_DB_PREPARE_THRESHOLD", 2))
        # Only the engine's statements are prepared (runs.db.engine_cursor; the ORM's
        # are bound on the client). Planned once: a checkpoint or exit of several
        # runs takes its rows from arrays whose length a generic plan cannot know,
        # and PostgreSQL would otherwise plan it again on every execution. Their
        # generic plans find runs by primary key (batch_guard, runs/sql/fragments.sql).
        session.append("-c plan_cache_mode=force_generic_plan")
    if not pooled:
        options.setdefault("options", " ".join(session))
    # RUNS_DB_POOL=0 turns off psycopg's connection pool (each thread then holds a connection of its own).
    if env_bool("RUNS_DB_POOL", True):
        # psycopg's pool: a thread that waits on a model or a tool has handed
        # its connection back, so a worker with many runs in flight needs few.
        options["pool"] = {
            "min_size": env_int("RUNS_DB_POOL_MIN", 1),  # connections a process keeps open
            "max_size": env_int("RUNS_DB_POOL_MAX", 12),  # connections a process opens at most
            # Seconds a thread waits for a free connection before it fails.
            "timeout": env_float("RUNS_DB_POOL_TIMEOUT", 15),
            # After a restart or a failover: a connection idle in the pool is tried before it
            # is lent, and the pool tries to connect again at least every second (config/dbpool.py).
            "check": dbpool.check,
            "reset": dbpool.returned,
        }
        dbpool.cap_reconnect_delay()
    # The test database's name (the test session sets one per session); unset, Django's test_<name>.
    config["TEST"] = {"NAME": os.environ.get("RUNS_TEST_DATABASE") or None}
    return config


DATABASES = {"default": _database(os.environ.get("DATABASE_URL"))}
# DATABASE_REPLICA_URL: a streaming replica of that database. People's pages and the API's reads
# go to it, with read-your-writes for a browser that just wrote (config/replicas.py); the engine
# never reads from it. Tests read the primary through it (MIRROR).
if os.environ.get("DATABASE_REPLICA_URL"):
    DATABASES["replica"] = _database(os.environ["DATABASE_REPLICA_URL"])
    DATABASES["replica"]["TEST"] = {"MIRROR": "default"}
    DATABASE_ROUTERS = ["config.replicas.ReplicaRouter"]
    MIDDLEWARE.insert(
        MIDDLEWARE.index("whitenoise.middleware.WhiteNoiseMiddleware") + 1,
        "config.replicas.ReplicaReads",
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# Login throttling (django-axes) on the dashboard's and the admin's login: after
# RUNS_LOGIN_FAILURE_LIMIT wrong passwords for one username from one address,
# that pair is refused (429, registration/locked_out.html) for RUNS_LOGIN_COOLOFF_MINUTES
# without the password being checked. Keyed on the pair, so that guessing at an
# account from elsewhere never locks its owner out; attempts are rows in the
# database, shared by every web process. Behind a proxy, REMOTE_ADDR is the client
# once `serve` trusts the proxy (FORWARDED_ALLOW_IPS). `manage.py axes_reset` unlocks.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    # ModelBackend with at most RUNS_LOGIN_CONCURRENCY password checks at once per process (runs.logins).
    "runs.logins.CappedModelBackend",
]
AXES_FAILURE_LIMIT = env_int("RUNS_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(minutes=env_float("RUNS_LOGIN_COOLOFF_MINUTES", 15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
# A fixed cool-off: attempts during a lockout check no password, so they gain nothing to extend it for.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_LOCKOUT_CALLABLE = "runs.logins.locked_out"  # 429 with Retry-After
AXES_VERBOSE = False
# Password checks at once per web process (runs.logins): one more is answered 503 with Retry-After at
# once, so that a burst of logins cannot hold every request thread and core.
RUNS_LOGIN_CONCURRENCY = env_int("RUNS_LOGIN_CONCURRENCY", max(1, (os.cpu_count() or 2) // 2))

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
# Set STATIC_ROOT in production to run collectstatic; unset, files are found in place.
STATIC_ROOT = os.environ.get("STATIC_ROOT") or None
STATICFILES_DIRS = [BASE_DIR / "static"]
# Served by whitenoise straight from the app folders, so neither `make run`
# nor the tests need collectstatic; production may run collectstatic too.
WHITENOISE_USE_FINDERS = True

# Artifacts and other uploads: local files by default; any Django storage
# backend (S3 through django-storages) works through STORAGES.
MEDIA_ROOT = os.environ.get("MEDIA_ROOT") or str(BASE_DIR / ".data" / "media")
MEDIA_URL = "media/"

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
# No redirect after logging out: registration/logged_out.html says it happened.
LOGOUT_REDIRECT_URL = None

# Request bodies above this answer 413 before they are read, on every route and file uploads included
# (config.body_limit, in front of the server's application); Django's own check stays behind it.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("RUNS_MAX_BODY_BYTES", 256 * 1024)

# Any payload of a run (its input, a step's input or output, its result) whose JSON is over
# RUNS_PAYLOAD_INLINE_BYTES is stored as an Artifact and referenced from its row (runs.payloads);
# one over RUNS_PAYLOAD_MAX_BYTES is refused: a step output fails the step, a result the run, an
# input is a 413. The cap bounds what a worker holds in memory for one value (the JSON text, its
# bytes and the decoded value: a few times the cap) and what one replay reads back per step.
RUNS_PAYLOAD_INLINE_BYTES = env_int("RUNS_PAYLOAD_INLINE_BYTES", 256 * 1024)
RUNS_PAYLOAD_MAX_BYTES = env_int("RUNS_PAYLOAD_MAX_BYTES", 64 * 1024 * 1024)

# Structured logs (config/logging.py): RUNS_LOG_FORMAT=json (the default with DEBUG off) or console.
LOGGING = logging_config(
    debug=DEBUG,
    level=os.environ.get("LOG_LEVEL", "INFO"),  # the lowest level logged: DEBUG, INFO, WARNING...
    log_format=os.environ.get("RUNS_LOG_FORMAT") or None,
)

# Agent kinds: installed apps' agents.py plus these modules (web and worker).
AGENT_MODULES = env_list("AGENT_MODULES")

# Django's task API (django.tasks) on this engine: @task functions enqueued with .enqueue() run on
# runworker as one-step runs, with leases, classified retries and crash recovery (runs.tasks).
TASKS = {
    "default": {
        "BACKEND": "runs.tasks.DurableTaskBackend",
        "QUEUES": env_list("RUNS_TASK_QUEUES"),  # empty: a task may name any queue
        # The slug of the tenant that Django tasks run as (created when first needed).
        "OPTIONS": {"TENANT": os.environ.get("RUNS_TASK_TENANT") or "tasks"},
    },
}

# Engine defaults. How long a worker's claim on a run lasts without a heartbeat; past it the reaper queues the run again.
RUNS_LEASE_SECONDS = env_float("RUNS_LEASE_SECONDS", 300)
# How often a worker renews the leases of its runs (at most a third of the lease).
RUNS_HEARTBEAT_SECONDS = env_float("RUNS_HEARTBEAT_SECONDS", 30)
# How often an idle worker looks for runs when no NOTIFY woke it.
RUNS_POLL_SECONDS = env_float("RUNS_POLL_SECONDS", 1.0)
# Runs in flight at once in one worker process (runworker --concurrency).
RUNS_CONCURRENCY = env_int("RUNS_CONCURRENCY", 5)
# Queues runs may name besides their kind's default queue (and queues an operator created).
RUNS_QUEUES = env_list("RUNS_QUEUES", "default,short,long")
# Workers wake on PostgreSQL's LISTEN/NOTIFY; 0 behind a transaction-pooling proxy (see below).
RUNS_LISTEN = env_bool("RUNS_LISTEN", True)
# A web process sends the NOTIFY of the runs submitted within this many seconds together.
RUNS_NOTIFY_DEBOUNCE_SECONDS = env_float("RUNS_NOTIFY_DEBOUNCE_SECONDS", 0.005)
# Attempts a run gets by default (a kind or a submit may say otherwise); retryable errors use them up.
RUNS_MAX_ATTEMPTS = env_int("RUNS_MAX_ATTEMPTS", 3)
# A run's default deadline in seconds from its submit (a kind or a submit may say otherwise).
RUNS_DEADLINE_SECONDS = env_int("RUNS_DEADLINE_SECONDS", 3600)
# How long a run waits for people (an approval, a message, an ambiguous step) before it expires.
RUNS_EXPIRES_SECONDS = env_int("RUNS_EXPIRES_SECONDS", 7 * 24 * 3600)
# The retry backoff: a random delay of up to RUNS_BACKOFF_BASE_SECONDS, doubled at each failure, and
# never above RUNS_BACKOFF_CAP_SECONDS (a kind may override both); a Retryable's retry_after, up to the cap, is the least.
RUNS_BACKOFF_BASE_SECONDS = env_float("RUNS_BACKOFF_BASE_SECONDS", 2)
RUNS_BACKOFF_CAP_SECONDS = env_float("RUNS_BACKOFF_CAP_SECONDS", 300)
# A step's default timeout in seconds (a kind or the step may say otherwise).
RUNS_STEP_TIMEOUT_SECONDS = env_float("RUNS_STEP_TIMEOUT_SECONDS", 600)
# A step still running this long after its timeout makes its worker release its other runs and exit,
# for the supervisor to start a clean process (a thread cannot be killed).
RUNS_STEP_GRACE_SECONDS = env_float("RUNS_STEP_GRACE_SECONDS", 30)
# Seconds between the reaper's passes (manage.py reap --interval).
RUNS_REAP_INTERVAL_SECONDS = env_float("RUNS_REAP_INTERVAL_SECONDS", 10)
# How often the reaper wakes waiting runs whose timer is due.
RUNS_TIMER_INTERVAL_SECONDS = env_float("RUNS_TIMER_INTERVAL_SECONDS", 1)
# Retention (runs.engine.retention): the reaper deletes runs finished more than
# RUNS_RETENTION_DAYS ago (0 keeps everything) with all they own, in batches of
# RUNS_RETENTION_BATCH runs with a pause of RUNS_RETENTION_PAUSE_SECONDS between them, in passes at most every
# RUNS_RETENTION_INTERVAL_SECONDS of at most RUNS_RETENTION_MAX_SECONDS each.
RUNS_RETENTION_DAYS = env_float("RUNS_RETENTION_DAYS", 30)
RUNS_RETENTION_BATCH = env_int("RUNS_RETENTION_BATCH", 500)
RUNS_RETENTION_PAUSE_SECONDS = env_float("RUNS_RETENTION_PAUSE_SECONDS", 0.05)
RUNS_RETENTION_INTERVAL_SECONDS = env_float("RUNS_RETENTION_INTERVAL_SECONDS", 60)
RUNS_RETENTION_MAX_SECONDS = env_float("RUNS_RETENTION_MAX_SECONDS", 5)

# Scales the simulated latencies of the example kinds and the scripted model (0 for no delay).
RUNS_DEMO_DELAY_SCALE = env_float("RUNS_DEMO_DELAY_SCALE", 1.0)

# Event streams (runs.streams): a comment line every RUNS_STREAM_KEEPALIVE_SECONDS keeps proxies
# from closing an idle stream; a stream token is good RUNS_STREAM_TOKEN_SECONDS; each web process
# re-reads its watched runs every RUNS_STREAM_BACKSTOP_SECONDS in case a wake-up was missed (and
# every RUNS_STREAM_POLL_SECONDS with RUNS_LISTEN=0, its only source then), on at most
# RUNS_STREAM_DB_CONNECTIONS connections besides its LISTEN connection, however many streams are open.
RUNS_STREAM_KEEPALIVE_SECONDS = env_float("RUNS_STREAM_KEEPALIVE_SECONDS", 15)
RUNS_STREAM_TOKEN_SECONDS = env_int("RUNS_STREAM_TOKEN_SECONDS", 60)
RUNS_STREAM_BACKSTOP_SECONDS = env_float("RUNS_STREAM_BACKSTOP_SECONDS", 5)
RUNS_STREAM_POLL_SECONDS = env_float("RUNS_STREAM_POLL_SECONDS", 1)
RUNS_STREAM_DB_CONNECTIONS = env_int("RUNS_STREAM_DB_CONNECTIONS", 4)

# Webhooks (runs.webhooks): RUNS_WEBHOOKS_ALLOW_PRIVATE=1 allows http and
# loopback, private and link-local addresses, for development and tests only.
RUNS_WEBHOOKS_ALLOW_PRIVATE = env_bool("RUNS_WEBHOOKS_ALLOW_PRIVATE", False)
# Seconds between a failed attempt and the next one, then the last gap
# again, until the delivery is 24 h old (RUNS_WEBHOOK_GIVE_UP_SECONDS).
RUNS_WEBHOOK_RETRY_SCHEDULE = [
    float(s) for s in env_list("RUNS_WEBHOOK_RETRY_SCHEDULE", "5,300,1800,7200,18000,36000")
]
RUNS_WEBHOOK_GIVE_UP_SECONDS = env_float("RUNS_WEBHOOK_GIVE_UP_SECONDS", 24 * 3600)
# Seconds for the whole attempt (resolve, connect, send, answer), RUNS_WEBHOOK_TIMEOUT_SECONDS, and
# for the connect alone, RUNS_WEBHOOK_CONNECT_TIMEOUT_SECONDS.
RUNS_WEBHOOK_TIMEOUT_SECONDS = env_float("RUNS_WEBHOOK_TIMEOUT_SECONDS", 10)
RUNS_WEBHOOK_CONNECT_TIMEOUT_SECONDS = env_float("RUNS_WEBHOOK_CONNECT_TIMEOUT_SECONDS", 3)
# The ports webhook URLs of public hosts may use, so that webhooks cannot
# probe a host's other services (loopback and private addresses allowed by
# RUNS_WEBHOOKS_ALLOW_PRIVATE may use any port).
RUNS_WEBHOOK_PORTS = [int(p) for p in env_list("RUNS_WEBHOOK_PORTS", "443")]
# A tenant's receiver (scheme, host and port) is paused after this many attempts
# in a row got no answer (timeouts, failed connections); an operator resumes it
# in the admin. 0 never pauses.
RUNS_WEBHOOK_PAUSE_AFTER = env_int("RUNS_WEBHOOK_PAUSE_AFTER", 5)

# Metrics (runs.metrics): GET /metrics answers only with this Bearer token set
# (404 without), 32 or more random characters with DEBUG off. Every process publishes what it
# counted every RUNS_METRICS_PUBLISH_SECONDS; rows of processes silent for
# RUNS_METRICS_RETIRE_SECONDS are folded into one (their counts are kept).
RUNS_METRICS_TOKEN = _metrics_token()
RUNS_METRICS_PUBLISH_SECONDS = env_float("RUNS_METRICS_PUBLISH_SECONDS", 10)
RUNS_METRICS_RETIRE_SECONDS = env_float("RUNS_METRICS_RETIRE_SECONDS", 3600)

# The model provider of LLM runs (workers.llm): LLM_BASE_URL, the API's base URL (an OpenAI-compatible
# endpoint, or Anthropic's); LLM_API_KEY, its key; LLM_MODEL, the model to ask. Without LLM_BASE_URL,
# LLM runs use the scripted model (development and tests).
LLM_BASE_URL = os.environ.get("LLM_BASE_URL", "")
LLM_API_KEY = os.environ.get("LLM_API_KEY", "")
LLM_MODEL = os.environ.get("LLM_MODEL", "")
