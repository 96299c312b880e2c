"""Usage reports: GPU-hours from the device holds runs and reservations recorded, utilisation from node samples.
The table of the daily chat post, the web page, the CSV, the API and Slack's slash command is `report()`."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from datetime import time as dtime

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Count, DurationField, ExpressionWrapper, F, Q, Sum, Value
from django.db.models.functions import Coalesce, Greatest, Least, TruncDate
from django.utils import timezone

from kernelbot.errors import Refused
from runners.models import Gpu, GpuPool, GpuType, Node

from .models import DeviceHold, NodeSample, UsageDay

GROUPS = {"project": "project", "leaderboard": "leaderboard", "user": "user__username", "pool": "pool__name",
          "gpu_type": "gpu_type__name", "day": "day"}
MAX_DAYS = 366
# usernames whose device time no report shows: the platform's own (the pool health checks' user, registered by the
# leaderboards app), which is no one's usage
INTERNAL_USERNAMES: set[str] = set()


@dataclass(frozen=True)
class Filters:
    group: str
    start: datetime
    end: datetime
    pool: GpuPool | None = None
    gpu_type: GpuType | None = None
    user_id: int | None = None  # only this holder's device time

    @classmethod
    def parse(cls, *, group: str = "project", pool: str = "", gpu_type: str = "", days: int = 1,
              end: datetime | None = None) -> Filters:
        """Validated filters; every bad value is a 400 naming it."""
        if group not in GROUPS:
            raise Refused(f"group must be one of {', '.join(GROUPS)}; got '{group}'.", 400)
        if not 1 <= days <= MAX_DAYS:
            raise Refused(f"days must be between 1 and {MAX_DAYS}; got {days}.", 400)
        found_pool = found_type = None
        if pool:
            found_pool = GpuPool.objects.filter(name__iexact=pool.strip()).first()
            if found_pool is None:
                raise Refused(f"Unknown pool '{pool}'.", 400)
        if gpu_type:
            found_type = GpuType.objects.filter(name__iexact=gpu_type.strip()).first()
            if found_type is None:
                raise Refused(f"Unknown GPU type '{gpu_type}'.", 400)
        end = end or timezone.now()
        return cls(group, end - timedelta(days=days), end, found_pool, found_type)


def label(key) -> str:
    return "(none)" if key in (None, "") else str(key)


def report(f: Filters) -> dict:
    """{"group", "start", "end", "rows": [{key, gpu_hours, usage_percent, nodes}]}, most GPU-hours first. The window's
    whole UTC days come from the daily roll-up of ended holds; its partial first and last days and every open hold
    from the holds themselves; utilisation from the samples, which carry their holder."""
    totals: dict[str, list] = {}  # key → [seconds, node ids]

    def add(key, seconds: float, nodes) -> None:
        acc = totals.setdefault(label(key), [0.0, set()])
        acc[0] += seconds
        acc[1].update(nodes)

    first, last = midnight_after(f.start), midnight_before(f.end)
    if first <= last:  # whole days (maybe none): the roll-up, plus open holds over them
        rolled = UsageDay.objects.filter(day__gte=first.date(), day__lt=last.date())
        rolled = _filtered(rolled, f)
        users = _usernames(rolled) if f.group == "user" else {}
        field = {"user": "user_id", "day": "day"}.get(f.group, GROUPS[f.group])
        for key, seconds, nodes in rolled.values_list(field, "gpu_seconds", "nodes").iterator(chunk_size=5000):
            add(users.get(key) if f.group == "user" else key, seconds, nodes)
        # open holds over the whole days (at most one per device), split by day
        for key, node, started in _filtered(DeviceHold.objects.held().filter(started__lt=last), f).values_list(
                GROUPS[f.group] if f.group != "day" else "pk", "node", "started"):
            for day, seconds in day_spans(max(started, first), last):
                add(day if f.group == "day" else key, seconds, [node])
        segments = [(f.start, first), (last, f.end)]
    else:
        segments = [(f.start, f.end)]
    for start, end in segments:  # each within one day
        if start >= end:
            continue
        holds = _filtered(DeviceHold.objects.filter(started__lt=end), f).filter(Q(ended__isnull=True) |
                                                                               Q(ended__gt=start))
        span = ExpressionWrapper(Least(Coalesce("ended", Value(end)), Value(end)) - Greatest("started", Value(start)),
                                 output_field=DurationField())
        if f.group == "day":
            holds = holds.annotate(day=TruncDate(Greatest("started", Value(start))))
        for r in holds.annotate(key=F(GROUPS[f.group])).values("key", "node").annotate(time=Sum(span)):
            add(r["key"], max(r["time"].total_seconds(), 0.0), [r["node"]])
    rows = {key: {"key": key, "gpu_hours": seconds / 3600, "usage_percent": None, "nodes": len(nodes)}
            for key, (seconds, nodes) in totals.items()}
    samples = NodeSample.objects.filter(at__gte=f.start, at__lt=f.end, held=True).exclude(
        user_id__in=internal_user_ids())
    if f.pool:
        samples = samples.filter(node__pool=f.pool)
    if f.gpu_type:
        samples = samples.filter(gpu__gpu_type=f.gpu_type)
    if f.user_id is not None:
        samples = samples.filter(user_id=f.user_id)
    key = {"day": TruncDate("at"), "pool": F("node__pool__name"), "gpu_type": F("gpu__gpu_type__name"),
           "user": F("user_id")}.get(f.group, F(f.group))
    found = list(samples.annotate(key=key).values("key").annotate(total=Sum("utilization"), n=Count("pk")))
    users = _usernames(samples) if f.group == "user" else {}
    for s in found:
        name = label(users.get(s["key"]) if f.group == "user" else s["key"])
        if name in rows and s["n"]:
            rows[name]["usage_percent"] = round(s["total"] / s["n"], 1)
    return finish(f, rows)


def report_for(user, f: Filters) -> dict:
    """The one rule of who sees whose usage: organisers (staff) every row; anyone else the rows of their own device
    time and the total of everyone's (`total_gpu_hours`, also in an organiser's table)."""
    everyone = report(f)
    total = round(sum(r["gpu_hours"] for r in everyone["rows"]), 3)
    if user.is_staff:
        return {**everyone, "scope": "all", "total_gpu_hours": total}
    return {**report(replace(f, user_id=user.pk)), "scope": "mine", "total_gpu_hours": total}


def internal_user_ids() -> list[int]:
    return list(get_user_model().objects.filter(username__in=INTERNAL_USERNAMES).values_list("pk", flat=True))


def _filtered(qs, f: Filters):
    qs = qs.exclude(user_id__in=internal_user_ids())
    if f.pool:
        qs = qs.filter(pool=f.pool)
    if f.gpu_type:
        qs = qs.filter(gpu_type=f.gpu_type)
    if f.user_id is not None:
        qs = qs.filter(user_id=f.user_id)
    return qs


def _usernames(qs) -> dict[int, str]:
    ids = set(qs.values_list("user_id", flat=True).distinct()) - {0, None}
    return dict(get_user_model().objects.filter(pk__in=ids).values_list("pk", "username"))


def midnight_before(moment: datetime) -> datetime:
    return datetime.combine(moment.astimezone(UTC).date(), dtime.min, tzinfo=UTC)


def midnight_after(moment: datetime) -> datetime:
    floor = midnight_before(moment)
    return floor if floor == moment else floor + timedelta(days=1)


def day_spans(start: datetime, end: datetime) -> Iterator[tuple[date, float]]:
    """(UTC day, seconds) of the interval's part in each day it touches."""
    while start < end:
        stop = min(end, midnight_before(start) + timedelta(days=1))
        yield start.astimezone(UTC).date(), (stop - start).total_seconds()
        start = stop


