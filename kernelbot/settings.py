"""One env-driven settings module. Embedded defaults run everything on one machine (`./dev` sets DEBUG=1 for
itself, tests/settings.py for the suite); production sets SECRET_KEY, ALLOWED_HOSTS, DATABASE_URL and REDIS_URL."""

import hashlib
import os
import re
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from runners.harness.contract import TIMING_DEFAULTS

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("KERNELBOT_DATA_DIR", BASE_DIR / "var"))


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    return default if value is None else value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


DEBUG = env_bool("DEBUG", False)  # off unless asked for: a forgotten variable never serves debug pages
SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off (export SECRET_KEY=...).")
    SECRET_KEY = "insecure-development-key-only-used-with-DEBUG-on"
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]" if DEBUG else "")
if not DEBUG and not ALLOWED_HOSTS:
    raise ImproperlyConfigured("ALLOWED_HOSTS must be set when DEBUG is off (comma-separated host names).")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    "daphne",
    "kernelbot.apps.KernelbotAdminConfig",  # django.contrib.admin with the grouped index
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_q",
    "ninja",  # /api/docs: Swagger UI from its bundled static files, not a CDN (renders offline)
    "allauth",
    "allauth.account",
    "allauth.socialaccount",
    "allauth.socialaccount.providers.discord",
    "allauth.socialaccount.providers.github",
    "leaderboards",
    "runners",
    "runners.reservations",
    "discordbot",
]

MIDDLEWARE = [
    "kernelbot.dbhealth.DatabaseHealthMiddleware",  # first: a lost connection is retried (safe requests) or a 503
    "django.middleware.security.SecurityMiddleware",
    "kernelbot.middleware.RejectNulBytesMiddleware",
    "kernelbot.middleware.JsonMethodNotAllowedMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "allauth.account.middleware.AccountMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "kernelbot.urls"
ASGI_APPLICATION = "kernelbot.asgi.application"
WSGI_APPLICATION = None

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
                "leaderboards.context_processors.site_state",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", f"sqlite:///{DATA_DIR / 'kernelbot.sqlite3'}"),
        conn_max_age=int(os.environ.get("DB_CONN_MAX_AGE", "0")),
        # a reused connection (DB_CONN_MAX_AGE; DB_POOL's below) is tested before it serves a request, so one that
        # died while idle (a database restart) is replaced unseen (kernelbot/dbhealth.py)
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # WAL + a busy timeout let the web process and the worker share the file.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"timeout": 20, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"}
    )
if DATABASES["default"]["ENGINE"].endswith("postgresql") and env_bool("DB_POOL", False):
    # one pool per process for its request thread, the SSE stream readers and the websocket consumers' threads;
    # Django's backend, whose checkout swaps a dead pooled connection at once (psycopg_pool's check, which
    # CONN_HEALTH_CHECKS would install, backs off for seconds per dead connection: kernelbot/postgresql/base.py)
    DATABASES["default"].update(ENGINE="kernelbot.postgresql", CONN_MAX_AGE=0, CONN_HEALTH_CHECKS=False)
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 2, "max_size": int(os.environ.get("DB_POOL_SIZE", "16")), "timeout": 30}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "")


def deployment_name(environ=os.environ) -> str:
    """Names this deployment's keys and channels on a Redis server that others may share: KERNELBOT_INSTANCE, or
    the database's name and the Redis database number. (Redis pub/sub channels ignore the database number, so
    without it two deployments on one server would hear each other's live events.)"""
    name = environ.get("KERNELBOT_INSTANCE", "")
    if not name:
        database = dj_database_url.parse(environ.get("DATABASE_URL", "sqlite:///kernelbot")).get("NAME") or ""
        redis = urlparse(environ.get("REDIS_URL", ""))
        redis_db = parse_qs(redis.query).get("db", [redis.path.strip("/") or "0"])[0]
        name = f"{Path(str(database)).name}.{redis_db}"
    return "kb." + re.sub(r"[^A-Za-z0-9_.-]", "-", name)[:60]


