"""A pool of machines that run a node agent each (`python -m runners.harness.node`): the agents pull their runs.

Dispatch only leaves the run dispatched to the pool; a live agent with a free device of its type claims it
(`leaderboards.lifecycle.do_claim_runs`, through the runner API's `nodes/poll`), holds the device through the
allocator that runs and reservations share, runs it with the same per-attempt routes as a remote agent and beats it
every few seconds, so a run whose agent died is retried within seconds. No worker waits for a device or runs a
harness: the task queue carries only short tasks."""

from __future__ import annotations

from .base import Dispatch, Reporter, RunnerBackend


class LocalBackend(RunnerBackend):
    remote = False  # no external job: its node agents heartbeat their runs instead of being polled

    def dispatch(self, job: Dispatch, reporter: Reporter) -> str:
        return ""  # not called (`remote` is False): the dispatched run waits for a claim
