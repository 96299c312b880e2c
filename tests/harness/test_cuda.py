"""`lang: cu` tasks run as KernelBot runs them: nvcc (in the sandbox) builds eval.cu + submission.cu into one
program, the sources are deleted, and the program reports on POPCORN_FD. Real nvcc, real sandbox; the fixture
task is host-only, so it runs end to end without a GPU."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from runners.harness.cuda import nvcc_argv
from runners.harness.job import JobError, parse_job
from runners.harness.popcorn import FLAG

from .helpers import FIXTURES, ROOT, job_for, run_harness

pytestmark = pytest.mark.slow
TASK = FIXTURES / "cuda_host"
CONFIG = {"sources": ["eval.cu", "submission.cu"], "headers": ["task.h"], "include_dirs": [],
          "defines": {"SCALE": "3"}, "compile_flags": ["-DFROM_COMPILE_FLAGS=1"]}
CASES = {"tests": [{"size": 8, "seed": 1}, {"size": 100, "seed": 2}],
         "benchmarks": [{"size": 1000, "seed": 3}, {"size": 5000, "seed": 4}]}
TIMEOUTS = {"compile": 300, "test": 60, "benchmark": 60, "ranked": 60}


def cuda_job(tmp_path: Path, submission: str | Path, mode: str = "test", **overrides) -> dict:
    workdir = tmp_path / "work"
    workdir.mkdir()
    shutil.copyfile(TASK / "eval.cu", workdir / "eval.cu")
    shutil.copyfile(TASK / "task.h", workdir / "task.h")
    source = submission if isinstance(submission, Path) else TASK / "submissions" / submission
    shutil.copyfile(source, workdir / "submission.cu")
    return job_for(workdir, mode, lang="cu", cuda=CONFIG, timeouts=TIMEOUTS, **CASES, **overrides)


def test_leaderboard_run_compiles_deletes_the_sources_and_runs_every_stage(tmp_path):
    job = cuda_job(tmp_path, "good.cu", "leaderboard", nonce="n-1")
    result, progress = run_harness(job, timeout=600)
    assert (result["status"], result["verdict"], result["passed"]) == ("ok", "pass", True), result["error"]
    assert result["protocol"] == "popcorn" and FLAG in result["flags"] and result["nonce"] == "n-1"
    assert [t["spec"] for t in result["tests"]] == ["size: 8; seed: 1", "size: 100; seed: 2"]
    assert [b["spec"] for b in result["benchmarks"]] == ["size: 1000; seed: 3", "size: 5000; seed: 4"]
    (ranked,) = result["ranked"]  # ranking_by last: the last benchmark only, as KernelBot writes it
    assert ranked["spec"] == "size: 5000; seed: 4" and ranked["runs"] == 50
    assert 0 < ranked["best"] <= ranked["mean"] <= ranked["worst"] and ranked["ci_low"] < ranked["mean"]
    assert [p["phase"] for p in progress if p["done"] == 0] == ["test", "benchmark", "ranked"]
    # the program ran without any source or header next to it, with the task's defines and flags
    assert result["stdout"].count("files: _popcorn_cases.txt eval.out\n") == 3
    assert "defines: SCALE=3 FROM_COMPILE_FLAGS=1" in result["stdout"]
    assert sorted(p.name for p in Path(job["workdir"]).iterdir()) == ["_popcorn_cases.txt", "eval.out"]
    command = result["compile"]["command"]
    assert command.startswith("nvcc --std=c++20 ") and "-O3" in command and "--expt-relaxed-constexpr" in command
    assert command.endswith("-DFROM_COMPILE_FLAGS=1 -DSCALE=3 eval.cu submission.cu -arch=native -o eval.out")
    assert result["compile"]["exit_code"] == 0 and "release" in result["compile"]["version"]


def test_wrong_answer_fails_with_the_evaluators_message(tmp_path):
    result, _ = run_harness(cuda_job(tmp_path, "wrong.cu", "test"), timeout=600)
    assert (result["status"], result["verdict"]) == ("ok", "fail")
    assert result["error"] == "size: 8; seed: 1: mismatch at 0"
    assert [t["status"] for t in result["tests"]] == ["fail", "fail"]


def test_syntax_error_is_a_compile_error_with_nvccs_message(tmp_path):
    job = cuda_job(tmp_path, "syntax_error.cu", "leaderboard")
    result, progress = run_harness(job, timeout=600)
    assert (result["status"], result["verdict"], result["passed"]) == ("ok", "compile_error", False)
    assert result["error"].startswith("compilation failed (exit code 2): nvcc --std=c++20")
    assert 'submission.cu(5): error: expected a ";"' in result["error"]
    assert result["compile"]["exit_code"] == 2 and result["tests"] == result["ranked"] == [] and not progress
    assert not list(Path(job["workdir"]).glob("*.[ch]*"))  # sources and headers deleted even after a failure


def test_the_compile_cannot_read_host_files(tmp_path):
    settings = ROOT / "kernelbot" / "settings.py"  # readable here, outside the sandbox's view
    assert "SECRET_KEY" in settings.read_text()
    hostile = tmp_path / "hostile.cu"
    hostile.write_text(f'#include "{settings}"\n' + (TASK / "submissions" / "good.cu").read_text())
    result, _ = run_harness(cuda_job(tmp_path, hostile, "test"), timeout=600)
    assert result["verdict"] == "compile_error" and "settings.py: No such file or directory" in result["error"]
    assert "SECRET_KEY" not in result["error"] + result["stderr"] + result["stdout"]


def test_a_compile_reading_dev_zero_is_stopped_by_the_memory_limit(tmp_path):
    hostile = tmp_path / "hostile.cu"
    hostile.write_text('#include "/dev/zero"\n')
    result, _ = run_harness(cuda_job(tmp_path, hostile, "test", limits={"memory_bytes": 2 << 30}), timeout=600)
    assert result["verdict"] == "compile_error" and result["compile"]["exit_code"] != 0
    assert "out of memory" in result["error"] or "killed" in result["error"]


def test_cuda_calls_without_a_gpu_end_with_a_clear_runner_error(tmp_path):
    result, _ = run_harness(cuda_job(tmp_path, "gpu_call.cu", "test", gpus=[]), timeout=600)
    assert (result["status"], result["passed"]) == ("error", False)
    assert result["error"].startswith("this problem needs a CUDA GPU; this runner has none")
    assert "needs-cuda" in result["flags"]
    assert "CUDA error" in result["error"]  # the runtime's own words, after the explanation


def test_missing_nvcc_is_a_runner_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-such-dir"))
    for name in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(name, raising=False)
    result, _ = run_harness(cuda_job(tmp_path, "good.cu", "test"))
    assert (result["status"], result["passed"]) == ("error", False)
    assert result["error"].startswith("nvcc (the CUDA compiler) was not found on this runner")


def test_profile_mode_is_refused_clearly(tmp_path):
    result, _ = run_harness(cuda_job(tmp_path, "good.cu", "profile"))
    assert result["verdict"] == "fail" and "profiling is not available for CUDA" in result["error"]


def test_arch_comes_from_the_job_and_defaults_to_native(tmp_path):
    job = parse_job({"mode": "test", "workdir": str(tmp_path), "cuda": {**CONFIG, "arch": "90a"}})
    assert nvcc_argv("/opt/cuda/bin/nvcc", job)[-4:] == [
        "submission.cu", "-gencode=arch=compute_90a,code=sm_90a", "-o", "eval.out"]
    job = parse_job({"mode": "test", "workdir": str(tmp_path), "cuda": {**CONFIG, "defines": {"FAST": None}}})
    assert "-DFAST" in nvcc_argv("nvcc", job) and "-arch=native" in nvcc_argv("nvcc", job)


@pytest.mark.parametrize(("cuda", "message"), [
    ({"sources": ["../eval.cu"]}, "paths inside the workdir"),
    ({"sources": ["eval.cu"], "headers": ["/etc/passwd"]}, "paths inside the workdir"),
    ({"sources": ["eval.cu"], "compile_flags": ["O3"]}, "must start with a dash"),
    ({"sources": ["eval.cu"], "defines": {"A B": "1"}}, "identifiers"),
    ({"sources": ["eval.cu"], "arch": "sm_90; rm"}, "cuda.arch"),
    ({"sources": "eval.cu"}, "list of strings"),
])
def test_malformed_cuda_config_is_an_invalid_job(tmp_path, cuda, message):
    with pytest.raises(JobError, match=message):
        parse_job({"mode": "test", "workdir": str(tmp_path), "cuda": cuda})
    result, _ = run_harness({"mode": "test", "workdir": str(tmp_path), "lang": "cu", "cuda": cuda})
    assert result["status"] == "error" and "invalid job" in result["error"] and message.split()[0] in result["error"]