DEPLOYMENT = deployment_name()
# Every Redis client (cache, broker, channel layer) waits this long to connect and for an answer; a process that
# got none leaves that Redis alone for REDIS_RETRY_AFTER seconds, reading the database (kernelbot/redis_clients.py)
REDIS_CONNECT_TIMEOUT = float(os.environ.get("KERNELBOT_REDIS_CONNECT_TIMEOUT", "1"))
REDIS_TIMEOUT = float(os.environ.get("KERNELBOT_REDIS_TIMEOUT", "1"))
REDIS_RETRY_AFTER = float(os.environ.get("KERNELBOT_REDIS_RETRY_AFTER", "5"))


def redis_layer(url: str, kind: str = "pubsub") -> dict:
    """pubsub: one Redis message per group event, fanned out inside each ASGI process (1,000 clients: see
    bench/RESULTS.md); core (KERNELBOT_CHANNEL_LAYER=core): the list-based layer, whose receive waits 5 s on the
    server (BZPOPMIN), so it reads that much longer (the pubsub reader polls with its own timeout)."""
    return {"BACKEND": {"pubsub": "channels_redis.pubsub.RedisPubSubChannelLayer",
                        "core": "channels_redis.core.RedisChannelLayer"}[kind],
            "CONFIG": {"hosts": [{"address": url, "socket_connect_timeout": REDIS_CONNECT_TIMEOUT,
                                  "socket_timeout": REDIS_TIMEOUT + (5 if kind == "core" else 0)}],
                       "prefix": DEPLOYMENT}}


def redis_cache(url: str) -> dict:
    return {"BACKEND": "kernelbot.redis_clients.RedisCache", "LOCATION": url, "KEY_PREFIX": DEPLOYMENT,
            "OPTIONS": {"CONNECTION_FACTORY": "kernelbot.redis_clients.CacheConnectionFactory"}}


if REDIS_URL:
    CHANNEL_LAYERS = {"default": redis_layer(REDIS_URL, os.environ.get("KERNELBOT_CHANNEL_LAYER", "pubsub"))}
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
# What every submission reads (tokens, boards, quotas...: leaderboards/access/cache.py). Shared in Redis, an edit
# applies at once in every process; KERNELBOT_CACHE=local keeps it per process (edits take <= 2 s elsewhere) and
# spares each submission 5 Redis round trips (bench/RESULTS.md).
if REDIS_URL and os.environ.get("KERNELBOT_CACHE", "redis") == "redis":
    CACHES = {"default": redis_cache(REDIS_URL)}
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                          "OPTIONS": {"MAX_ENTRIES": 10_000}}}
# Seconds between polls of the live-event outbox that carries events across processes without Redis.
LIVE_OUTBOX_POLL = float(os.environ.get("KERNELBOT_LIVE_OUTBOX_POLL", "0.25"))

Q_CLUSTER = {
    # the broker's queue (Redis: django_q:<name>:q; ORM: its key column), the stats keys and the signing salt:
    # this deployment's own, so two deployments on one Redis never run each other's tasks
    "name": DEPLOYMENT,
    "workers": int(os.environ.get("Q_WORKERS", "2")),
    "timeout": int(os.environ.get("Q_TIMEOUT", "1800")),
    "retry": int(os.environ.get("Q_RETRY", "1860")),
    "max_attempts": 1,  # our own reaper retries runs; a task is never replayed blindly
    "ack_failures": True,
    "catch_up": False,
    "poll": float(os.environ.get("Q_POLL", "0.05")),  # ORM broker: seconds between queue checks
    "recycle": int(os.environ.get("Q_RECYCLE", "500")),  # tasks before a worker is replaced by a fresh fork
    # successful tasks are not stored: django-q2 keeps the last N by locking and reading all N on every task's end
    # (a burst of short tasks queued on it); failures are still stored, for the admin
    "save_limit": int(os.environ.get("Q_SAVE_LIMIT", "-1")),
    "label": "Django Q2",
}
if REDIS_URL:
    Q_CLUSTER.update(redis=REDIS_URL, broker_class="kernelbot.redis_clients.Broker")  # with the timeouts above
else:
    Q_CLUSTER["orm"] = "default"

