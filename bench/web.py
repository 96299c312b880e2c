"""Leaderboard page at scale: 100,000 runs from 5,000 users on PostgreSQL; p50 server time and query count.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/kernelbot_webbench python bench/web.py [--users 5000 --per-user 10]

Builds the data once (re-used on later runs), recomputes the board's ranks, then times the page through
Django's test client (server time: URL routing, views, queries, templates; no network)."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kernelbot.settings")
os.environ.setdefault("DEBUG", "0")  # production settings: no template debug bookkeeping
os.environ.setdefault("SECRET_KEY", "bench-only")
os.environ.setdefault("ALLOWED_HOSTS", "testserver")
os.environ.setdefault("SECURE_SSL_REDIRECT", "0")  # the test client speaks plain HTTP

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from leaderboards import actions  # noqa: E402
from leaderboards.models import Code, Leaderboard, Problem, Run, RunStatus, Submission  # noqa: E402
from runners.models import GpuType, GpuVendor  # noqa: E402
from taskspec.loader import load_task  # noqa: E402

BOARD = "bench-vectoradd"


def build(users: int, per_user: int) -> Leaderboard:
    board = Leaderboard.objects.filter(name=BOARD).first()
    if board and Run.objects.filter(submission__leaderboard=board).count() == users * per_user * 2:
        return board
    from tests.factories import problem_from  # noqa: PLC0415 - bench-only helper

    Leaderboard.objects.filter(name=BOARD).delete()
    cpu, _ = GpuType.objects.get_or_create(name="CPU", defaults={"vendor": GpuVendor.CPU})
    from datetime import timedelta

    from django.utils import timezone
    task = load_task(settings.BASE_DIR / "problems/demo/vectoradd_py")
    problem = Problem.objects.filter(name=task.name, content_hash=task.content_hash).first() or problem_from(task)
    board = Leaderboard.objects.create(name=BOARD, problem=problem, deadline=timezone.now() + timedelta(days=30))
    board.gpu_types.set([cpu])
    User = get_user_model()
    User.objects.filter(username__startswith="bench-").delete()
    people = User.objects.bulk_create([User(username=f"bench-{i}", password="!") for i in range(users)])
    code, _ = Code.objects.get_or_create(sha256=Code.digest("bench"), defaults={"text": "bench"})
    t0 = time.perf_counter()
    with transaction.atomic():
        subs = Submission.objects.bulk_create([
            Submission(user=u, leaderboard=board, problem=board.problem, file_name="s.py", code=code)
            for u in people for _ in range(per_user)], batch_size=5000)
        with connection.cursor() as cursor:
            cursor.execute("UPDATE leaderboards_submission SET created = now() - random() * interval '30 days' "
                           "WHERE leaderboard_id = %s", [board.pk])
        runs = []
        for i, s in enumerate(subs):
            mean = 1e6 * (1 + (i * 7919 % 100_003) / 1000)
            ranked = [{"spec": "size: 2097152", "status": "pass", "mean": mean, "err": mean / 50,
                       "ci_low": mean * 0.98, "ci_high": mean * 1.02, "runs": 40, "best": mean * .9,
                       "worst": mean * 1.2, "std": mean / 20, "stop_reason": "ci"}]
            for secret in (False, True):
                runs.append(Run(submission=s, gpu_type=cpu, secret=secret, status=RunStatus.SUCCEEDED, passed=True,
                                verdict="pass", score=mean / 1e9, attempt=1,
                                result={} if secret else {"ranked": ranked, "tests": [], "benchmarks": ranked}))
        Run.objects.bulk_create(runs, batch_size=5000)
    print(f"built {len(subs)} submissions / {len(runs)} runs in {time.perf_counter() - t0:.1f}s")
    return board


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--users", type=int, default=5000)
    parser.add_argument("--per-user", type=int, default=10)
    parser.add_argument("--requests", type=int, default=100)
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        sys.exit("set DATABASE_URL to a PostgreSQL database")
    call_command("migrate", verbosity=0)
    board = build(args.users, args.per_user)
    cpu = board.gpu_types.get()
    with connection.cursor() as cursor:  # what autovacuum does after a bulk load
        cursor.execute("ANALYZE")
    t0 = time.perf_counter()
    actions.do_recompute_ranks(board.pk, cpu.pk)
    print(f"recompute_ranks: {time.perf_counter() - t0:.2f}s")
    with connection.cursor() as cursor:  # the fresh ranks and records too (stale statistics: 35.8 ms, not 23.1)
        cursor.execute("ANALYZE")
    client = Client()
    t0 = time.perf_counter()
    assert client.get(f"/lb/{BOARD}/").status_code == 200
    print(f"first view after a rank change (records read from Record rows): {1000 * (time.perf_counter() - t0):.0f} ms")
    for label, url in (("page 1", f"/lb/{BOARD}/"), ("page 60", f"/lb/{BOARD}/?page=60")):
        times = []
        for _ in range(args.requests):
            with CaptureQueriesContext(connection) as queries:
                t = time.perf_counter()
                response = client.get(url)
                times.append(1000 * (time.perf_counter() - t))
            assert response.status_code == 200
        times.sort()
        print(f"{label}: p50 {statistics.median(times):.1f} ms, p95 {times[int(len(times) * .95)]:.1f} ms, "
              f"{len(queries)} queries, {len(response.content) // 1024} KiB")


if __name__ == "__main__":
    main()
