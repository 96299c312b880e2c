"""Test backends for the run lifecycle (B/C/D may reuse them).

`AgentBackend` is a real remote backend whose "service" is this machine: `dispatch` starts the remote agent
(`python -m runners.harness.agent`) as a subprocess against the platform's runner API and returns its pid; `poll`
reads the process's state; `cancel` kills its process group. `ScriptedBackend` runs nothing: its polls answer what
a test queued, and it records dispatches and cancels."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from typing import ClassVar

from django.conf import settings

from runners.backends.base import Dispatch, Poll, RemoteState, Reporter, RunnerBackend
from runners.harness.agent import KEY_ENV, TOKEN_ENV

AGENT_BACKEND = "tests.remote_backend.AgentBackend"
SCRIPTED_BACKEND = "tests.remote_backend.ScriptedBackend"


class AgentBackend(RunnerBackend):
    processes: ClassVar[dict[str, subprocess.Popen]] = {}

    def dispatch(self, job: Dispatch, reporter: Reporter) -> str:
        proc = subprocess.Popen(
            [sys.executable, "-m", "runners.harness.agent", "--platform", job.platform_url, "--run", str(job.run_id),
             "--attempt", str(job.attempt)], cwd=settings.BASE_DIR,
            env={**{k: v for k, v in os.environ.items() if k != KEY_ENV}, TOKEN_ENV: job.token},
            start_new_session=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.processes[str(proc.pid)] = proc
        return str(proc.pid)

    def poll(self, external_id: str) -> Poll:
        proc = self.processes.get(external_id)
        if proc is None:
            return Poll(RemoteState.LOST, "no such agent")
        if proc.poll() is None:
            return Poll(RemoteState.RUNNING)
        if proc.returncode == 0:
            return Poll(RemoteState.FINISHED)
        return Poll(RemoteState.FAILED, f"agent exit code {proc.returncode}")

    def cancel(self, external_id: str) -> None:
        proc = self.processes.get(external_id)
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    @classmethod
    def wait_all(cls, timeout: float = 120) -> list[int]:
        """Wait for every agent started so far; their exit codes."""
        codes = [proc.wait(timeout) for proc in cls.processes.values()]
        for proc in cls.processes.values():
            proc.stdout.close()
            proc.stderr.close()
        return codes

    @classmethod
    def stop_all(cls) -> None:
        for external_id in list(cls.processes):
            cls.cancel(cls.__new__(cls), external_id)
        cls.processes.clear()


class ScriptedBackend(RunnerBackend):
    dispatched: ClassVar[list[Dispatch]] = []
    cancelled: ClassVar[list[str]] = []
    polls: ClassVar[list[Poll]] = []  # answered in order; RUNNING once empty
    fail_dispatch: ClassVar[str] = ""

    def dispatch(self, job: Dispatch, reporter: Reporter) -> str:
        if self.fail_dispatch:
            raise RuntimeError(self.fail_dispatch)
        self.dispatched.append(job)
        return f"{self.pool.name}/job-{job.run_id}-{job.attempt}"

    def poll(self, external_id: str) -> Poll:
        return self.polls.pop(0) if self.polls else Poll(RemoteState.RUNNING)

    def cancel(self, external_id: str) -> None:
        self.cancelled.append(external_id)

    @classmethod
    def reset(cls) -> None:
        cls.dispatched, cls.cancelled, cls.polls, cls.fail_dispatch = [], [], [], ""