# Accounts (django-allauth): local sign-up plus Discord/GitHub OAuth, each shown only when its env vars are set.
AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    "allauth.account.auth_backends.AuthenticationBackend",
]
LOGIN_REDIRECT_URL = "/"
ACCOUNT_LOGIN_METHODS = {"username"}
ACCOUNT_SIGNUP_FIELDS = ["username*", "email", "password1*", "password2*"]
ACCOUNT_EMAIL_VERIFICATION = "none"
# The site's login limits (allauth's ACCOUNT_RATE_LIMITS; the API's password login counts with them) and the CLI logins
# started per minute are per account and per client address. Behind the TLS proxy every request comes from the proxy:
# name how many proxies append to X-Forwarded-For (1 for one nginx), else one address's failures refuse everyone's.
ALLAUTH_TRUSTED_PROXY_COUNT = int(os.environ.get("KERNELBOT_TRUSTED_PROXY_COUNT", "0"))
# Failed logins (leaderboards.access.adapter): 10 a minute per address, 5 in 15 minutes per (address, account), so
# strangers cannot lock an owner out, and per account from all addresses together KERNELBOT_LOGIN_FAILURES_PER_ACCOUNT
# (an amount per period: "100/h"), more than one address can reach (20 an hour): locking an owner out takes many.
ACCOUNT_ADAPTER = "leaderboards.access.adapter.AccountAdapter"
LOGIN_FAILURES_PER_ACCOUNT = os.environ.get("KERNELBOT_LOGIN_FAILURES_PER_ACCOUNT", "100/h")
if not re.fullmatch(r"[1-9][0-9]*/[0-9]*[smhd]", LOGIN_FAILURES_PER_ACCOUNT):
    raise ImproperlyConfigured(f"KERNELBOT_LOGIN_FAILURES_PER_ACCOUNT={LOGIN_FAILURES_PER_ACCOUNT!r}: write an amount "
                               "per period, e.g. 100/h or 20/15m")
ACCOUNT_RATE_LIMITS = {"login_failed": "10/m/ip,5/15m/key", "login_failed_account": LOGIN_FAILURES_PER_ACCOUNT + "/key"}
SOCIALACCOUNT_EMAIL_VERIFICATION = "none"
SOCIALACCOUNT_ONLY = False
SOCIALACCOUNT_PROVIDERS = {
    provider: {"APPS": [{"client_id": os.environ[f"{provider.upper()}_CLIENT_ID"],
                         "secret": os.environ.get(f"{provider.upper()}_CLIENT_SECRET", ""), "key": ""}],
               "SCOPE": scope}
    for provider, scope in (("discord", ["identify"]), ("github", ["read:user"]))
    if os.environ.get(f"{provider.upper()}_CLIENT_ID")
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    # django-q2 logs every task it enqueues and runs at INFO; `manage.py serve` sets WARNING
    "loggers": {"django-q": {"level": os.environ.get("Q_LOG_LEVEL", os.environ.get("LOG_LEVEL", "INFO"))}},
}

if not DEBUG:  # behind a TLS proxy that sets X-Forwarded-Proto; `manage.py check --deploy` is clean
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env_bool("SECURE_COOKIES", True)
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS", str(365 * 24 * 3600)))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
    if not SECURE_HSTS_PRELOAD:  # joining browsers' preload list is the operator's own, hard-to-undo choice
        SILENCED_SYSTEM_CHECKS = ["security.W021"]

# --- kernelbot ---------------------------------------------------------------------------------
# Where runs' working directories are created by the local runner.
RUNS_DIR = Path(os.environ.get("KERNELBOT_RUNS_DIR", DATA_DIR / "runs"))
# Host uids of sandboxed runs: SANDBOX_UID_BASE + (Gpu.pk mod SANDBOX_UID_SLOTS). RLIMIT_NPROC counts per uid, so two
# installations on one host must not share uids: the default base is one of 16000 blocks above 2^20, chosen by
# this installation's database and runs directory.
SANDBOX_UID_SLOTS = 1 << 16
_installation = "|".join(str(DATABASES["default"].get(k, "")) for k in ("ENGINE", "HOST", "PORT", "NAME")).replace(
    "kernelbot.postgresql", "django.db.backends.postgresql")  # the same installation with or without DB_POOL
SANDBOX_UID_BASE = int(os.environ.get("KERNELBOT_SANDBOX_UID_BASE") or (1 << 20) + SANDBOX_UID_SLOTS * (int.from_bytes(
    hashlib.sha256(f"{_installation}|{RUNS_DIR.resolve()}".encode()).digest()[:8], "big") % 16000))
