"""What a Slurm pool costs the platform: the worker-seconds of each backend call against the real single-node cluster.

    python bench/slurm.py [-n 20] [--ssh]

Starts the cluster of tests/slurm/cluster.py (root, Debian slurm-wlm + munge) and submits N jobs one at a time
through SlurmBackend, each running a stand-in agent that exits at once (the real agent's and harness's time is the
service's, not the platform's). Prints p50/p95 of the dispatch call (sbatch, key file refresh included), of one
poll (exit marker, then squeue while the job has none), of cancel (scancel), and of Slurm's own submit → job ended
time. --ssh: the calls go over SSH to a loopback sshd standing for the login node (tests/slurm/sshd.py; a fresh
connection per call, no ControlMaster). A worker holds nothing between calls: a run costs one dispatch plus the
polls of its quiet spells (one per KERNELBOT_POLL_AFTER seconds without a progress post), plus one cancel when
cancelled."""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
AGENT = """import argparse, json, pathlib
p = argparse.ArgumentParser()
for name in ("--platform", "--run", "--attempt", "--workdir", "--result-file"):
    p.add_argument(name)
pathlib.Path(p.parse_args().result_file).write_text(json.dumps({"verdict": "pass"}))
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def timed(fn, *args):
    start = time.perf_counter()
    value = fn(*args)
    return value, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=20)
    parser.add_argument("--ssh", action="store_true", help="reach the cluster over SSH")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kernelbot.settings")
    os.environ.setdefault("DEBUG", "1")  # no database or secret is used: the backend calls only
    import django

    django.setup()
    from django.conf import settings

    from runners.backends.slurm import SlurmBackend
    from runners.models import GpuPool
    from tests.slurm.cluster import DEFAULT_DIR, SlurmCluster
    from tests.slurm.sshd import login_node

    root = Path(tempfile.mkdtemp(prefix="kernelbot-bench-slurm-"))
    (root / "runners" / "harness").mkdir(parents=True)
    for init in ("runners/__init__.py", "runners/harness/__init__.py"):
        (root / init).write_text("")
    (root / "runners" / "harness" / "agent.py").write_text(AGENT)
    cluster = SlurmCluster(DEFAULT_DIR).start()
    settings.RUNNER_KEY = "bench-key"
    with contextlib.ExitStack() as stack:
        stack.callback(cluster.stop)
        ssh = {}
        if args.ssh:
            (root / "sshd").mkdir()
            ssh = {"ssh": "kernelbot-login", "ssh_config": str(stack.enter_context(login_node(root / "sshd",
                                                                                               cluster.env)))}
        else:
            os.environ.update(cluster.env)
        pool = GpuPool(name="bench", backend="slurm", settings={
            "checkout": str(root), "python": sys.executable, "workdir": str(root / "work"),
            "key_file": str(root / "runner.env"), "sandbox": "auto", "gres": {"H100": "gpu:fake"}, **ssh})
        stats = run_jobs(SlurmBackend(pool), args.n)
    print(f"{args.n} jobs, one at a time, on {cluster.node} (single-node Slurm, {os.cpu_count()} cores)"
          + (", over SSH" if args.ssh else ", submit host"))
    print("| call | n | p50 s | p95 s | mean s |\n| --- | --- | --- | --- | --- |")
    for name, values in stats.items():
        if values:
            print(f"| {name} | {len(values)} | {pct(values, 0.5):.3f} | {pct(values, 0.95):.3f} | "
                  f"{statistics.fmean(values):.3f} |")


def run_jobs(backend, n: int) -> dict[str, list[float]]:
    from runners.backends.base import Dispatch, RemoteState
    from runners.models import GpuType, GpuVendor

    gpu = GpuType(name="H100", vendor=GpuVendor.NVIDIA)
    stats: dict[str, list[float]] = {"dispatch": [], "poll (queued/running)": [], "poll (finished)": [],
                                     "cancel": [], "Slurm: submit → marker seen": []}
    for i in range(n):
        job = Dispatch(run_id=i, attempt=1, nonce=os.urandom(16).hex(), platform_url="http://127.0.0.1:9",
                       gpu_type=gpu, gpu_count=1, timeout_s=60, label=f"bench {i}")
        external_id, took = timed(backend.dispatch, job, None)
        stats["dispatch"].append(took)
        submitted = time.perf_counter()
        while True:
            poll, took = timed(backend.poll, external_id)
            if poll.state == RemoteState.FINISHED:
                stats["poll (finished)"].append(took)
                stats["Slurm: submit → marker seen"].append(time.perf_counter() - submitted)
                break
            if poll.state not in (RemoteState.QUEUED, RemoteState.RUNNING):
                raise SystemExit(f"job {external_id}: {poll}")
            stats["poll (queued/running)"].append(took)
            time.sleep(0.05)
        _, took = timed(backend.cancel, external_id)
        stats["cancel"].append(took)
    return stats

if __name__ == "__main__":
    main()
