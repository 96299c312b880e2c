"""A leaderboard run's wall time on a CPU demo problem with the node agent's spares, this tree beside another commit's
harness (issue 49: the reference's own child started ahead by the spare, as the submission's is). Both harnesses
come from git (`runners/` of each commit), so uncommitted edits in the checkout play no part.

    python bench/reference_spare.py [--baseline 3e29d18] [--commit HEAD] [--problem softmax_py] [--reps 3]

Each rep runs the problem's reference as a submission, in leaderboard mode, through `run_harness` with a spare made
for the run and given `--idle` seconds to start (as a node agent's spare, made when the slot's previous run ended,
usually has), once with each harness, in alternating order. Prints each run's wall time (the runner's `harness_s`:
job written to result read) and its `reference_start` phase.
"""

from __future__ import annotations

import argparse
import io
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from runners.harness.runner import Spares, run_harness, write_workdir  # noqa: E402
from taskspec.jobspec import DEFAULT_LIMITS, task_job, workdir_files  # noqa: E402
from taskspec.loader import load_task  # noqa: E402


def export(commit: str, root: Path) -> Path:
    """The commit's `runners/` (the harness and what it imports) in a directory of its own."""
    archive = subprocess.run(["git", "archive", commit, "runners"], cwd=REPO, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(root, filter="data")
    return root


def once(pythonpath: Path, job: dict, files: dict[str, str], idle: float, workroot: Path) -> dict:
    spares = Spares(sys.executable, str(pythonpath), workroot)
    try:
        spares.prepare((), job)
        time.sleep(idle)  # the spare's parent and children start meanwhile, as between two runs on a node
        spare = spares.take(())
        assert spare is not None, "no spare was made"
        write_workdir(spare.workdir, files)
        result, failure = run_harness({**job, "workdir": str(spare.workdir)}, python=sys.executable,
                                      pythonpath=str(pythonpath), timeout=600, on_progress=lambda event: None,
                                      still_wanted=lambda: True, check_interval=5, proc=spare.proc)
        assert result is not None and result.get("passed"), failure or result.get("error")
        return result
    finally:
        spares.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default="3e29d18", help="the commit whose harness is compared")
    parser.add_argument("--commit", default="HEAD", help="the commit measured against it")
    parser.add_argument("--problem", default="softmax_py", help="a directory of problems/demo")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--budget", type=float, default=1.0, help="seconds per timed case")
    parser.add_argument("--idle", type=float, default=8.0, help="seconds a spare has before its run")
    args = parser.parse_args()

    task = load_task(REPO / "problems" / "demo" / args.problem).to_json()
    code = task["files"]["reference.py"] + "\n\ncustom_kernel = ref_kernel\n"
    timing = {"rel_ci": 0.01, "min_samples": 10, "max_samples": 1000, "case_budget_s": args.budget,
              "warmup_s": 0.2, "run_spread": 0.12}
    job = task_job(task, mode="leaderboard", protocol="kernelbot", ranking_by=task.get("ranking_by") or "last",
                   seed=1234, limits=dict(DEFAULT_LIMITS), timing=timing)
    files = workdir_files(task, code)
    with tempfile.TemporaryDirectory() as tmp:
        trees = {f"baseline {args.baseline}": export(args.baseline, Path(tmp) / "baseline"),
                 f"this {args.commit}": export(args.commit, Path(tmp) / "this")}
        walls: dict[str, list[float]] = {name: [] for name in trees}
        starts: dict[str, list[float]] = {name: [] for name in trees}
        for rep in range(args.reps):
            for name in (list(trees) if rep % 2 == 0 else list(trees)[::-1]):
                workroot = Path(tmp) / f"runs-{rep}-{len(walls[name])}-{name.split()[0]}"
                workroot.mkdir()
                result = once(trees[name], job, files, args.idle, workroot)
                walls[name].append(result["runner_timing"]["harness_s"])
                starts[name].append(result["seconds"].get("reference_start", 0.0))
                print(f"rep {rep + 1} {name}: {walls[name][-1]:.2f} s (reference start "
                      f"{starts[name][-1]:.2f} s, {result.get('reference_start', 'cold')})", flush=True)
    print(f"\n{args.problem}, leaderboard mode, {args.reps} reps, case budget {args.budget} s")
    print("| harness | wall time median (s) | min–max | reference start median (s) |\n| --- | --- | --- | --- |")
    for name in trees:
        print(f"| {name} | {statistics.median(walls[name]):.2f} | {min(walls[name]):.2f}–{max(walls[name]):.2f} | "
              f"{statistics.median(starts[name]):.2f} |")


if __name__ == "__main__":
    main()
