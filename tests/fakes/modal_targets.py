"""Stand-in functions the Modal fake runs in tests that do not need the real app module (no Django here)."""

import os
import time


def echo(**kwargs) -> dict:
    return {"kwargs": kwargs, "key": os.environ.get("KERNELBOT_RUNNER_KEY"),
            "token": os.environ.get("KERNELBOT_ATTEMPT_TOKEN")}


def boom(**kwargs) -> dict:
    raise ValueError(f"boom in run {kwargs.get('run_id')}")


def hang(**kwargs) -> dict:
    time.sleep(600)
    return {}


def crash(**kwargs) -> dict:
    os._exit(3)
