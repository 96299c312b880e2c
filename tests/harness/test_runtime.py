"""What the harness's environment offers problems: numpy, and a clear answer when a problem needs CUDA."""

import shutil

import pytest
import torch

from runners.harness.__main__ import NEEDS_CUDA

from .helpers import CHEATS, FIXTURES, SUBMISSIONS, job_for, make_workdir, run_harness

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(torch.cuda.is_available(), reason="asserts what a runner without CUDA answers"),
]


def cuda_problem(tmp_path, submission=SUBMISSIONS / "fast.py"):
    """The matmul fixture as reference-kernels' GPU problems write it: inputs generated on the CUDA device."""
    workdir = make_workdir(tmp_path, submission)
    reference = workdir / "reference.py"
    text = reference.read_text()
    assert "torch.Generator()" in text
    reference.write_text(text.replace("torch.Generator()", 'torch.Generator(device="cuda")').replace(
        "generator=gen)", 'generator=gen, device="cuda")'))
    return workdir


@pytest.mark.parametrize("mode", ["test", "leaderboard"])
def test_problem_needing_cuda_says_so(tmp_path, mode):
    result, _ = run_harness(job_for(cuda_problem(tmp_path), mode))
    assert (result["status"], result["error"], result["flags"]) == ("error", NEEDS_CUDA, ["needs-cuda"])
    assert "CUDA" in result["cause"] and result["tests"] == []


def test_problem_needing_cuda_says_so_under_popcorn(tmp_path):
    workdir = cuda_problem(tmp_path)
    shutil.copyfile(FIXTURES / "popcorn" / "eval.py", workdir / "eval.py")
    result, _ = run_harness(job_for(workdir, "test", protocol="popcorn", main="eval.py"))
    assert (result["status"], result["error"], result["flags"]) == ("error", NEEDS_CUDA, ["needs-cuda"])


def test_submission_asking_for_cuda_is_its_own_failure(tmp_path):
    """Only the problem's own (trusted) code can make a run the runner's fault."""
    submission = tmp_path / "to_cuda.py"
    submission.write_text("def custom_kernel(data):\n    a, b = data\n    return (a @ b).cuda()\n")
    result, _ = run_harness(job_for(make_workdir(tmp_path, submission), "test"))
    assert (result["status"], result["verdict"]) == ("ok", "fail") and "custom_kernel raised" in result["error"]
    assert result["error"] != NEEDS_CUDA and "needs-cuda" not in result["flags"]


def test_reference_kernels_idiom_with_numpy(tmp_path):
    """The matmul_out fixture seeds numpy as reference-kernels' utils do and hands the kernel (a, b, out)."""
    workdir = make_workdir(tmp_path, CHEATS / "preallocated_out.py", "matmul_out")
    result, _ = run_harness(job_for(workdir, "test"))
    assert (result["status"], result["verdict"]) == ("ok", "pass"), result["error"]
    assert [t["status"] for t in result["tests"]] == ["pass"] * 3
