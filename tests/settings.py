"""The suite's settings: the development defaults (DEBUG=1: its key and hosts), which every process the tests start
inherits through the environment. pytest-django still runs the tests themselves with DEBUG False."""

import os

os.environ.setdefault("DEBUG", "1")
# no scheduled pool health checks in the workers tests start (their runs would join the tests' queues)
os.environ.setdefault("KERNELBOT_POOL_CHECK_INTERVAL", "0")

from kernelbot.settings import *  # noqa: E402,F403
