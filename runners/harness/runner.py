"""Runs the harness parent for one job and watches it: the one implementation every agent shares (the node agent,
and the remote one on Slurm, GitHub and Modal). Django-free, stdlib only.

`run_harness` writes the job to a harness parent (`python -m runners.harness`; on a node agent forked from a warm
template, or a spare started ahead of the run: `warm.py`, `Spares`), pumps its progress lines to `on_progress` (at
most every PROGRESS_INTERVAL s), asks `still_wanted` every `check_interval` s whether to go on (heartbeat), enforces
the run's total time budget, and accepts only a result line that echoes the job's fresh nonce (a line forged by the
child, which never sees the nonce, is a "hacked" verdict). Returns (result, failure): a result, or why there is none
("" when `still_wanted` said stop).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import queue
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .warm import Forked, template

PROGRESS_INTERVAL = 0.5
STDERR_TAIL = 64 << 10


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: no orphaned harness


def write_workdir(workdir: Path, files: dict[str, str]) -> None:
    workdir.mkdir(parents=True, exist_ok=True)  # a spare's workdir exists already
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


def start_harness(workdir: str, *, python: str, pythonpath: str, warm: bool,
                  spare: dict | None = None) -> subprocess.Popen | Forked:
    """A harness parent waiting for its job on stdin: forked from this process's template (warm) or a new interpreter.
    `spare`: the sandbox shape of the job expected (see Spares)."""
    env = harness_env(workdir, pythonpath)
    if warm:
        return template(python, pythonpath).spawn(env, pythonpath, spare)
    return subprocess.Popen([python, "-m", "runners.harness"], cwd=pythonpath, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=_die_with_parent)


def _kill(proc: subprocess.Popen | Forked) -> None:
    if isinstance(proc, Forked):
        proc.kill()
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def run_harness(job: dict, *, python: str, pythonpath: str, timeout: float, on_progress: Callable[[dict], None],
                still_wanted: Callable[[], bool], check_interval: float, warm: bool = False,
                proc: subprocess.Popen | Forked | None = None) -> tuple[dict | None, str]:
    """warm: fork the parent from the template; proc: a parent started already (a spare, see Spares)."""
    job = {**job, "nonce": secrets.token_hex(16)}  # only the trusted parent's result echoes it
    start = "spare" if proc is not None else "forked" if warm else "spawned"
    launched = time.monotonic()  # before the fork: the parent's own account of its start lies inside harness_s
    if proc is None:
        proc = start_harness(job["workdir"], python=python, pythonpath=pythonpath, warm=warm)
    lines: queue.Queue[bytes | None] = queue.Queue()
    stderr_tail: list[bytes] = []
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    tail_reader = threading.Thread(target=_tail, args=(proc.stderr, stderr_tail), daemon=True)
    tail_reader.start()
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
                result = {**event, "runner_timing": {"harness_s": round(now - launched, 4), "parent": start}}
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
    _kill(proc)
    proc.wait()
    if result is None and not failure and proc.returncode not in (None, -signal.SIGKILL):
        tail_reader.join(timeout=5)  # the exit can be seen before the reader has drained stderr (a busy machine)
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


def new_workdir(workroot: Path) -> Path:
    """A run's workdir (not created yet): `work` in a private directory of its own under workroot."""
    parent = Path(tempfile.mkdtemp(prefix="kernelbot-run-", dir=workroot))
    parent.chmod(0o755)  # the sandbox's uid owns `work` and must reach it
    return parent / "work"


SPARE_KEYS = ("mode", "protocol", "lang", "limits", "sandbox_uid", "timeouts")


@dataclasses.dataclass
class Spare:
    proc: Forked
    workdir: Path
    job: dict  # the job it was made after (its shape)
    warm: bool = False  # its parent and child hold device contexts


