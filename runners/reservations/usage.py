"""Usage reports: GPU-hours from the device holds runs and reservations recorded, utilisation from node samples.
The table of the daily chat post, the web page, the CSV, the API and Slack's slash command is `report()`."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Count, DurationField, ExpressionWrapper, F, Max, Min, Q, Sum, Value
from django.db.models.functions import Coalesce, Greatest, Least, TruncDate
from django.utils import timezone

from leaderboards.errors import Refused
from runners.models import Gpu, GpuPool, GpuType, Node

from .models import DeviceHold, NodeSample

GROUPS = {"project": "project", "leaderboard": "leaderboard", "user": "user__username", "pool": "pool__name",
          "gpu_type": "gpu_type__name", "day": "day"}
MAX_DAYS = 366


@dataclass(frozen=True)
class Filters:
    group: str
    start: datetime
    end: datetime
    pool: GpuPool | None = None
    gpu_type: GpuType | None = None

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
    """{"group", "start", "end", "rows": [{key, gpu_hours, usage_percent, nodes}]}, most GPU-hours first."""
    holds = DeviceHold.objects.filter(Q(ended__isnull=True) | Q(ended__gt=f.start), started__lt=f.end)
    samples = NodeSample.objects.filter(at__gte=f.start, at__lt=f.end)
    if f.pool:
        holds, samples = holds.filter(pool=f.pool), samples.filter(node__pool=f.pool)
    if f.gpu_type:
        holds, samples = holds.filter(gpu_type=f.gpu_type), samples.filter(gpu__gpu_type=f.gpu_type)
    span = ExpressionWrapper(Least(Coalesce("ended", Value(f.end)), Value(f.end)) - Greatest("started", Value(f.start)),
                             output_field=DurationField())
    field = GROUPS[f.group]
    if f.group == "day":
        holds = holds.annotate(day=TruncDate(Greatest("started", Value(f.start))))
    rows = {label(r["key"]): {"key": label(r["key"]), "gpu_hours": r["time"].total_seconds() / 3600,
                            "usage_percent": None, "nodes": r["nodes"]}
            for r in holds.annotate(key=F(field)).values("key").annotate(time=Sum(span),
                                                                         nodes=Count("node", distinct=True))}
    # utilisation: samples taken on a device while the group held it; closed and open holds apart, so each sample
    # finds its hold by an index range on (gpu, ended)
    found: dict[str, list[float]] = {}
    sampled = samples.aggregate(first=Min("at"), last=Max("at"))
    if sampled["first"] is None:
        return finish(f, rows)
    # bounding the holds by the samples' own span first keeps the range join small (a year of holds, a week of
    # samples)
    bounds = Q(gpu__holds__started__lte=sampled["last"])
    for held in (Q(gpu__holds__started__lte=F("at"), gpu__holds__ended__gt=F("at"))
                 & Q(gpu__holds__ended__gt=sampled["first"]) & bounds,
                 Q(gpu__holds__started__lte=F("at"), gpu__holds__ended__isnull=True) & bounds):
        matched = samples.filter(held)
        matched = matched.annotate(key=TruncDate("at") if f.group == "day" else F(f"gpu__holds__{field}"))
        for s in matched.values("key").annotate(total=Sum("utilization"), n=Count("pk")):
            acc = found.setdefault(label(s["key"]), [0.0, 0])
            acc[0] += s["total"]
            acc[1] += s["n"]
    for key, (total, n) in found.items():
        if key in rows and n:
            rows[key]["usage_percent"] = round(total / n, 1)
    return finish(f, rows)


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
        return len(NodeSample.objects.bulk_create(
            NodeSample(gpu=gpus[s["index"]], node=node, at=now, utilization=s["utilization"],
                       memory_used_mib=s["memory_used_mib"]) for s in samples))
