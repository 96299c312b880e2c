"""Submit → first verdict on the CPU demo, this tree side by side with a baseline release, each as a newcomer runs
it: `manage.py serve` on the embedded defaults (SQLite, ORM broker, its node agent or, in older releases, the local
runner inside a worker), one test-mode submission of vectoradd at a time through `manage.py submit --wait`.

    python bench/e2e.py [-n 10] [--baseline REF] [--mode test|leaderboard]

REF (a commit, e.g. the last release) is checked out with `git worktree` into a temporary directory and measured in
the same run, alternating submissions, so the machine's drift hits both.
Figures come from the database of each platform: a run's `queued_at` (the submit) to its `finished_at` (its verdict
committed), the first run of each submission; one warm-up submission per platform is not counted.
Next to them, this tree's `kernelbot run` of the same code against its platform (test mode, what a competitor waits
for from the command to its verdict, task and harness from the cache; the first run, which downloads them, is
reported apart).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CODE = REPO / "problems" / "demo" / "vectoradd_py" / "solutions" / "correct.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Platform:
    """`manage.py serve` of one tree on its own data directory and port."""

    def __init__(self, tree: Path, name: str):
        self.tree, self.name = tree, name
        self.data = Path(tempfile.mkdtemp(prefix=f"kernelbot-e2e-{name}-"))
        self.env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")} | {
            "DEBUG": "1", "KERNELBOT_DATA_DIR": str(self.data), "KERNELBOT_QUOTA_TEST": "0",
            "KERNELBOT_POOL_CHECK_INTERVAL": "0", "KERNELBOT_SPREAD_REFRESH_DAYS": "0"}
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log = (self.data / "serve.log").open("w")
        self.process = subprocess.Popen([sys.executable, "manage.py", "serve", "--port", str(port)], cwd=tree,
                                        env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            time.sleep(0.5)
        raise RuntimeError(f"{name} did not start: see {self.data / 'serve.log'}")

    def submit(self, mode: str, tag: str) -> float:
        """One submission, waited for; seconds from its first run's submit to its verdict."""
        source = self.data / f"{tag}.py"
        source.write_text(CODE.read_text() + f"\n# {tag}\n")
        done = subprocess.run([sys.executable, "manage.py", "submit", "--user", "bench", "--create-user",
                               "--leaderboard", "vectoradd", "--gpu", "CPU", "--mode", mode, "--wait", str(source)],
                              cwd=self.tree, env=self.env, capture_output=True, text=True, timeout=600)
        if "succeeded" not in done.stdout:
            raise RuntimeError(f"{self.name}: {done.stdout[-2000:]}{done.stderr[-2000:]}")
        with sqlite3.connect(self.data / "kernelbot.sqlite3") as db:
            queued, finished = db.execute(
                "SELECT r.queued_at, r.finished_at FROM leaderboards_run r JOIN leaderboards_submission s ON "
                "r.submission_id = s.id JOIN auth_user u ON s.user_id = u.id WHERE u.username = 'bench' "
                "ORDER BY r.id DESC LIMIT 1").fetchone()
        return (datetime.fromisoformat(finished) - datetime.fromisoformat(queued)).total_seconds()

    def local_run(self, tag: str) -> tuple[float, float]:
        """`kernelbot run` of the code against this platform: seconds from the command to its verdict, and of those
        the harness's (its parent and sandboxed child starting cold, then the cases)."""
        source = self.data / f"local-{tag}.py"
        source.write_text(CODE.read_text() + f"\n# {tag}\n")
        env = {**self.env, "KERNELBOT_URL": self.url, "KERNELBOT_CONFIG": str(self.data / "cli.json"),
               "XDG_CACHE_HOME": str(self.data / "cache")}
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "kernelbot.cli.main", "run", str(source), "-l", "vectoradd",
                               "--mode", "test", "--json"], cwd=self.tree, env=env, capture_output=True, text=True,
                              timeout=600)
        elapsed = time.perf_counter() - started
        if done.returncode != 0 or "verdict: pass" not in done.stderr:
            raise RuntimeError(f"{self.name} kernelbot run: {done.stdout[-2000:]}{done.stderr[-2000:]}")
        return elapsed, json.loads(done.stdout.splitlines()[-1])["runner_timing"]["harness_s"]

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=10)
    parser.add_argument("--baseline", default="", help="a commit to measure side by side (git worktree)")
    parser.add_argument("--mode", default="test", choices=["test", "leaderboard"])
    args = parser.parse_args()
    trees = {"this tree": REPO}
    worktree = None
    if args.baseline:
        worktree = Path(tempfile.mkdtemp(prefix="kernelbot-baseline-")) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(worktree), args.baseline], cwd=REPO, check=True,
                       capture_output=True)
        trees = {f"baseline {args.baseline}": worktree, **trees}
    platforms = {}
    try:
        for name, tree in trees.items():
            platforms[name] = Platform(tree, name.split()[0])
            platforms[name].submit(args.mode, "warm-up")
        first_local, _ = platforms["this tree"].local_run("first")  # downloads the task and the harness
        times: dict[str, list[float]] = {name: [] for name in platforms}
        local: list[float] = []
        harness: list[float] = []
        for i in range(args.n):  # alternating, so drift hits both
            for name, platform in platforms.items():
                times[name].append(platform.submit(args.mode, f"k{i}"))
            total, inside = platforms["this tree"].local_run(f"k{i}")
            local.append(total)
            harness.append(inside)
        print(f"submit → first {args.mode} verdict, {args.n} submissions each, seconds")
        print(f"{'platform':<30} {'p50':>7} {'p95':>7} {'mean':>7}")
        for name, values in times.items():
            print(f"{name:<30} {pct(values, 0.5):7.2f} {pct(values, 0.95):7.2f} {statistics.mean(values):7.2f}")
        if len(times) == 2:
            base, this = (pct(v, 0.5) for v in times.values())
            print(f"ratio this / baseline (p50): {this / base:.2f}")
        print(f"{'kernelbot run (this tree, test)':<30} {pct(local, 0.5):7.2f} {pct(local, 0.95):7.2f} "
              f"{statistics.mean(local):7.2f}   command → local verdict, task and harness cached")
        print(f"{'  of which the harness':<30} {pct(harness, 0.5):7.2f} {pct(harness, 0.95):7.2f} "
              f"{statistics.mean(harness):7.2f}   (cold parent and child: torch imported twice)")
        print(f"the first kernelbot run, downloading the task and the harness: {first_local:.2f} s")
    finally:
        for platform in platforms.values():
            platform.stop()
        if worktree is not None:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=REPO, capture_output=True)


if __name__ == "__main__":
    main()
