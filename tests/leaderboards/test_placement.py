"""Where dispatch sends a run among pools of one GPU type: free devices and short queues first, two equal pools in
turn, and a cost that does not grow with the pools."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from leaderboards.lifecycle import dispatch_run
from leaderboards.models import Run, RunStatus
from leaderboards.placement import candidate_pools
from runners.models import Gpu, GpuPool, Node, NodeService

from ..factories import local_cpu_pool, submission

pytestmark = pytest.mark.django_db


def live_pool(name: str, nodes: int = 1) -> GpuPool:
    pool = local_cpu_pool(name)
    for i in range(1, nodes):
        Gpu.objects.create(node=Node.objects.create(pool=pool, hostname=f"{name}-{i}"), gpu_type=pool.cpu, index=0)
    pool.nodes.update(agent_seen_at=timezone.now())
    return pool


def pools_of(runs) -> dict[int, int]:
    counts: dict[int, int] = {}
    for run in Run.objects.filter(pk__in=[r.pk for r in runs]).prefetch_related("attempts"):
        pool_id = run.attempts.get(number=run.attempt).pool_id
        counts[pool_id] = counts.get(pool_id, 0) + 1
    return counts


def test_two_equal_pools_share_a_stream_of_queued_runs(leaderboard, cpu_pool):
    other = live_pool("spare")
    runs = [submission(leaderboard, mode="test").runs.get() for _ in range(100)]
    for run in runs:
        dispatch_run(run.pk)
    assert Run.objects.filter(pk__in=[r.pk for r in runs], status=RunStatus.DISPATCHED).count() == 100
    split = pools_of(runs)
    assert set(split) == {cpu_pool.pk, other.pk}
    assert 40 <= split[cpu_pool.pk] <= 60 and 40 <= split[other.pk] <= 60


def test_a_pool_with_free_devices_goes_before_a_busy_one(leaderboard, cpu_pool):
    big = live_pool("big", nodes=4)
    first = submission(leaderboard, mode="test").runs.get()
    assert candidate_pools(first) == [big, cpu_pool]  # four free devices before one, though it is younger
    runs = [submission(leaderboard, mode="test").runs.get() for _ in range(10)]
    for run in runs:
        dispatch_run(run.pk)
    assert pools_of(runs) == {big.pk: 8, cpu_pool.pk: 2}  # in proportion to their devices


def test_a_node_out_of_service_or_without_agent_brings_its_pool_no_share(leaderboard, cpu_pool):
    other = live_pool("spare", nodes=3)
    run = submission(leaderboard, mode="test").runs.get()
    assert candidate_pools(run) == [other, cpu_pool]
    other.nodes.exclude(hostname="localhost").update(service=NodeService.FAILED_CHECK)
    assert candidate_pools(run) == [cpu_pool, other]  # one device each in service: the older first
    cpu_pool.nodes.update(agent_seen_at=None)
    assert candidate_pools(run) == [other, cpu_pool]  # no live agent: last


def test_dispatch_costs_the_same_whatever_the_pools_size(leaderboard, cpu_pool):
    small = live_pool("small")

    def queries() -> int:
        run = submission(leaderboard, mode="test").runs.get()
        with CaptureQueriesContext(connection) as captured:
            dispatch_run(run.pk)
        return len(captured)

    before = queries()
    nodes = Node.objects.bulk_create(Node(pool=small, hostname=f"n{i}", agent_seen_at=timezone.now())
                                     for i in range(200))
    Gpu.objects.bulk_create(Gpu(node=node, gpu_type=small.cpu, index=i) for node in nodes for i in range(8))
    assert queries() == before
