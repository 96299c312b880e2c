"""Runs untrusted code in a separate, limited process tree.

API (stable; other modules depend on it):

    limits = Limits(wall_seconds=60, memory_bytes=4 << 30)
    proc = Sandbox(workdir, limits).start(argv, env={...}, pass_fds=(fd,))
    outcome = proc.wait()          # kills the whole tree on wall-time expiry
    outcome.returncode, outcome.stdout, outcome.stderr, outcome.timed_out, outcome.reason

    describe() -> dict             # which protections are active on this machine

TODO(sandbox owner): bubblewrap namespaces (net, pid, ipc, uts, user), read-only root,
writable workdir only, uid drop, rlimits, output caps, process-group kill.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess


@dataclasses.dataclass(frozen=True)
class Limits:
    wall_seconds: float = 180.0
    cpu_seconds: int = 600
    memory_bytes: int = 8 << 30
    processes: int = 256
    file_size_bytes: int = 256 << 20
    open_files: int = 256
    output_bytes: int = 64 << 10


@dataclasses.dataclass
class Outcome:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    reason: str  # "" on a normal exit, else why the tree was killed or how it died


class Sandbox:
    def __init__(self, workdir: str, limits: Limits):
        self.workdir, self.limits = workdir, limits

    def start(self, argv: list[str], env: dict[str, str] | None = None, pass_fds=()) -> SandboxedProcess:
        proc = subprocess.Popen(
            argv, cwd=self.workdir, env=env or {"PATH": os.defpath}, pass_fds=pass_fds,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )
        return SandboxedProcess(proc, self.limits)


class SandboxedProcess:
    def __init__(self, proc: subprocess.Popen, limits: Limits):
        self.proc, self.limits = proc, limits

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def wait(self) -> Outcome:
        timed_out = False
        try:
            out, err = self.proc.communicate(timeout=self.limits.wall_seconds)
        except subprocess.TimeoutExpired:
            timed_out = True
            self.kill()
            out, err = self.proc.communicate()
        cap = self.limits.output_bytes
        return Outcome(
            self.proc.returncode, out[:cap].decode(errors="replace"), err[:cap].decode(errors="replace"),
            timed_out, "wall time exceeded" if timed_out else "",
        )


def describe() -> dict:
    return {"isolation": "process-group only"}
