"""What one ranked result costs on a big board: the full rebuild (what every result did before issue 15) against the
incremental update, side by side on the same board, and the first leaderboard page view after a change.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/kernelbot_rankbench python bench/ranks.py [--runs 100000 1000000]

Per size, one board with `--users` users and runs/2 ranked submissions (public + secret run each, ratios and times)
is generated with generate_series (re-used on later runs), rebuilt once and ANALYZEd. Then each sample submits a
new submission for a random user, ingests its public run, and times its secret run's ingest plus the hook (board
updated, event sent after commit): random results (drawn like the board's; most do not beat the user's entry),
results that take first place, results that improve the user's entry by 1 % (a move of a few ranks) and results that
do not beat the user's entry; and as a baseline for the host's speed, the ingest without any rank work and page
views of an unchanged board. Run the same file against an older checkout to compare releases side by side."""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kernelbot.settings")
os.environ.setdefault("DEBUG", "0")
os.environ.setdefault("SECRET_KEY", "bench-only")
os.environ.setdefault("ALLOWED_HOSTS", "testserver")
os.environ.setdefault("SECURE_SSL_REDIRECT", "0")

import django  # noqa: E402

django.setup()

from datetime import timedelta  # noqa: E402

from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.utils import timezone  # noqa: E402

from leaderboards import actions, ranks  # noqa: E402
from leaderboards.models import BoardEntry, Code, Leaderboard, Problem, Run, RunStatus, Submission  # noqa: E402
from runners.models import GpuType, GpuVendor  # noqa: E402
from taskspec.loader import load_task  # noqa: E402

PREFIX = "rankbench-"

RUNS_SQL = """
INSERT INTO leaderboards_run (submission_id, gpu_type_id, secret, status, attempt, queued_at, finished_at, runner,
  verdict, error, result, system_info, stdout, stderr, progress, infra_failures, passed, score, ratio, ratio_low,
  ratio_high, on_finish)
SELECT s.id, %(gpu)s, v.secret, 'succeeded', 1, now(), now(), '', 'pass', '', '{}', '{}', '', '', '{}', 0, true,
  r.ratio * 1e-6, r.ratio, r.ratio * 0.97, r.ratio * 1.03, 'leaderboards.tasks.rank_run'
FROM leaderboards_submission s CROSS JOIN (VALUES (false), (true)) v(secret),
  LATERAL (SELECT (1 + 99 * ((s.id * 7919) %% 100003) / 100003.0) * (1 + 0.01 * random()) AS ratio) r
WHERE s.leaderboard_id = %(lb)s
"""