class Spares:
    """One harness parent per device slot (the devices a run gets), forked from the template ahead of its run, with its
    sandboxed child already started (torch imported) in a fresh workdir, waiting for its job. Each is used once, by
    the next run on its slot, and the next one is made when that run ends, in the shape of the run just done (its
    limits, devices and sandbox user, never its seed or files): a job of another shape gets a new child instead.
    Only kernelbot-protocol Python jobs have a child to start early. While no reservation holds a slot's devices its
    spare's parent and child also make their device contexts ahead (the costliest part of a GPU run's start); a spare
    that holds them when a reservation (`reserve`) or a run of another slot (`take`: a multi-device run covers
    single-device slots) takes one of its devices is replaced by one that does not, and warmed again once free."""

    def __init__(self, python: str, pythonpath: str, workroot: Path):
        self.python, self.pythonpath, self.workroot = python, pythonpath, workroot
        self.lock = threading.Lock()
        self.ready: dict[tuple[str, ...], Spare] = {}
        self.reserved: set[str] = set()  # devices reservations hold, as the platform last said
        self.running: list[tuple[str, ...]] = []  # the slots of the runs in flight (taken, not yet prepared again)

    def reserve(self, devices: list[str]) -> None:
        """The devices reservations hold now: no spare keeps a device context on any of them."""
        with self.lock:
            self.reserved = set(devices)
        self._rewarm()

    def take(self, slot: tuple[str, ...]) -> Spare | None:
        """A run starts on `slot` (with this spare, if one is ready): until it ends (`prepare`) no spare keeps a
        device context or flush buffer on its devices."""
        with self.lock:
            spare = self.ready.pop(slot, None)
            self.running.append(slot)
        self._rewarm()
        if spare is not None and spare.proc.poll() is not None:
            self.discard(spare)
            return None
        return spare

    def prepare(self, slot: tuple[str, ...], job: dict) -> None:
        """The run on `slot` ended (or none was taken): leave the next spare for the slot, in the run's shape."""
        with self.lock:
            if slot in self.running:
                self.running.remove(slot)
        self._make(slot, job)
        self._rewarm()

    def _may_warm(self, slot: tuple[str, ...]) -> bool:
        busy = self.reserved.union(*self.running)
        return bool(slot) and not busy & set(slot)

    def _rewarm(self) -> None:
        """Replace each spare whose device contexts are wrong now: held on a device a reservation or another run
        uses, or missing on devices free again."""
        with self.lock:
            wrong = [(slot, spare) for slot, spare in self.ready.items() if spare.warm != self._may_warm(slot)]
        for slot, spare in wrong:
            self._make(slot, spare.job)  # replaces (and discards) it

    def _make(self, slot: tuple[str, ...], job: dict) -> None:
        shape = {key: job[key] for key in SPARE_KEYS if key in job}
        if shape.get("protocol", "kernelbot") != "kernelbot" or shape.get("lang", "py") != "py":
            return
        workdir = new_workdir(self.workroot)
        workdir.mkdir()
        with self.lock:
            warm = self._may_warm(slot)
        try:
            proc = start_harness(str(workdir), python=self.python, pythonpath=self.pythonpath, warm=True,
                                 spare={**shape, "gpus": list(slot), "workdir": str(workdir), "warm_device": warm})
        except Exception as exc:  # no spare: the next run starts its own
            print(f"could not start a spare harness: {exc}", file=sys.stderr)
            shutil.rmtree(workdir.parent, ignore_errors=True)
            return
        with self.lock:
            old, self.ready[slot] = self.ready.get(slot), Spare(proc, workdir, shape, warm)
        if old is not None:
            self.discard(old)

    @staticmethod
    def discard(spare: Spare) -> None:
        spare.proc.kill()
        for stream in (spare.proc.stdin, spare.proc.stdout, spare.proc.stderr):
            with contextlib.suppress(OSError):
                stream.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            spare.proc.wait(timeout=10)
        shutil.rmtree(spare.workdir.parent, ignore_errors=True)

    def close(self) -> None:
        with self.lock:
            spares, self.ready = list(self.ready.values()), {}
        for spare in spares:
            self.discard(spare)