def add_hold(hold: DeviceHold, ended: datetime) -> None:
    """Count an ended hold into the daily roll-up: once, in the transaction that sets its end."""
    for day, seconds in day_spans(hold.started, ended):
        row, _ = UsageDay.objects.select_for_update().get_or_create(
            day=day, pool_id=hold.pool_id, gpu_type_id=hold.gpu_type_id, kind=hold.kind, project=hold.project,
            leaderboard=hold.leaderboard, user_id=hold.user_id or 0)
        row.gpu_seconds += seconds
        if hold.node_id not in row.nodes:
            row.nodes = [*row.nodes, hold.node_id]
        row.save(update_fields=["gpu_seconds", "nodes"])


def rebuild_rollup(holds=DeviceHold, days=UsageDay) -> int:
    """The roll-up computed afresh from every ended hold (the migration that introduced it; data loaded around
    `add_hold`, as the benchmark's). Model classes may be a migration's historical ones."""
    acc: dict[tuple, list] = {}
    columns = ("started", "ended", "pool_id", "gpu_type_id", "kind", "project", "leaderboard", "user_id", "node_id")
    for started, ended, *holder, user_id, node_id in holds.objects.filter(ended__isnull=False).values_list(
            *columns).iterator(chunk_size=20000):
        for day, seconds in day_spans(started, ended):
            entry = acc.setdefault((day, *holder, user_id or 0), [0.0, set()])
            entry[0] += seconds
            entry[1].add(node_id)
    with transaction.atomic():
        days.objects.all().delete()
        days.objects.bulk_create((days(day=day, pool_id=pool, gpu_type_id=gpu_type, kind=kind, project=project,
                                       leaderboard=leaderboard, user_id=user, gpu_seconds=seconds, nodes=sorted(nodes))
                                  for (day, pool, gpu_type, kind, project, leaderboard, user), (seconds, nodes)
                                  in acc.items()), batch_size=5000)
    return len(acc)


