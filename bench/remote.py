"""Platform overhead of the remote runners: N ranked submissions through each remote backend, production layout.

    python bench/remote.py [-n 10] [--backends slurm,github,modal]

Runs the platform as docs/operations.md does: granian serving kernelbot.asgi (the runner API the remote agents
fetch jobs from and report to; GitHub's webhook) and `manage.py workers` (the supervisor: django-q2 workers, reaping
and remote polls). The services: the real single-node Slurm cluster of tests/slurm/cluster.py (root, Debian
slurm-wlm + munge), and the loopback fakes of GitHub (tests/fakes/github.py: runs our workflow's steps) and Modal
(tests/fakes/modal.py: runs our app module's function) with zero service-side delay. The demo vectoradd board is
served only by the backend under test; submissions go one at a time (each waits for its rank), two runs each.

Per run: platform overhead = queued → finished − harness_s − the service's own queueing (Slurm: slurmctld's
"submit_batch_job" → slurmd's "Launching batch job", from their millisecond logs; the fakes: 0). The rest is ours:
django-q pickup, the dispatch call and the remote side's bootstrap (harness download, agent start, job fetch), the
result post and its ingest. Worker-seconds: the django-q task time spent on a run (dispatch_run, poll_attempt), and
the part of it that overlaps the run's remote execution (started → finished), which must be 0. Uses DATABASE_URL /
REDIS_URL when set, else a temporary SQLite file and the ORM broker."""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import pickle
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
KEY = "bench-runner-key"
HOOK_SECRET = "bench-hook-secret"
LABELS = {"CPU": ["self-hosted", "cpu"]}
STAGES = [("overhead", "platform overhead"), ("queue", "  queued → dispatch task"),
          ("start", "  dispatch → job fetched by agent"), ("report", "  harness end → result ingested"),
          ("service", "service queueing (excluded)"), ("harness", "harness (excluded)"),
          ("worker", "worker-s per run"), ("held", "worker-s while remote runs")]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def slurm_log_times(log: Path, pattern: str) -> dict[str, float]:
    """Job id → epoch seconds of the last log line matching `pattern` (which captures the job id)."""
    times: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        match = re.match(r"\[(\S+?)\] .*" + pattern, line)
        if match:
            times[match.group(2)] = datetime.fromisoformat(match.group(1)).timestamp()
    return times