if not 1 << 16 <= SANDBOX_UID_BASE <= (1 << 31) - 1 - SANDBOX_UID_SLOTS:
    raise ImproperlyConfigured(f"KERNELBOT_SANDBOX_UID_BASE starts a block of {SANDBOX_UID_SLOTS} uids: it must be "
                               f"between 65536 and {(1 << 31) - 1 - SANDBOX_UID_SLOTS}.")
# Where `import_problems` and the admin find problem trees by default.
PROBLEMS_DIR = Path(os.environ.get("KERNELBOT_PROBLEMS_DIR", BASE_DIR / "problems"))
# Python interpreter that runs the harness (needs torch); defaults to the web app's own.
HARNESS_PYTHON = os.environ.get("KERNELBOT_HARNESS_PYTHON", "")
# Largest accepted submission file.
MAX_SUBMISSION_BYTES = int(os.environ.get("KERNELBOT_MAX_SUBMISSION_BYTES", str(1024 * 1024)))
# Any request body (kernelbot.handlers): refused with 413 before it is read; above the largest upload (a 16 MiB zip)
MAX_REQUEST_BYTES = int(os.environ.get("KERNELBOT_MAX_REQUEST_BYTES", str(32 << 20)))
# KernelBot's pre-check (leaderboards/precheck.py): kernelguard reads every ranked submission where it is installed
# (the `kernelguard` extra); its findings are shown to organisers. FAIL_OPEN: a crash or timeout lets the submission
# through (recorded); 0 refuses it. BLOCK: refuse what kernelguard would filter, as KernelBot does.
KERNELGUARD_ENABLED = os.environ.get("KERNELBOT_KERNELGUARD", "on").strip().lower() not in {"off", "0", "false", "no"}
KERNELGUARD_FAIL_OPEN = env_bool("KERNELBOT_KERNELGUARD_FAIL_OPEN", True)
KERNELGUARD_BLOCK = env_bool("KERNELBOT_KERNELGUARD_BLOCK", False)
KERNELGUARD_TIMEOUT_S = float(os.environ.get("KERNELBOT_KERNELGUARD_TIMEOUT_S", "10"))
KERNELGUARD_PROFILE = os.environ.get("KERNELBOT_KERNELGUARD_PROFILE", "")  # a built-in profile, e.g. strict
# The submissions dataset's push (leaderboards/dataset.py): the Hugging Face Hub (tests: a loopback fake); the token
# is read from HF_TOKEN when pushing.
HF_ENDPOINT = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
# Where Discord's /admin export-hf pushes when no repository is named (KernelBot's names): private, or public.
HF_PRIVATE_DATASET = os.environ.get("HF_PRIVATE_DATASET", "")
HF_PUBLIC_DATASET = os.environ.get("HF_PUBLIC_DATASET", "")
# Users' SSH keys imported from GitHub (runners/reservations/keys.py) come from <this>/<login>.keys (tests: a loopback
# fake), fetched with this timeout in seconds.
GITHUB_WEB_URL = os.environ.get("GITHUB_WEB_URL", "https://github.com").rstrip("/")
GITHUB_KEYS_TIMEOUT = float(os.environ.get("KERNELBOT_GITHUB_KEYS_TIMEOUT", "5"))
# Final standings (leaderboards/finals.py): boards whose deadline passed at most this long ago are re-verified by the
# scheduled tick (older boards of an installation are left as they are; an organiser may still re-verify them).
FINAL_VERIFY_WITHIN = int(os.environ.get("KERNELBOT_FINAL_VERIFY_WITHIN", str(2 * 24 * 3600)))
# Seconds a run may sit in each non-terminal state before the reaper retries or fails it. A queued run no worker took
# within QUEUED_RESEND seconds may have no message (the broker was away when it was sent, or lost it): the reaper
# dispatches it itself, then every QUEUED_DEADLINE seconds while it still waits (every pool of its type failing its
# health check). Dispatch is idempotent: a message that does arrive later finds the run dispatched.
RUN_QUEUED_DEADLINE = int(os.environ.get("KERNELBOT_QUEUED_DEADLINE", "300"))
RUN_STATE_DEADLINES = {
    "queued": int(os.environ.get("KERNELBOT_QUEUED_RESEND", "5")),
    "dispatched": int(os.environ.get("KERNELBOT_DISPATCHED_DEADLINE", "600")),
    "running": int(os.environ.get("KERNELBOT_RUNNING_DEADLINE", "1800")),
}
# A runner that reports heartbeats (the local one does, every 2 s) keeps a dispatched or running run's deadline this
# many seconds ahead, so a run whose runner died is retried within seconds instead of at the state deadline.
# A run's on_finish task (ranking its result, recording a health check) not done this many seconds after it was sent
# is sent again by the reaper: its message may have been lost (the broker away or hanging when it was sent, a worker
# killed while running it). Every hook is idempotent, so a late original and a re-send change nothing twice.
RUN_HOOK_RESEND = int(os.environ.get("KERNELBOT_HOOK_RESEND", "20"))
RUN_HEARTBEAT_DEADLINE = int(os.environ.get("KERNELBOT_HEARTBEAT_DEADLINE", "10"))
# A node agent (`python -m runners.harness.node`) waits for work in `nodes/wait`, held open by the web server up to
# NODE_WAIT seconds (its heartbeat) and ended early by a wake-up (runners.wakeups), and beats each run it holds every
# heartbeat deadline / 4; a node not heard of for AGENT_DEADLINE seconds has no live agent: it gets no run and its
# pool's health check says so (25: a killed agent's node is out of service within 30 s, its last ask's write being
# batched for up to a second; a wait is held at most 0.6 x AGENT_DEADLINE).
# GET /metrics (kernelbot/metrics.py) answers this Bearer token, or a staff session
METRICS_TOKEN = os.environ.get("KERNELBOT_METRICS_TOKEN", "")
NODE_WAIT = float(os.environ.get("KERNELBOT_NODE_WAIT", "15"))
AGENT_DEADLINE = int(os.environ.get("KERNELBOT_AGENT_DEADLINE", "25"))
# `manage.py workers` (the cluster supervisor): it reaps overdue runs every REAP_INTERVAL seconds; it re-sends the
# queued runs' messages, then restarts the cluster, when runs have waited STALL seconds while no worker started a
# task; on SIGTERM it gives the cluster STOP_GRACE seconds before killing it.
CLUSTER_REAP_INTERVAL = float(os.environ.get("KERNELBOT_REAP_INTERVAL", "2"))
CLUSTER_STALL_SECONDS = float(os.environ.get("KERNELBOT_CLUSTER_STALL_SECONDS", "20"))
CLUSTER_START_SECONDS = float(os.environ.get("KERNELBOT_CLUSTER_START_SECONDS", "120"))
CLUSTER_STOP_GRACE = float(os.environ.get("KERNELBOT_CLUSTER_STOP_GRACE", "5"))
# What the supervisor ticks (dotted path → seconds; the first also paces its progress check), re-sends and counts.
CLUSTER_TICKS = {"leaderboards.lifecycle.do_reap_overdue_runs": CLUSTER_REAP_INTERVAL,
                 "leaderboards.lifecycle.poll_remote_runs": float(os.environ.get("KERNELBOT_POLL_INTERVAL", "3")),
                 # reservations end at their end time and queued ones start at their promised start, to the tick
                 "runners.reservations.tasks.keep_time": CLUSTER_REAP_INTERVAL}
