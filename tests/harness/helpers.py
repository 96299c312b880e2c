"""Run the real harness (its trusted parent, forked from a warm template or a new `python -m runners.harness`, and its
real sandboxed child) on a fixture problem."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from runners.harness.warm import template

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"
SUBMISSIONS = FIXTURES / "submissions"
CHEATS = ROOT / "tests" / "cheats"
SECRET_SEED = 987654321987  # the cheats in tests/cheats look for this value

TESTS = [{"m": 16, "n": 16, "k": 16, "seed": 1}, {"m": 33, "n": 17, "k": 9, "seed": 2},
         {"m": 64, "n": 64, "k": 64, "seed": 3}]
BENCHMARKS = [{"m": 64, "n": 64, "k": 64, "seed": 11}, {"m": 128, "n": 128, "k": 128, "seed": 12}]
FAST_TIMING = {"rel_ci": 0.01, "min_samples": 10, "max_samples": 300, "case_budget_s": 0.5, "warmup_s": 0.05}


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


def run_harness(job: dict[str, Any] | str, timeout: float = 240, *, cold: bool = False) -> tuple[Line, list[Line]]:
    """(the result line, the progress lines). Asserts the output contract: JSON lines, one result, exit 0.
    The parent is forked from this test process's warm template as a node agent's is (`runners.harness.warm`);
    cold: a new `python -m runners.harness`, as a one-shot remote agent starts it."""
    stdin = job if isinstance(job, str) else json.dumps(job)
    if cold:
        proc = subprocess.run([sys.executable, "-m", "runners.harness"], input=stdin, capture_output=True, text=True,
                              cwd=ROOT, timeout=timeout)
        returncode, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    else:
        forked = template(sys.executable, str(ROOT)).spawn(dict(os.environ), str(ROOT))
        with ThreadPoolExecutor(2) as pool:
            out, err = pool.submit(forked.stdout.read), pool.submit(forked.stderr.read)
            forked.stdin.write(stdin.encode())
            forked.stdin.close()
            try:
                returncode = forked.wait(timeout)
            except subprocess.TimeoutExpired:
                forked.kill()
                raise
            stdout, stderr = out.result().decode(), err.result().decode()
        forked.stdout.close()
        forked.stderr.close()
    assert returncode == 0, stderr
    lines = [json.loads(line) for line in stdout.splitlines()]
    results = [line for line in lines if line["event"] == "result"]
    assert len(results) == 1 and lines[-1] is results[0], stdout[-2000:]
    return results[0], [line for line in lines if line["event"] == "progress"]


def run_submission(tmp_path: Path, submission: Path, mode: str = "test", problem: str = "matmul",
                   **overrides: Any) -> dict[str, Any]:
    return run_harness(job_for(make_workdir(tmp_path, submission, problem), mode, **overrides))[0]
