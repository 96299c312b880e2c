"""The usage report reads whole days from the daily roll-up that ending a hold writes, and the rest from the holds:
whatever the window, grouping and filters, it equals adding up the holds themselves; a hold is counted once however
often its end is attempted; samples carry the holder they were taken under."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from leaderboards import health
from runners.models import Gpu
from runners.reservations import allocator, usage
from runners.reservations.models import DeviceHold, HoldKind, NodeSample, UsageDay
from tests import factories

from .conftest import gpu_pool

pytestmark = pytest.mark.django_db
NOW = datetime(2026, 11, 20, 15, 40, 12, tzinfo=UTC)


@pytest.fixture
def history():
    """Holds over ten days on two pools: runs of minutes, reservations of hours crossing midnights, a few still open."""
    rng = random.Random(7)
    pools = [gpu_pool("lab", nodes=2, per_node=2), gpu_pool("farm", nodes=1, per_node=2, gpu="L4")]
    gpus = list(Gpu.objects.filter(node__pool__in=pools).select_related("node__pool", "gpu_type"))
    users = [factories.UserFactory(username=name) for name in ("ada", "bob")] + [None]
    busy_until = {g.pk: NOW - timedelta(days=10) for g in gpus}
    for _ in range(120):
        gpu = rng.choice(gpus)
        start = busy_until[gpu.pk] + timedelta(minutes=rng.uniform(1, 400))
        length = timedelta(minutes=rng.choice([rng.uniform(1, 30), rng.uniform(60, 2000)]))
        if start >= NOW:
            continue
        run = rng.random() < 0.5
        made = DeviceHold.objects.create(
            gpu=gpu, node=gpu.node, pool=gpu.node.pool, gpu_type=gpu.gpu_type,
            kind=HoldKind.RUN if run else HoldKind.RESERVATION, user=rng.choice(users),
            project=rng.choice(["llm", "vision"]) if not run else "vectoradd",
            leaderboard="vectoradd" if run else "", started=start, ends=start + length)
        if start + length < NOW:
            assert allocator.end_hold(made, start + length)
            busy_until[gpu.pk] = start + length
        else:
            busy_until[gpu.pk] = NOW + timedelta(days=999)  # stays open
    assert DeviceHold.objects.held().exists() and UsageDay.objects.exists()
    return pools


def by_hand(group: str, start: datetime, end: datetime, pool=None, gpu_type=None) -> dict[str, tuple[float, int]]:
    """What the report must say, from the holds alone."""
    seconds, nodes = defaultdict(float), defaultdict(set)
    for h in DeviceHold.objects.select_related("user", "pool", "gpu_type"):
        if (pool and h.pool_id != pool.pk) or (gpu_type and h.gpu_type_id != gpu_type.pk):
            continue
        lo, hi = max(h.started, start), min(h.ended or end, end)
        for day, part in usage.day_spans(lo, hi):
            key = {"project": h.project, "leaderboard": h.leaderboard, "pool": h.pool.name,
                   "gpu_type": h.gpu_type.name, "user": h.user.username if h.user else None, "day": day}[group]
            seconds[usage.label(key)] += part
            nodes[usage.label(key)].add(h.node_id)
    return {key: (round(total / 3600, 3), len(nodes[key])) for key, total in seconds.items() if total > 0}


@pytest.mark.parametrize("days", [1, 2, 3, 11])
@pytest.mark.parametrize("group", list(usage.GROUPS))
def test_the_report_equals_adding_up_the_holds(history, monkeypatch, group, days):
    monkeypatch.setattr(timezone, "now", lambda: NOW)
    f = usage.Filters.parse(group=group, days=days)
    table = usage.report(f)
    got = {r["key"]: (r["gpu_hours"], r["nodes"]) for r in table["rows"]}
    expected = by_hand(group, f.start, f.end)
    assert got.keys() == expected.keys()
    for key, (hours, nodes) in expected.items():
        assert got[key][0] == pytest.approx(hours, abs=0.002) and got[key][1] == nodes, key


def test_filters_and_a_window_inside_one_day(history, monkeypatch):
    lab, farm = history
    end = NOW.replace(hour=9, minute=30)
    f = usage.Filters.parse(group="user", pool="FARM", gpu_type="l4", days=3, end=end)
    got = {r["key"]: (r["gpu_hours"], r["nodes"]) for r in usage.report(f)["rows"]}
    expected = by_hand("user", f.start, end, pool=farm, gpu_type=farm.gpu_type)
    assert {k: v[1] for k, v in got.items()} == {k: v[1] for k, v in expected.items()}
    assert {k: v[0] for k, v in got.items()} == pytest.approx({k: v[0] for k, v in expected.items()}, abs=0.002)
    short = usage.Filters(group="day", start=end - timedelta(hours=5), end=end)  # 04:30–09:30, no midnight
    got = {r["key"]: r["gpu_hours"] for r in usage.report(short)["rows"]}
    assert got == pytest.approx({k: v[0] for k, v in by_hand("day", short.start, end).items()}, abs=0.002)


def test_a_hold_is_counted_once(history):
    hold = DeviceHold.objects.held().first()
    before = sum(UsageDay.objects.values_list("gpu_seconds", flat=True))
    at = hold.started + timedelta(hours=30)  # across at least one midnight
    assert allocator.end_hold(hold, at) is True
    assert allocator.end_hold(hold, at + timedelta(hours=1)) is False  # a second end (a racing reaper) does nothing
    after = sum(UsageDay.objects.values_list("gpu_seconds", flat=True))
    assert after - before == pytest.approx(30 * 3600)
    hold.refresh_from_db()
    assert hold.ended == at


def test_samples_carry_their_holder(history, monkeypatch):
    open_hold = DeviceHold.objects.held().select_related("node", "gpu", "pool").first()
    idle = Gpu.objects.filter(node=open_hold.node).exclude(holds__ended__isnull=True).first()
    monkeypatch.setattr(timezone, "now", lambda: NOW - timedelta(minutes=1))
    samples = [{"index": open_hold.gpu.index, "utilization": 70, "memory_used_mib": 1}]
    if idle:
        samples.append({"index": idle.index, "utilization": 0, "memory_used_mib": 0})
    usage.record_samples(open_hold.pool.name, open_hold.node.hostname, samples)
    taken = NodeSample.objects.get(gpu=open_hold.gpu)
    assert taken.held and taken.project == open_hold.project and taken.user_id == (open_hold.user_id or 0)
    if len(samples) == 2:
        assert not NodeSample.objects.get(gpu=idle).held
    monkeypatch.setattr(timezone, "now", lambda: NOW)
    row = next(r for r in usage.report(usage.Filters.parse(group="project", days=1))["rows"]
               if r["key"] == usage.label(open_hold.project))
    assert row["usage_percent"] == 70.0


def test_the_platforms_own_health_checks_are_nobodys_usage(history, monkeypatch):
    """The pool health checks' runs hold devices too (user kernelbot-health-check, board _pool-health-check): no
    report shows them, by user, leaderboard or any other grouping, ended or open."""
    monkeypatch.setattr(timezone, "now", lambda: NOW)
    groups = ("user", "leaderboard", "project", "pool")
    before = {group: usage.report(usage.Filters.parse(group=group, days=3))["rows"] for group in groups}
    checker = health.check_user()
    gpu = Gpu.objects.filter(node__pool=history[0]).first()
    for started, ended in ((NOW - timedelta(hours=30), NOW - timedelta(hours=29)), (NOW - timedelta(minutes=5), None)):
        hold = DeviceHold.objects.create(gpu=gpu, node=gpu.node, pool=gpu.node.pool, gpu_type=gpu.gpu_type,
                                         kind=HoldKind.RUN, user=checker, project=health.CHECK_BOARD,
                                         leaderboard=health.CHECK_BOARD, started=started, ends=NOW + timedelta(days=1))
        if ended:
            assert allocator.end_hold(hold, ended)
    assert UsageDay.objects.filter(user_id=checker.pk).exists()
    for group in groups:
        assert usage.report(usage.Filters.parse(group=group, days=3))["rows"] == before[group], group