CLUSTER_RESEND = "leaderboards.lifecycle.do_resend_queued_runs"
CLUSTER_QUEUED = "leaderboards.lifecycle.count_queued_runs"
# A queued run is re-sent to the broker at each queued deadline, and failed after this long.
RUN_MAX_QUEUED_SECONDS = int(os.environ.get("KERNELBOT_MAX_QUEUED_SECONDS", str(24 * 3600)))
# Pool health checks (leaderboards/health.py): every enabled pool runs a tiny known problem this often (seconds); a
# check without a result after POOL_CHECK_TIMEOUT fails; checks are kept POOL_CHECK_KEEP_DAYS days. Interval 0: no
# scheduled checks (the admin's still run).
POOL_CHECK_INTERVAL = int(os.environ.get("KERNELBOT_POOL_CHECK_INTERVAL", "900"))
POOL_CHECK_TIMEOUT = int(os.environ.get("KERNELBOT_POOL_CHECK_TIMEOUT", "900"))
POOL_CHECK_KEEP_DAYS = int(os.environ.get("KERNELBOT_POOL_CHECK_KEEP_DAYS", "30"))
# A node agents' pool's round is a rolling wave: at most this many nodes' check runs at a time (the next start as
# checks end), so a round over a thousand nodes never floods the platform; checks yield to competitors' runs.
POOL_CHECK_WAVE = int(os.environ.get("KERNELBOT_POOL_CHECK_WAVE", "16"))
# ... and paced: its first wave at once, the rest of its nodes evenly over this many seconds (default: 4/5 of the
# interval, or of 15 minutes when scheduled rounds are off), so a round is a rolling trickle, not the wave's fill rate.
# 0: unpaced (as fast as checks end).
POOL_CHECK_SPREAD = int(os.environ.get("KERNELBOT_POOL_CHECK_SPREAD", str((POOL_CHECK_INTERVAL or 900) * 4 // 5)))
# Where the admin links the docs (docs/operations.md#... becomes DOCS_URL/operations.md#...), e.g. the repository's
# docs folder on its forge; unset: the admin names the file and section as text.
DOCS_URL = os.environ.get("KERNELBOT_DOCS_URL", "").rstrip("/")
# Infrastructure failures retried before a run is failed with a reason.
RUN_MAX_ATTEMPTS = int(os.environ.get("KERNELBOT_RUN_MAX_ATTEMPTS", "3"))
# Harness timing: stop at a 95 % CI within REL_CI of the mean, within sample and time budgets per case; the
# defaults are the job contract's (runners/harness/contract.py).
HARNESS_TIMING = {name: type(default)(os.environ.get(f"KERNELBOT_{name.upper()}", default))
                  for name, default in TIMING_DEFAULTS.items()}
# A/A runs one between-run spread measurement queues per (problem, GPU type) (leaderboards/spread.py).
SPREAD_RUNS = int(os.environ.get("KERNELBOT_SPREAD_RUNS", "10"))
# The workers measure a pair of an open board never measured, or not for this many days, while no competitor's run of
# its GPU type waits (one pair at a time, SPREAD_RUNS runs each); 0: only when an operator asks.
SPREAD_REFRESH_DAYS = float(os.environ.get("KERNELBOT_SPREAD_REFRESH_DAYS", "30"))

# --- Remote runners (issue 12) --------------------------------------------------------------------
# Key the remote runners share with the platform: an attempt's token is HMAC-SHA256(key, "run:attempt:nonce").
# A pool may name another environment variable in its settings (`runner_key_env`).
RUNNER_KEY = os.environ.get("KERNELBOT_RUNNER_KEY", "")
# Where remote runners reach this platform (scheme://host[:port], no trailing slash); a pool may override it.
PUBLIC_URL = os.environ.get("KERNELBOT_PUBLIC_URL", "http://127.0.0.1:8000").rstrip("/")
# A remote run is polled through its backend when the platform has heard nothing of it for POLL_AFTER seconds;
# `manage.py workers` ticks the poll every KERNELBOT_POLL_INTERVAL seconds (CLUSTER_TICKS above).
RUN_POLL_AFTER = float(os.environ.get("KERNELBOT_POLL_AFTER", "10"))
# Seconds a remote run may wait in the service's queue (a pool's `queue_timeout` overrides it), and the slack a
# remote RUNNING run gets beyond its own time budget: it ends by its start + budget + margin at the latest.
RUN_REMOTE_QUEUE_TIMEOUT = int(os.environ.get("KERNELBOT_REMOTE_QUEUE_TIMEOUT", "1800"))
RUN_REMOTE_MARGIN = int(os.environ.get("KERNELBOT_REMOTE_MARGIN", "120"))
# A remote agent beats every 20 s while it runs: a RUNNING run not heard of for REMOTE_SILENCE seconds is on a dead
# node (its job may still look running to the service) and is retried, its job cancelled.
RUN_REMOTE_SILENCE = int(os.environ.get("KERNELBOT_REMOTE_SILENCE", "90"))

# --- API and CLI access (issue 4) ----------------------------------------------------------------
# Bearer token for popcorn-cli's admin commands (/popcorn/admin/...); unset disables them.
ADMIN_TOKEN = os.environ.get("KERNELBOT_ADMIN_TOKEN", os.environ.get("ADMIN_TOKEN", ""))


def env_quota(name: str, default: str) -> tuple[int, int]:
    count, _, seconds = os.environ.get(name, default).partition("/")
    return int(count), int(seconds or 3600)


# Default per-user, per-leaderboard submission quotas as "count/seconds" (0 = unlimited); organisers
# override them per leaderboard in the admin (Leaderboards → Submission quotas).
SUBMISSION_QUOTAS = {"test": env_quota("KERNELBOT_QUOTA_TEST", "60/3600"),
                     "ranked": env_quota("KERNELBOT_QUOTA_RANKED", "20/3600")}
# Optional OAuth apps for popcorn-cli's /auth/cli/{provider} callback (deployments that own them).
POPCORN_OAUTH = {provider: {"client_id": os.environ.get(f"{provider.upper()}_CLIENT_ID", ""),
                            "client_secret": os.environ.get(f"{provider.upper()}_CLIENT_SECRET", "")}
                 for provider in ("discord", "github")}

# GPU reservations and usage reports (runners/reservations, docs/operations.md)
NODE_AGENT_TOKEN = os.environ.get("KERNELBOT_NODE_AGENT_TOKEN", "")  # the node agent's bearer token
USAGE_REPORT_HOUR = int(os.environ.get("KERNELBOT_USAGE_REPORT_HOUR", "9"))  # UTC hour of the daily post
USAGE_DISCORD_WEBHOOK = os.environ.get("KERNELBOT_USAGE_DISCORD_WEBHOOK", "")
USAGE_SLACK_WEBHOOK = os.environ.get("KERNELBOT_USAGE_SLACK_WEBHOOK", "")
SLACK_SIGNING_SECRET = os.environ.get("SLACK_SIGNING_SECRET", "")

# --- Discord bot (issue 13; docs/operations.md) ------------------------------------------------------
# The bot's token (Developer Portal → Bot → Reset Token): `manage.py discordbot` needs it, `manage.py serve` starts the
# bot when it is set. DISCORD_GUILD_ID: a server to serve before any is configured in the admin (its row is created).
DISCORD_TOKEN = os.environ.get("DISCORD_TOKEN", "")
DISCORD_GUILD_ID = int(os.environ.get("DISCORD_GUILD_ID") or 0) or None
# Another Discord endpoint (a proxy, the tests' fake): REST at <url>/api/v10, the gateway at ws(s)://<host>/gateway.
DISCORD_API_URL = os.environ.get("DISCORD_API_URL", "")
# At most one edit of a live status message per this many seconds (Discord allows ~5 edits / 5 s per message).
DISCORD_EDIT_INTERVAL = float(os.environ.get("DISCORD_EDIT_INTERVAL", "1.0"))
# An announcement claimed but not posted (its bot died, Discord refused it) is claimed again after this many seconds
# by whichever bot sweeps next (each sweeps every DISCORD_SWEEP_SECONDS; it also re-reads the open boards then).
DISCORD_ANNOUNCE_RETRY_SECONDS = float(os.environ.get("DISCORD_ANNOUNCE_RETRY_SECONDS", "120"))
DISCORD_SWEEP_SECONDS = float(os.environ.get("DISCORD_SWEEP_SECONDS", "60"))
# Leaderboards whose podium changes are not announced (KernelBot's beginner boards), by name.
DISCORD_BEGINNER_BOARDS = set(env_list("DISCORD_BEGINNER_BOARDS"))
# An interaction's token edits its response for 15 minutes; the status moves to a channel message (or a DM) before.
DISCORD_INTERACTION_TOKEN_SECONDS = float(os.environ.get("DISCORD_INTERACTION_TOKEN_SECONDS", "900"))
# One bot process edits a live status message at a time: it renews its lease every third of this; another process
# takes the message over when the lease lapses (its bot died or hangs).
DISCORD_LEASE_SECONDS = float(os.environ.get("DISCORD_LEASE_SECONDS", "60"))
# /admin update-problems: the repository (owner/name) whose problems/<set>.yaml files it imports unless told another,
# and where a branch's zip is downloaded from ({repository}, {branch}; a mirror, the tests' loopback server).
PROBLEMS_REPOSITORY = os.environ.get("KERNELBOT_PROBLEMS_REPOSITORY", "gpu-mode/reference-kernels")
PROBLEMS_ARCHIVE_URL = os.environ.get("KERNELBOT_PROBLEMS_ARCHIVE_URL",
                                      "https://github.com/{repository}/archive/refs/heads/{branch}.zip")
# Where links in the bot's messages point (the public site), e.g. https://kernels.example.org
SITE_URL = os.environ.get("KERNELBOT_SITE_URL", "").rstrip("/")