class Platform:
    """granian + `manage.py workers` as subprocesses sharing this process's database settings."""

    def __init__(self, env: dict[str, str]):
        self.env, self.procs = env, []

    def start(self, port: int) -> None:
        logs = Path(self.env["KERNELBOT_DATA_DIR"])
        for name, argv in (("web", [sys.executable, "-m", "granian", "--interface", "asginl", "--host", "127.0.0.1",
                                    "--port", str(port), "--workers", "1", "kernelbot.asgi:application"]),
                           ("workers", [sys.executable, "manage.py", "workers"])):
            out = open(logs / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
            self.procs.append((subprocess.Popen(argv, cwd=REPO, env=self.env, start_new_session=True, stdout=out,
                                                stderr=subprocess.STDOUT), out))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                return
            time.sleep(0.2)
        raise SystemExit(f"granian did not listen on {port}: see {logs / 'web.log'}")

    def stop(self) -> None:
        for proc, _ in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc, out in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            out.close()


def run_rows(runs, tasks, service: dict[int, float]) -> list[dict]:
    rows = []
    for run in runs:
        mine = [t for t in tasks if t["run"] == run.pk]
        running = run.started_at.timestamp(), run.finished_at.timestamp()
        held = sum(max(0.0, min(t["stopped"], running[1]) - max(t["started"], running[0])) for t in mine)
        harness = run.result["runner_timing"]["harness_s"]
        total = (run.finished_at - run.queued_at).total_seconds()
        queue = (run.dispatched_at - run.queued_at).total_seconds()
        wait = service.get(run.pk, 0.0)
        start = (run.started_at - run.dispatched_at).total_seconds()
        rows.append({"harness": harness, "service": wait, "overhead": total - harness - wait, "queue": queue,
                     "start": start - wait, "report": total - queue - start - harness,
                     "worker": sum(t["s"] for t in mine), "held": held})
    return rows


def q_tasks(since: datetime) -> list[dict]:
    from django_q.models import Task

    rows = []
    for task in Task.objects.filter(started__gte=since):
        args = pickle.loads(task.args) if isinstance(task.args, bytes) else task.args
        if task.func.endswith("dispatch_run"):
            run_id = args[0]
        elif task.func.endswith("poll_attempt"):
            from leaderboards.models import RunAttempt

            run_id = RunAttempt.objects.filter(pk=args[0]).values_list("run_id", flat=True).first()
        else:
            continue
        rows.append({"func": task.func, "run": run_id, "started": task.started.timestamp(),
                     "stopped": task.stopped.timestamp(), "s": (task.stopped - task.started).total_seconds()})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=10, help="ranked submissions per backend (two runs each)")
    parser.add_argument("--backends", default="slurm,github,modal")
    args = parser.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]

    data = Path(tempfile.mkdtemp(prefix="kernelbot-bench-remote-"))
    data.chmod(0o755)  # Slurm jobs run as this user but read their token files under it
    port = free_port()
    timing = {"KERNELBOT_REL_CI": "0.05", "KERNELBOT_CASE_BUDGET_S": "1", "KERNELBOT_MAX_SAMPLES": "200"}
    os.environ.update({"KERNELBOT_DATA_DIR": str(data), "DJANGO_SETTINGS_MODULE": "kernelbot.settings",
                       "KERNELBOT_RUNNER_KEY": KEY, "KERNELBOT_PUBLIC_URL": f"http://127.0.0.1:{port}",
                       "GITHUB_TOKEN": "gh-bench-token", "KB_GH_HOOK": HOOK_SECRET, "MODAL_TOKEN_ID": "ak-bench",
                       "MODAL_TOKEN_SECRET": "as-bench", **timing})
    os.environ.setdefault("KERNELBOT_SANDBOX", "auto")
    # production settings (DEBUG off), reached over plain HTTP on loopback as a TLS proxy's upstream would be
    for name, value in (("SECRET_KEY", "bench-secret"), ("ALLOWED_HOSTS", "127.0.0.1,localhost"),
                        ("SECURE_SSL_REDIRECT", "0")):
        os.environ.setdefault(name, value)
    import django

    django.setup()
    logging.disable(logging.INFO)  # the fakes' and the broker's request logs
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.urls import reverse
    from django.utils import timezone

    from leaderboards.actions import check_submission, do_submit
    from leaderboards.models import BoardEntry, Leaderboard, Run
    from runners.models import GpuPool, GpuType
    from tests.factories import remote_pool

    call_command("migrate", verbosity=0)
    call_command("load_demo", stdout=io.StringIO())
    board = Leaderboard.objects.get(name="vectoradd")
    directory = next(settings.PROBLEMS_DIR.rglob(f"{board.problem.name}/task.yml")).parent
    code = (directory / "solutions" / "fast.py").read_bytes()
    cpu = GpuType.objects.get(name="CPU")
    GpuPool.objects.update(enabled=False)  # the demo's local pool must not take the runs

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    results: dict[str, list[dict]] = {}
    with contextlib.ExitStack() as stack:
        env = dict(os.environ)
        if "slurm" in backends:
            from tests.slurm.cluster import DEFAULT_DIR, SlurmCluster

            cluster = SlurmCluster(DEFAULT_DIR).start()
            stack.callback(cluster.stop)
            env.update(cluster.env)
        if "github" in backends:
            from tests.fakes.github import FakeGithub

            github = FakeGithub(token=env["GITHUB_TOKEN"])
            stack.callback(github.close)
            github.add_repo("bench/gpu-runners")
            github.vars["KERNELBOT_PYTHON"] = sys.executable
            github.runner_labels.append({"self-hosted", "cpu"})
            github.env["KERNELBOT_SANDBOX"] = env["KERNELBOT_SANDBOX"]
        if "modal" in backends:
            from tests.fakes.modal import FakeModal

            modal = stack.enter_context(FakeModal(token_id="ak-bench", token_secret="as-bench"))
            modal.deploy("kernelbot", "run_cpu", "runners.modal_app:run_h100")
            env["MODAL_SERVER_URL"] = modal.url
        platform = Platform(env)
        stack.callback(platform.stop)
        platform.start(port)
        time.sleep(2)  # the workers' cluster forks its processes

        for backend in backends:
            if backend == "slurm":
                options = {"python": sys.executable, "workdir": str(data / "slurm-work"),
                           "key_file": str(data / "slurm-key.env"), "sandbox": env["KERNELBOT_SANDBOX"]}
            elif backend == "github":
                options = {"repository": "bench/gpu-runners", "api_url": github.api_url,
                           "webhook_secret_env": "KB_GH_HOOK", "runner_labels": LABELS}
            else:
                options = {"functions": {"CPU": "run_cpu"}}
            pool = remote_pool(backend, cpu, name=f"bench-{backend}", settings=options)
            if backend == "github":
                github.webhook = (f"http://127.0.0.1:{port}" + reverse("github-webhook", args=[pool.pk]), HOOK_SECRET)
            since = timezone.now()
            runs = []
            print(f"{backend}:", flush=True)
            for i in range(args.n):
                user, _ = get_user_model().objects.get_or_create(username=f"bench-{backend}-{i}")
                request = check_submission(user, board.name, ["CPU"], "leaderboard", "bench.py",
                                           code + f"\n# {backend} {i} {time.time()}\n".encode())
                submitted = time.monotonic()
                submission = do_submit(user, request)
                deadline = time.monotonic() + 600
                while not BoardEntry.objects.filter(submission=submission).exists():
                    done = [r for r in submission.runs.all() if r.is_terminal]
                    if len(done) == 2 and any(r.status != "succeeded" for r in done) or time.monotonic() > deadline:
                        bad = [(r.status, r.error[:300]) for r in submission.runs.all()]
                        raise SystemExit(f"{backend}: submission {submission.pk} was not ranked: {bad}")
                    time.sleep(0.02)
                runs += list(Run.objects.filter(submission=submission))
                print(f"  {i + 1:3d}/{args.n}: submit → ranked {time.monotonic() - submitted:6.2f} s", flush=True)
            pool.enabled = False
            pool.save(update_fields=["enabled"])
            time.sleep(1)  # the last tasks' rows are written after they return
            service: dict[int, float] = {}
            if backend == "slurm":
                submitted_at = slurm_log_times(cluster.root / "log" / "slurmctld.log",
                                               r"_slurm_rpc_submit_batch_job: JobId=(\d+)")
                launched = slurm_log_times(cluster.root / "log" / "slurmd.log", r"Launching batch job (\d+)")
                for run in runs:
                    job_id = run.attempts.get(number=run.attempt).external_id.split(":")[0]  # "job:token"
                    if job_id in submitted_at and job_id in launched:
                        service[run.pk] = max(0.0, launched[job_id] - submitted_at[job_id])
            results[backend] = run_rows(runs, q_tasks(since), service)

    db = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    broker = "redis" if settings.REDIS_URL else "orm"
    print(f"\n{args.n} ranked submissions per backend (2 runs each), granian + manage.py workers, database {db}, "
          f"broker {broker}; seconds per run")
    for backend, rows in results.items():
        print(f"\n{backend} ({len(rows)} runs){'':<14}{'p50':>8}{'p95':>8}{'mean':>8}")
        for key, label in STAGES:
            values = [row[key] for row in rows]
            print(f"{label:<34}{pct(values, 0.5):8.3f}{pct(values, 0.95):8.3f}{statistics.mean(values):8.3f}")
    print()
    for backend, rows in results.items():
        p50 = pct([row["overhead"] for row in rows], 0.5)
        held = max(row["held"] for row in rows)
        print(f"{backend}: overhead p50 ≤ 1 s {'met' if p50 <= 1 else 'NOT met'} ({p50:.3f} s); "
              f"worker-s held while remote runs, max {held:.3f} ({'met' if held == 0 else 'NOT met'})")


if __name__ == "__main__":
    main()
