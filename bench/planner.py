"""The reservation planner and the usage report at scale.

    python bench/planner.py plan  [--queued 1000] [--nodes 100] [--per-node 8] [--repeat 20]
    python bench/planner.py promises [--queues 10000] [--seed 0]
    python bench/planner.py usage [--runs 1000000] [--reservations 10000] [--repeat 5]

`plan`: planning passes (`runners.reservations.planner.plan`, pure) over `--queued` requests of 1/2/4/8 GPUs
(1-8 h) behind devices busy for 0-8 h: the first (every request given its promise), a later one (every promise
kept, compression finds nothing), one after the holds on a tenth of the nodes end at half their time (compression
moves starts earlier); then the same pass through the database (`actions.do_plan`: locks, reads the holds and the
queue, writes every planned start) on PostgreSQL. Target: ≤ 100 ms per pass.
`promises`: `--queues` random queues (1-4 nodes of 1-8 GPUs; a quarter of the requests over 2 nodes where there
are 2), each 30 steps of new requests, extensions (refused
when they would delay a promise, as `actions.do_extend` does) and time passing to the next end or promised start,
half the holds ending early; after every pass, each queued request's start is checked against its promise. Prints
the violations (target: 0) and how often a start moved earlier.
`usage`: a year of device holds (one per run, ~2.5 per reservation) and hourly node samples for a week in the
database `kernelbot_bench_planner` on $BENCH_PG (default postgres://postgres@127.0.0.1:5432), then
`usage.report` over 366 days and over 1 day, per project and per user. Target: ≤ 1 s."""

from __future__ import annotations

import argparse
import io
import os
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
PG = os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
DB = "kernelbot_bench_planner"


def timed(fn, repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000, max(times) * 1000


def setup_django() -> None:
    import psycopg
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB,)).fetchone():
            conn.execute(f"CREATE DATABASE {DB}")
    os.environ.update(DATABASE_URL=f"{PG}/{DB}", DEBUG="1", DJANGO_SETTINGS_MODULE="kernelbot.settings")
    os.environ.pop("REDIS_URL", None)
    import django
    django.setup()
    from django.core.management import call_command
    call_command("migrate", verbosity=0)


def inventory(nodes: int, per_node: int, name: str = "bench"):
    from runners.models import Gpu, GpuPool, GpuType, Node
    from runners.reservations.models import PoolPolicy
    gpu_type, _ = GpuType.objects.get_or_create(name="H100")
    pool, created = GpuPool.objects.get_or_create(name=f"{name}-{nodes}x{per_node}")
    if created:
        made = Node.objects.bulk_create(Node(pool=pool, hostname=f"n{i:03}") for i in range(nodes))
        Gpu.objects.bulk_create(Gpu(node=n, gpu_type=gpu_type, index=i) for n in made for i in range(per_node))
        PoolPolicy.objects.create(pool=pool, competition_share=0, max_gpus_per_user=10**4,
                                  max_gpu_hours_per_user=10**9, max_queue_minutes=10**6)
    return pool, gpu_type


