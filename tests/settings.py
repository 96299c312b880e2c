"""The suite's settings: the development defaults (DEBUG=1: its key and hosts), which every process the tests start
inherits through the environment. pytest-django still runs the tests themselves with DEBUG False."""

import os
import tempfile

os.environ.setdefault("DEBUG", "1")
# no scheduled pool health checks in the workers tests start (their runs would join the tests' queues)
os.environ.setdefault("KERNELBOT_POOL_CHECK_INTERVAL", "0")
# nor between-run spread measurements of their own (their A/A runs too)
os.environ.setdefault("KERNELBOT_SPREAD_REFRESH_DAYS", "0")
# one deployment name for this session and every process it starts (their DATABASE_URL names the test database, this
# process's the one it was derived from): the same task queue, channels and keys, apart from any other on this Redis
os.environ.setdefault("KERNELBOT_INSTANCE", f"test-{os.getpid()}")
# node agents (tests/agents.py) and remote agents authenticate with it
os.environ.setdefault("KERNELBOT_RUNNER_KEY", "test-runner-key-0123456789abcdef")
if worker := os.environ.get("PYTEST_XDIST_WORKER"):
    # each xdist worker (its own test database) is an installation of its own on this machine: the node token, and
    # with it the installation key in its reservations' tags and cgroups, differs, so the agents of one worker never
    # take another's reservation processes for leftovers of theirs (the processes it starts inherit the same key)
    os.environ["KERNELBOT_RUNNER_KEY"] = os.environ["KERNELBOT_RUNNER_KEY"].partition("@")[0] + f"@{worker}"
    # and a deployment of its own: its task queue, channels and (without Redis) wake file; another worker's
    # dispatched run woke this one's node waits through the shared wake file
    os.environ["KERNELBOT_INSTANCE"] = os.environ["KERNELBOT_INSTANCE"].partition("@")[0] + f"@{worker}"
# a node agent stays live this long after it was last heard of (tests that need it to lapse set it)
os.environ.setdefault("KERNELBOT_AGENT_DEADLINE", "3600")

from kernelbot.settings import *  # noqa: E402,F403

if DATABASES["default"]["ENGINE"].endswith("sqlite3"):  # noqa: F405
    # A test database in a file, not Django's shared-cache in-memory one: there a second connection (a test's
    # thread, the live server) gets "database table is locked" at once, since SQLite's busy timeout does not cover
    # shared-cache table locks; in a file, WAL and the 20 s busy timeout let them wait their turn as in production.
    # One file per test session (xdist workers add their suffix), named in the environment so processes a test
    # starts agree on it; durability is not needed.
    os.environ.setdefault("KERNELBOT_TEST_SQLITE", os.path.join(tempfile.gettempdir(),
                                                                f"kernelbot-test-{os.getpid()}.sqlite3"))
    DATABASES["default"]["TEST"] = {"NAME": os.environ["KERNELBOT_TEST_SQLITE"]}  # noqa: F405
    DATABASES["default"]["OPTIONS"]["init_command"] += "PRAGMA synchronous=OFF;"  # noqa: F405

PASSWORD_HASHERS = ["tests.hashers.OneIterationPBKDF2PasswordHasher"]
