"""The supervisor's judgement of a cluster's progress, against a real child process standing in for the cluster: a
slow start is not a wedge, a cluster whose workers are up and idle while messages wait is, and so is one whose workers
never come up."""

from __future__ import annotations

import sys

import pytest

from runners import supervisor as supervision

STALL, START = 10.0, 120.0


class Broker:
    def __init__(self, waiting: int):
        self.waiting = waiting

    def queue_size(self) -> int:
        return self.waiting


@pytest.fixture
def watched(settings, monkeypatch):
    settings.CLUSTER_STALL_SECONDS, settings.CLUSTER_START_SECONDS = STALL, START
    settings.CLUSTER_TICKS = {}
    monkeypatch.setattr(supervision, "broker", lambda: Broker(3))  # three messages wait for this cluster
    sup = supervision.Supervisor([sys.executable, "-c", "import time; time.sleep(600)"])
    sup.queued = lambda **_: 3
    sup.resend = lambda **_: 0
    sup._start()
    cluster = sup.cluster
    yield sup, cluster
    sup._kill_cluster()
    cluster.wait(10)


def spawn_worker(sup: supervision.Supervisor, state: str = "idle 0") -> None:
    (sup.heartbeats / str(sup.cluster.pid)).write_text(state)  # the group leader stands in for its worker


def test_a_cluster_still_starting_is_given_its_start_time(watched):
    sup, cluster = watched
    sup.started_at -= STALL + 30  # past a stall period, no worker spawned yet: importing Django on a busy machine
    sup._check_progress()
    assert sup.cluster is cluster and cluster.poll() is None


def test_the_quiet_time_of_a_new_cluster_starts_when_its_first_worker_is_up(watched):
    sup, cluster = watched
    sup.started_at -= STALL + 30
    spawn_worker(sup)
    sup._check_progress()
    assert sup.ready_at is not None and sup.cluster is cluster  # up just now: not quiet for a stall period yet
    sup.ready_at -= STALL + 1  # up and idle for a stall period while messages wait: wedged
    sup._check_progress()
    assert sup.cluster is None and cluster.wait(10) is not None


def test_a_busy_worker_is_progress(watched):
    sup, cluster = watched
    sup.started_at -= START + STALL
    spawn_worker(sup, "busy 1")
    sup._check_progress()
    assert sup.cluster is cluster


def test_a_cluster_whose_workers_never_come_up_is_restarted_after_its_start_time(watched):
    sup, cluster = watched
    sup.started_at -= START + STALL - 5
    sup._check_progress()
    assert sup.cluster is cluster
    sup.started_at -= 6
    sup._check_progress()
    assert sup.cluster is None and cluster.wait(10) is not None