def holders_at(gpu_ids, at: datetime) -> dict[int, DeviceHold]:
    """Each device's hold at `at`, if any."""
    return {h.gpu_id: h for h in DeviceHold.objects.filter(gpu_id__in=list(gpu_ids), started__lte=at).filter(
        Q(ended__isnull=True) | Q(ended__gt=at))}


def finish(f: Filters, rows: dict[str, dict]) -> dict:
    ordered = sorted(rows.values(), key=lambda r: (-r["gpu_hours"], r["key"]))
    for r in ordered:
        r["gpu_hours"] = round(r["gpu_hours"], 3)
    return {"group": f.group, "start": f.start, "end": f.end, "rows": ordered}


def to_csv(table: dict) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow([table["group"], "gpu_hours", "gpu_usage_percent", "nodes_used"])
    for r in table["rows"]:
        writer.writerow([r["key"], r["gpu_hours"], "" if r["usage_percent"] is None else r["usage_percent"],
                         r["nodes"]])
    if "total_gpu_hours" in table:
        writer.writerow(["(all users)", table["total_gpu_hours"], "", ""])
    return out.getvalue()


def to_text(table: dict, title: str) -> str:
    """A fixed-width table for chat messages."""
    lines = [f"{title} ({table['start']:%Y-%m-%d %H:%M} – {table['end']:%Y-%m-%d %H:%M} UTC)",
             f"{table['group']:<24} {'GPU usage %':>11} {'nodes used':>10} {'GPU-hours':>10}"]
    for r in table["rows"][:40]:
        usage = "-" if r["usage_percent"] is None else f"{r['usage_percent']:.1f}"
        lines.append(f"{r['key'][:24]:<24} {usage:>11} {r['nodes']:>10} {r['gpu_hours']:>10.2f}")
    if not table["rows"]:
        lines.append("(no GPU use recorded)")
    return "\n".join(lines)


def record_samples(pool: str, hostname: str, samples: list[dict]) -> int:
    node = Node.objects.filter(pool__name=pool, hostname=hostname).first()
    if node is None:
        raise Refused(f"No node '{hostname}' in pool '{pool}'.", 404)
    gpus = {g.index: g for g in Gpu.objects.filter(node=node)}
    unknown = sorted({s["index"] for s in samples} - set(gpus))
    if unknown:
        raise Refused(f"Node {hostname} has no device with index {unknown[0]}.", 400)
    now = timezone.now()
    with transaction.atomic():
        holders = holders_at((g.pk for g in gpus.values()), now)
        return len(NodeSample.objects.bulk_create(
            NodeSample(gpu=gpus[s["index"]], node=node, at=now, utilization=s["utilization"],
                       memory_used_mib=s["memory_used_mib"], **holder_fields(holders.get(gpus[s["index"]].pk)))
            for s in samples))


def holder_fields(hold: DeviceHold | None) -> dict:
    if hold is None:
        return {"held": False}
    return {"held": True, "project": hold.project, "leaderboard": hold.leaderboard, "user_id": hold.user_id or 0}