def bench_plan(args) -> None:
    from runners.reservations.planner import Device, Request, plan
    rng = random.Random(1)
    devices = [Device(n * args.per_node + i, n, rng.uniform(0, 8 * 3600))
               for n in range(args.nodes) for i in range(args.per_node)]
    requests = [Request(k, rng.choice((1, 2, 4, 8)), rng.uniform(1, 8) * 3600) for k in range(args.queued)]
    shape = f"{args.queued} queued × {args.nodes} nodes × {args.per_node} GPUs"
    p50, worst = timed(lambda: plan(0.0, devices, requests), args.repeat)
    print(f"planner.plan, first pass (every request given its promise), {shape}: median {p50:.1f} ms, "
          f"max {worst:.1f} ms")
    first = plan(0.0, devices, requests)
    promised = [Request(r.key, r.count, r.seconds, first[r.key].start, first[r.key].devices) for r in requests]
    p50, worst = timed(lambda: plan(0.0, devices, promised), args.repeat)
    print(f"planner.plan, later pass (promises kept, compression): median {p50:.1f} ms, max {worst:.1f} ms")
    early = [Device(d.id, d.node, d.busy_until / 2 if d.node < args.nodes // 10 else d.busy_until)
             for d in devices]
    p50, worst = timed(lambda: plan(0.0, early, promised), args.repeat)
    after = plan(0.0, early, promised)
    moved = sum(after[r.key].start < r.promise for r in promised)
    later = sum(after[r.key].start > r.promise for r in promised)
    print(f"planner.plan, after early ends on a tenth of the nodes: median {p50:.1f} ms, max {worst:.1f} ms; "
          f"{moved} starts moved earlier, {later} later")

    setup_django()
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from runners.models import Gpu
    from runners.reservations import actions
    from runners.reservations.models import DeviceHold, HoldKind, Reservation
    pool, gpu_type = inventory(args.nodes, args.per_node, "plan")
    Reservation.objects.filter(pool=pool).delete()
    DeviceHold.objects.filter(pool=pool).delete()
    user, _ = get_user_model().objects.get_or_create(username="bench")
    now = timezone.now()
    DeviceHold.objects.bulk_create(
        DeviceHold(gpu=g, node_id=g.node_id, pool=pool, gpu_type=gpu_type, kind=HoldKind.RUN, run_id=g.pk,
                   started=now, ends=now + timedelta(seconds=rng.uniform(60, 8 * 3600)),
                   lease_until=now + timedelta(days=1))
        for g in Gpu.objects.filter(node__pool=pool))
    Reservation.objects.bulk_create(
        Reservation(user=user, project="bench", pool=pool, gpu_type=gpu_type, gpu_count=rng.choice((1, 2, 4, 8)),
                    minutes=rng.randint(60, 480), created=now + timedelta(microseconds=k),
                    status_deadline=now + timedelta(days=30)) for k in range(args.queued))
    first, _ = timed(lambda: actions.do_plan(pool.pk, gpu_type.pk), 1)
    print(f"actions.do_plan, first pass (PostgreSQL: locks, reads, writes all {args.queued} planned starts): "
          f"{first:.1f} ms")
    p50, worst = timed(lambda: actions.do_plan(pool.pk, gpu_type.pk), args.repeat)
    print(f"actions.do_plan, later passes (locks, reads, plans; nothing changed to write): "
          f"median {p50:.1f} ms, max {worst:.1f} ms")
    p50, worst = timed(lambda: actions.availability(60), 3)
    print(f"actions.availability (4 ETAs through the same planner): median {p50:.1f} ms, max {worst:.1f} ms")


def one_queue(rng: random.Random, steps: int = 30) -> tuple[int, int, int]:
    """A random life of one pool × type's queue; (promises checked, violations, starts moved earlier)."""
    from runners.reservations.planner import Device, Request, plan
    nodes, per = rng.randint(1, 4), rng.choice((1, 2, 4, 8))
    node_of = {n * per + i: n for n in range(nodes) for i in range(per)}
    holds: dict[int, tuple[float, float, int]] = {}  # device → (planned end, real end, holder)
    queue: dict[int, Request] = {}
    now, key, checked, violations, earlier = 0.0, 0, 0, 0, 0

    def devices(extra: dict[int, float] | None = None) -> list[Device]:
        return [Device(d, n, holds[d][0] + (extra or {}).get(holds[d][2], 0) if d in holds else 0.0)
                for d, n in node_of.items()]

    for _ in range(steps):
        roll = rng.random()
        if roll < 0.5:
            queue[key] = Request(key, rng.randint(1, per), rng.choice((600, 1800, 3600, 7200)) * rng.uniform(.5, 1.5),
                                 nodes=rng.choice((1, 1, 1, 2)) if nodes > 1 else 1)
            key += 1
        elif roll < 0.65 and holds:  # extend a holder, unless a promise would move later
            holder, more = holds[rng.choice(sorted(holds))][2], rng.choice((300, 1800))
            trial = plan(now, devices({holder: more}), queue.values())
            if all(trial[k] is None or r.promise is None or trial[k].start <= max(r.promise, now) + 1e-6
                   for k, r in queue.items()):
                holds.update({d: (h[0] + more, h[1] + more, h[2]) for d, h in holds.items() if h[2] == holder})
        else:  # time passes to the next real end or promised start
            times = [h[1] for h in holds.values()] + [r.promise for r in queue.values() if r.promise is not None]
            now = max(now, min(times)) if times else now + 60
        for d in [d for d, h in holds.items() if h[1] <= now]:
            del holds[d]
        placed = plan(now, devices(), queue.values())
        for k, r in list(queue.items()):
            p = placed[k]
            if p is None:
                continue
            if r.promise is not None:
                checked += 1
                violations += p.start > max(r.promise, now) + 1e-6
                earlier += p.start < max(r.promise, now) - 1e-6
            if p.start <= now:  # starts: half end early
                real = now + r.seconds * (rng.uniform(0.1, 1) if rng.random() < 0.5 else 1)
                holds.update({d: (now + r.seconds, real, k) for d in p.devices})
                del queue[k]
            else:
                queue[k] = Request(k, r.count, r.seconds, p.start, p.devices, r.nodes)
    return checked, violations, earlier


def bench_promises(args) -> None:
    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    checked = violations = earlier = 0
    for _ in range(args.queues):
        c, v, e = one_queue(rng)
        checked, violations, earlier = checked + c, violations + v, earlier + e
    print(f"{args.queues} random queues (early ends, extensions), {checked} promised starts checked: "
          f"{violations} violations (a start later than promised), {earlier} moved earlier; "
          f"{time.perf_counter() - t0:.1f} s")


def bench_usage(args) -> None:
    setup_django()
    from django.db import connection

    from runners.models import Gpu
    from runners.reservations import usage
    from runners.reservations.models import DeviceHold, NodeSample, UsageDay
    pool, gpu_type = inventory(100, 8)
    gpus = list(Gpu.objects.filter(node__pool=pool).values_list("pk", "node_id"))
    made = DeviceHold.objects.filter(pool=pool, kind="run").count()
    if made != args.runs:  # else: the data of an earlier call with the same --runs
        DeviceHold.objects.filter(pool=pool).delete()
        NodeSample.objects.filter(node__pool=pool).delete()
        rng = random.Random(2)
        year = 366 * 86400
        buf = io.StringIO()
        week = time.time() - 7 * 86400 - 3600
        recent: dict[int, list] = {}  # gpu → holds overlapping the samples' week: (start, end, project, leaderboard)
        for k in range(args.runs):
            gpu, node = rng.choice(gpus)
            start = time.time() - rng.uniform(0, year)
            end = start + rng.uniform(20, 300)
            if end > week:
                recent.setdefault(gpu, []).append((start, end, f"lb{k % 40}", f"lb{k % 40}"))
            buf.write(f"{gpu}\t{node}\t{pool.pk}\t{gpu_type.pk}\trun\t\\N\t{k}\t1\t\\N\tlb{k % 40}\tlb{k % 40}\t"
                      f"{stamp(start)}\t{stamp(end)}\t\\N\t{stamp(end)}\n")
        for k in range(args.reservations):
            start = time.time() - rng.uniform(0, year)
            end = start + rng.uniform(1, 12) * 3600
            for _ in range(rng.choice((1, 2, 2, 4, 4))):
                gpu, node = rng.choice(gpus)
                if end > week:
                    recent.setdefault(gpu, []).append((start, end, f"proj{k % 25}", ""))
                buf.write(f"{gpu}\t{node}\t{pool.pk}\t{gpu_type.pk}\treservation\t\\N\t\\N\t\\N\t\\N\tproj{k % 25}\t\t"
                          f"{stamp(start)}\t{stamp(end)}\t\\N\t{stamp(end)}\n")
        buf.seek(0)
        columns = ("gpu_id, node_id, pool_id, gpu_type_id, kind, reservation_id, run_id, run_attempt, user_id, "
                   "project, leaderboard, started, ends, lease_until, ended")
        with connection.cursor() as cursor, cursor.copy(
                f"COPY reservations_devicehold ({columns}) FROM STDIN") as copy:
            copy.write(buf.getvalue())
        samples = io.StringIO()
        for h in range(7 * 24):
            for gpu, node in gpus:
                at = time.time() - h * 3600
                # the holder then, as `usage.record_samples` stores it when the node agent posts
                holder = next((r for r in recent.get(gpu, ()) if r[0] <= at < r[1]), None)
                held = f"t\t{holder[2]}\t{holder[3]}" if holder else "f\t\t"
                samples.write(f"{gpu}\t{node}\t{stamp(at)}\t{rng.uniform(0, 100):.1f}\t0\t{held}\t0\n")
        with connection.cursor() as cursor, cursor.copy(
                "COPY reservations_nodesample (gpu_id, node_id, at, utilization, memory_used_mib, held, project, "
                "leaderboard, user_id) FROM STDIN") as copy:
            copy.write(samples.getvalue())
        t0 = time.perf_counter()
        rows = usage.rebuild_rollup()  # what ending each hold writes as it happens (bypassed by COPY)
        print(f"daily roll-up rebuilt from the holds: {rows} rows in {time.perf_counter() - t0:.1f} s")
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE reservations_devicehold; ANALYZE reservations_nodesample; "
                           "ANALYZE reservations_usageday")
    holds = DeviceHold.objects.filter(pool=pool).count()
    print(f"usage: {holds} device holds over a year, {NodeSample.objects.count()} node samples, "
          f"{UsageDay.objects.count()} daily roll-up rows")
    for group, days in (("project", 366), ("user", 366), ("day", 366), ("project", 1)):
        f = usage.Filters.parse(group=group, days=days)
        p50, worst = timed(lambda f=f: usage.report(f), args.repeat)
        rows = len(usage.report(f)["rows"])
        print(f"usage.report group={group} days={days}: {rows} rows, median {p50:.0f} ms, max {worst:.0f} ms")


def stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S+00", time.gmtime(t))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--queued", type=int, default=1000)
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--per-node", type=int, default=8)
    p.add_argument("--repeat", type=int, default=20)
    q = sub.add_parser("promises")
    q.add_argument("--queues", type=int, default=10_000)
    q.add_argument("--seed", type=int, default=0)
    u = sub.add_parser("usage")
    u.add_argument("--runs", type=int, default=1_000_000)
    u.add_argument("--reservations", type=int, default=10_000)
    u.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    {"plan": bench_plan, "promises": bench_promises, "usage": bench_usage}[args.what](args)


if __name__ == "__main__":
    main()
