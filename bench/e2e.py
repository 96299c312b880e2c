"""End-to-end latency: N ranked submissions through a real django-q2 cluster and the local runner.

    python bench/e2e.py [-n 20] [--problem vectoradd] [--solution fast]

Uses DATABASE_URL / REDIS_URL when set, else a fresh SQLite file and the ORM broker in a temp dir.
Submissions go one at a time (each waits for its rank), so figures show pipeline overhead, not backlog.
Prints p50/p95 of submit → ranked, split into queue wait, dispatch, harness and ingest."""

from __future__ import annotations

import argparse
import io
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def split(runs, e2e: float) -> dict[str, float]:
    """Seconds per stage, summed over a submission's runs. The runs share one device, so the secret run
    waits for the public one: that wait is `device`, not dispatch overhead."""
    runs = sorted(runs, key=lambda r: r.started_at)
    harness = sum(r.result["runner_timing"]["harness_s"] for r in runs)
    row = {"e2e": e2e, "harness": harness, "overhead": e2e - harness, "queue": 0.0, "device": 0.0,
           "dispatch": 0.0, "ingest": 0.0}
    for k, r in enumerate(runs):
        free = max(r.dispatched_at, runs[k - 1].finished_at) if k else r.dispatched_at
        row["queue"] += (r.dispatched_at - r.queued_at).total_seconds()
        row["device"] += max(0.0, (free - r.dispatched_at).total_seconds())
        row["dispatch"] += (r.started_at - free).total_seconds()
        row["ingest"] += (r.finished_at - r.started_at).total_seconds() - r.result["runner_timing"]["harness_s"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=20)
    parser.add_argument("--problem", default="vectoradd")
    parser.add_argument("--solution", default="fast")
    args = parser.parse_args()

    os.environ.setdefault("KERNELBOT_DATA_DIR", tempfile.mkdtemp(prefix="kernelbot-bench-"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kernelbot.settings")
    os.environ.setdefault("Q_WORKERS", "2")
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from leaderboards.actions import check_submission, do_submit
    from leaderboards.models import BoardEntry, Leaderboard, Run

    Path(settings.DATA_DIR).mkdir(parents=True, exist_ok=True)
    call_command("migrate", verbosity=0)
    call_command("load_demo", stdout=io.StringIO())
    leaderboard = Leaderboard.objects.get(name=args.problem)
    directory = next(settings.PROBLEMS_DIR.rglob(f"{leaderboard.problem.name}/task.yml")).parent
    code = (directory / "solutions" / f"{args.solution}.py").read_bytes()

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # run the finally below: never orphan the cluster
    cluster = subprocess.Popen([sys.executable, "manage.py", "qcluster"], cwd=REPO, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    try:
        time.sleep(2)  # let the cluster's workers start before the first submission
        for i in range(args.n):
            # one user per submission: a board keeps each user's best entry only
            user, _ = get_user_model().objects.get_or_create(username=f"bench-{i}")
            request = check_submission(user, leaderboard.name, ["CPU"], "leaderboard", "bench.py",
                                       code + f"\n# {i} {time.time()}\n".encode())
            submitted = time.monotonic()
            submission = do_submit(user, request)
            while not BoardEntry.objects.filter(submission=submission).exists():
                if all(run.is_terminal for run in submission.runs.all()) and \
                        not BoardEntry.objects.filter(submission=submission).exists():
                    time.sleep(0.2)
                    if not BoardEntry.objects.filter(submission=submission).exists():
                        bad = [(r.status, r.error[:200]) for r in submission.runs.all()]
                        raise SystemExit(f"submission {submission.pk} was not ranked: {bad}")
                time.sleep(0.02)
            row = split(list(Run.objects.filter(submission=submission)), time.monotonic() - submitted)
            rows.append(row)
            print(f"  {i + 1:3d}/{args.n}: submit→ranked {row['e2e']:6.2f} s, harness {row['harness']:6.2f} s, "
                  f"overhead {row['overhead']:5.2f} s", flush=True)
    finally:
        os.killpg(cluster.pid, signal.SIGTERM)
        try:
            cluster.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(cluster.pid, signal.SIGKILL)

    db = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    broker = "redis" if settings.REDIS_URL else "orm"
    print(f"\n{args.n} ranked submissions of {args.problem}/{args.solution} (2 runs each: public + secret), "
          f"database {db}, broker {broker}")
    print(f"{'seconds':<26}{'p50':>8}{'p95':>8}{'mean':>8}")
    for key, label in [("e2e", "submit → ranked"), ("queue", "  queue wait (both runs)"),
                       ("device", "  device busy (2nd run)"), ("dispatch", "  dispatch (both runs)"),
                       ("harness", "  harness (both runs)"),
                       ("ingest", "  ingest (both runs)"), ("overhead", "overhead (all but harness)")]:
        values = [row[key] for row in rows]
        print(f"{label:<26}{pct(values, 0.5):8.3f}{pct(values, 0.95):8.3f}{statistics.mean(values):8.3f}")
    p50 = pct([row["overhead"] for row in rows], 0.5)
    print(f"\ntarget p50 overhead ≤ 1 s: {'met' if p50 <= 1 else 'NOT met'} ({p50:.3f} s)")


if __name__ == "__main__":
    main()
