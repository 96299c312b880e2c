"""Runs the harness parent for one job and watches it: the one implementation the local backend (in a worker) and
the remote agent share. Django-free, stdlib only.

`run_harness` writes the job to `python -m runners.harness`, pumps its progress lines to `on_progress` (at most
every PROGRESS_INTERVAL s), asks `still_wanted` every `check_interval` s whether to go on (heartbeat), enforces the
run's total time budget, and accepts only a result line that echoes the job's fresh nonce (a line forged by the
child, which never sees the nonce, is a "hacked" verdict). Returns (result, failure): a result, or why there is none
("" when `still_wanted` said stop).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import queue
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

PROGRESS_INTERVAL = 0.5
STDERR_TAIL = 64 << 10


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: no orphaned harness


def write_workdir(workdir: Path, files: dict[str, str]) -> None:
    workdir.mkdir(parents=True)
    for name, text in files.items():
        path = (workdir / name).resolve()
        if not path.is_relative_to(workdir.resolve()):
            raise ValueError(f"job file {name!r} is outside the workdir")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def harness_env(workdir: str, pythonpath: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8", "PYTHONPATH": pythonpath,
            "HOME": workdir, "KERNELBOT_SANDBOX": os.environ.get("KERNELBOT_SANDBOX", ""),
            "KERNELBOT_CGROUP": os.environ.get("KERNELBOT_CGROUP", "")}


def run_harness(job: dict, *, python: str, pythonpath: str, timeout: float, on_progress: Callable[[dict], None],
                still_wanted: Callable[[], bool], check_interval: float) -> tuple[dict | None, str]:
    job = {**job, "nonce": secrets.token_hex(16)}  # only the trusted parent's result echoes it
    proc = subprocess.Popen(
        [python, "-m", "runners.harness"], cwd=pythonpath, env=harness_env(job["workdir"], pythonpath),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        preexec_fn=_die_with_parent)
    lines: queue.Queue[bytes | None] = queue.Queue()
    stderr_tail: list[bytes] = []
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    threading.Thread(target=_tail, args=(proc.stderr, stderr_tail), daemon=True).start()
    proc.stdin.write(json.dumps(job).encode())
    proc.stdin.close()

    started = last_check = time.monotonic()
    last_progress, pending = 0.0, None  # the latest progress not yet passed on: kept, never dropped
    result, failure = None, ""
    while True:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            line = b""
        now = time.monotonic()
        if line is None:
            break
        if line.strip():
            event = _parse(line)
            if event.get("event") == "result":
                if event.get("nonce") != job["nonce"]:
                    result = {"status": "ok", "verdict": "hacked", "passed": False,
                              "error": "a result line without the run's nonce reached the runner (forged)"}
                    break
                result = {**event, "runner_timing": {"harness_s": round(now - started, 4)}}
                break  # the verdict is final; don't wait for the interpreter's teardown
            if event.get("event") == "progress":
                pending = event
        if pending is not None and now - last_progress >= PROGRESS_INTERVAL:
            last_progress, event, pending = now, pending, None
            on_progress(event)
        if now - started > timeout:
            failure = f"harness exceeded the run's total time limit of {timeout:.0f} s"
            break
        if now - last_check > check_interval:
            last_check = now
            if not still_wanted():
                break
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if result is None and not failure and proc.returncode not in (None, -signal.SIGKILL):
        tail = b"".join(stderr_tail).decode(errors="replace")[-2000:]
        failure = f"harness exited with code {proc.returncode} without a result: {tail}"
    return result, failure


def _pump(stream, lines: queue.Queue) -> None:
    for line in iter(stream.readline, b""):
        lines.put(line)
    lines.put(None)


def _tail(stream, keep: list[bytes], limit: int = STDERR_TAIL) -> None:
    size = 0
    for chunk in iter(lambda: stream.read(4096), b""):
        keep.append(chunk)
        size += len(chunk)
        while size > limit and len(keep) > 1:
            size -= len(keep.pop(0))


def _parse(line: bytes) -> dict:
    try:
        event = json.loads(line)
    except ValueError:
        return {}
    return event if isinstance(event, dict) else {}
