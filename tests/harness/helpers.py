"""Run the real harness (`python -m runners.harness`, real sandboxed subprocesses) on a fixture problem."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"
SUBMISSIONS = FIXTURES / "submissions"
CHEATS = ROOT / "tests" / "cheats"
SECRET_SEED = 987654321987  # the cheats in tests/cheats look for this value

TESTS = [{"m": 16, "n": 16, "k": 16, "seed": 1}, {"m": 33, "n": 17, "k": 9, "seed": 2},
         {"m": 64, "n": 64, "k": 64, "seed": 3}]
BENCHMARKS = [{"m": 64, "n": 64, "k": 64, "seed": 11}, {"m": 128, "n": 128, "k": 128, "seed": 12}]
FAST_TIMING = {"rel_ci": 0.01, "min_samples": 10, "max_samples": 300, "case_budget_s": 1.0, "warmup_s": 0.05}


def make_workdir(tmp_path: Path, submission: Path, problem: str = "matmul") -> Path:
    workdir = tmp_path / "work"
    shutil.copytree(FIXTURES / problem, workdir)
    shutil.copyfile(submission, workdir / "submission.py")
    return workdir


def job_for(workdir: Path, mode: str = "test", **overrides: Any) -> dict[str, Any]:
    return {
        "mode": mode, "workdir": str(workdir), "seed": SECRET_SEED, "tests": TESTS, "benchmarks": BENCHMARKS,
        "timing": FAST_TIMING, "timeouts": {"test": 30, "benchmark": 60, "ranked": 60}, **overrides,
    }


Line = dict[str, Any]


def run_harness(job: dict[str, Any] | str, timeout: float = 240) -> tuple[Line, list[Line]]:
    """(the result line, the progress lines). Asserts the output contract: JSON lines, one result, exit 0."""
    stdin = job if isinstance(job, str) else json.dumps(job)
    argv = [sys.executable, "-m", "runners.harness"]
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    results = [line for line in lines if line["event"] == "result"]
    assert len(results) == 1 and lines[-1] is results[0], proc.stdout[-2000:]
    return results[0], [line for line in lines if line["event"] == "progress"]


def run_submission(tmp_path: Path, submission: Path, mode: str = "test", problem: str = "matmul",
                   **overrides: Any) -> dict[str, Any]:
    return run_harness(job_for(make_workdir(tmp_path, submission, problem), mode, **overrides))[0]