def build(runs: int, users: int) -> Leaderboard:
    name = f"{PREFIX}{runs}"
    board = Leaderboard.objects.filter(name=name).first()
    if board and Run.objects.filter(submission__leaderboard=board).count() >= runs:  # (with earlier samples')
        return board
    Leaderboard.objects.filter(name=name).delete()
    cpu, _ = GpuType.objects.get_or_create(name="CPU", defaults={"vendor": GpuVendor.CPU})
    task = load_task(settings.BASE_DIR / "problems/demo/vectoradd_py")
    from tests.factories import problem_from  # noqa: PLC0415 - bench-only helper

    problem = Problem.objects.filter(name=task.name, content_hash=task.content_hash).first() or problem_from(task)
    board = Leaderboard.objects.create(name=name, problem=problem, deadline=timezone.now() + timedelta(days=30))
    board.gpu_types.set([cpu])
    code, _ = Code.objects.get_or_create(sha256=Code.digest("bench"), defaults={"text": "bench"})
    t0 = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("SELECT setseed(0.15)")
        cursor.execute("INSERT INTO auth_user (password, is_superuser, username, first_name, last_name, email, "
                       "is_staff, is_active, date_joined) SELECT '!', false, %s || i, '', '', '', false, true, now() "
                       "FROM generate_series(0, %s - 1) i ON CONFLICT (username) DO NOTHING", [PREFIX, users])
        cursor.execute("INSERT INTO leaderboards_submission (user_id, leaderboard_id, problem_id, file_name, code_id, "
                       "mode, created) SELECT u.id, %s, %s, 's.py', %s, 'leaderboard', "
                       "now() - interval '30 days' * random() FROM (SELECT id FROM auth_user WHERE username LIKE %s "
                       "ORDER BY id LIMIT %s) u, generate_series(1, %s)",
                       [board.pk, problem.pk, code.pk, PREFIX + "%", users, runs // 2 // users])
        cursor.execute(RUNS_SQL, {"gpu": cpu.pk, "lb": board.pk})
        cursor.execute("ANALYZE")
    print(f"  built {runs:,} runs / {users:,} users in {time.perf_counter() - t0:.1f} s")
    return board


def percentiles(values: list[float]) -> str:
    values = sorted(values)
    p95 = values[min(len(values) - 1, int(len(values) * .95))]
    return f"p50 {statistics.median(values):8.1f} ms  p95 {p95:8.1f} ms  (n={len(values)})"


class Sampler:
    def __init__(self, board: Leaderboard, users: list[int]) -> None:
        self.board, self.gpu, self.users = board, board.gpu_types.get(), users
        self.code = Code.objects.get(sha256=Code.digest("bench"))
        self.client = Client()

    def entry_ratio(self, user_id: int) -> float | None:
        return BoardEntry.objects.filter(leaderboard=self.board, gpu_type=self.gpu, user_id=user_id).values_list(
            "rank_key", flat=True).first()

    def best(self) -> float:
        return BoardEntry.objects.filter(leaderboard=self.board, gpu_type=self.gpu).order_by("rank_key").values_list(
            "rank_key", flat=True).first()

    def result(self, ratio: float) -> dict:
        case = {"spec": "size: 1", "status": "pass", "mean": ratio * 1000, "time": ratio * 1000, "ratio": ratio,
                "ratio_low": ratio * 0.97, "ratio_high": ratio * 1.03, "reference": 1000.0, "runs": 20}
        return {"event": "result", "status": "ok", "verdict": "pass", "passed": True, "tests": [],
                "benchmarks": [case], "ranked": [case], "system": {}, "stdout": "", "stderr": "", "error": ""}

    def sample(self, ratio: float, user_id: int, hook: Callable[[Run], object] | None) -> float:
        """ms from the secret run's result to its board updated and the event sent."""
        sub = Submission.objects.create(user_id=user_id, leaderboard=self.board, problem_id=self.board.problem_id,
                                        file_name="s.py", code=self.code)
        public, secret = Run.objects.bulk_create([
            Run(submission=sub, gpu_type=self.gpu, secret=s, status=RunStatus.DISPATCHED, attempt=1)
            for s in (False, True)])
        actions.do_ingest_result(public.pk, 1, self.result(ratio))
        if hook is incremental:  # (a full rebuild here would change nothing the secret run's does not)
            hook(public)
        t0 = time.perf_counter()
        actions.do_ingest_result(secret.pk, 1, self.result(ratio))
        if hook is not None:
            hook(secret)
        return 1000 * (time.perf_counter() - t0)

    def first_view(self) -> float:
        t0 = time.perf_counter()
        assert self.client.get(f"/lb/{self.board.name}/").status_code == 200
        return 1000 * (time.perf_counter() - t0)


def full(run: Run) -> object:
    return actions.do_recompute_ranks(run.submission.leaderboard_id, run.gpu_type_id)


def incremental(run: Run) -> object:
    return ranks.do_rank_result(run.pk)


def measure(runs: int, users: int, samples: int, old_samples: int) -> None:
    print(f"\n== {runs:,} runs, {users:,} users ==")
    board = build(runs, users)
    gpu = board.gpu_types.get()
    t0 = time.perf_counter()
    actions.do_recompute_ranks(board.pk, gpu.pk)
    print(f"  full rebuild from scratch: {time.perf_counter() - t0:.1f} s")
    with connection.cursor() as cursor:  # statistics of the freshly written ranks and records (issue 15)
        cursor.execute("ANALYZE leaderboards_boardentry")
        cursor.execute("ANALYZE leaderboards_record")
    ids = list(get_user_model().objects.filter(username__startswith=PREFIX).values_list("pk", flat=True))
    sampler, rng = Sampler(board, ids), random.Random(7)
    assert sampler.best() is not None
    rows: dict[str, dict[str, list[float]]] = {}

    def scenario(label: str, ratio_for: Callable[[int], float]) -> None:
        for path, hook, n in (("full rebuild", full, old_samples), ("incremental", incremental, samples)):
            if not n:
                continue
            times, views = [], []
            for _ in range(n):
                user = rng.choice(ids)
                times.append(sampler.sample(ratio_for(user), user, hook))
                if path == "incremental":
                    views.append(sampler.first_view())
            rows.setdefault(label, {})[path] = times
            if views:
                rows[label]["first view"] = views

    scenario("random result (like the board's)", lambda user: 1 + 99 * rng.random())
    scenario("takes first place", lambda user: sampler.best() * 0.999)
    scenario("improves the user's entry by 1 %", lambda user: (sampler.entry_ratio(user) or 50) * 0.99)
    scenario("does not beat the user's entry", lambda user: (sampler.entry_ratio(user) or 50) * 1.5)
    # what the host costs without any rank work: the ingest alone, and a page view of an unchanged board
    rows["baseline"] = {"ingest only": [sampler.sample(1 + 99 * rng.random(), rng.choice(ids), None)
                                        for _ in range(samples)],
                        "page view": [sampler.first_view() for _ in range(samples)]}
    for label, paths in rows.items():
        print(f"  {label}")
        for path, times in paths.items():
            print(f"    {path:13s} {percentiles(times)}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--old-samples", type=int, default=5, help="full rebuilds per scenario (seconds each at 1 M)")
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        sys.exit("set DATABASE_URL to a PostgreSQL database")
    call_command("migrate", verbosity=0)
    actions.enqueue_on_commit = lambda *a, **k: None  # the bench runs the hooks itself, in line, timed
    print(f"channel layer: {settings.CHANNEL_LAYERS['default']['BACKEND']}")
    for runs in args.runs:
        measure(runs, args.users, args.samples, args.old_samples)


if __name__ == "__main__":
    main()
