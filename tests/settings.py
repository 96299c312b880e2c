"""The suite's settings: the development defaults (DEBUG=1: its key and hosts), which every process the tests start
inherits through the environment. pytest-django still runs the tests themselves with DEBUG False."""

import os

os.environ.setdefault("DEBUG", "1")
# no scheduled pool health checks in the workers tests start (their runs would join the tests' queues)
os.environ.setdefault("KERNELBOT_POOL_CHECK_INTERVAL", "0")
# one deployment name for this session and every process it starts (their DATABASE_URL names the test database, this
# process's the one it was derived from): the same task queue, channels and keys, apart from any other on this Redis
os.environ.setdefault("KERNELBOT_INSTANCE", f"test-{os.getpid()}")
# node agents (tests/agents.py) and remote agents authenticate with it
os.environ.setdefault("KERNELBOT_RUNNER_KEY", "test-runner-key-0123456789abcdef")
# a node agent stays live this long after it was last heard of (tests that need it to lapse set it)
os.environ.setdefault("KERNELBOT_AGENT_DEADLINE", "3600")

from kernelbot.settings import *  # noqa: E402,F403
