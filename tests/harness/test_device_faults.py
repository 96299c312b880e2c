"""An out-of-memory error is blamed on whoever caused it (issue 34): the device's fault while other processes hold
its memory (an infrastructure failure the platform retries, the holders named), else the problem's (its own code
asked) or the submission's (with what was asked, free and total). The errors are those torch's CUDA allocator
raises, injected on CPU; the device's holders come from a stand-in nvidia-smi on PATH."""

import os
import stat

import pytest

from runners.harness import device
from runners.harness.result import PROBLEM_ERROR_FLAG

from .helpers import FIXTURES, SUBMISSIONS, job_for, make_workdir, run_harness

OOM = ("torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of "
       "79.19 GiB of which 1.50 GiB is free. Of the allocated memory 2.1 GiB is allocated by PyTorch')")
GENERATE_OOM = f"\ndef generate_input(m, n, k, seed):\n    import torch\n    raise {OOM}\n"
KERNEL_OOM = f"import torch\n\n\ndef custom_kernel(data):\n    raise {OOM}\n"
IMPORT_OOM = f"import torch\n\nraise {OOM}\n"


@pytest.fixture
def holder(tmp_path, monkeypatch):
    """nvidia-smi that reports one device and, on it, this test's own process holding 70,000 MiB (another user's
    training job, as far as the run is concerned: not the run's parent or any of its descendants)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"""#!/bin/sh
case "$1" in
  --query-gpu=*) echo "0, 00000000:01:00.0" ;;
  --query-compute-apps=*) echo "{os.getpid()}, 70000, 00000000:01:00.0" ;;
esac
""")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return os.getpid()


def test_torchs_message_gives_the_figures():
    said = device.figures("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.19 GiB "
                          "of which 1.50 GiB is free. Including non-PyTorch memory, this process has 2 GiB")
    assert (said.asked, said.free, said.total) == (20 << 30, int(1.5 * (1 << 30)), int(79.19 * (1 << 30)))
    assert said.describe() == "asked 20,480 MiB, free 1,536 MiB, total 81,091 MiB"
    assert device.is_oom("torch.OutOfMemoryError: CUDA out of memory.") and not device.is_oom("ValueError: bad m")


def test_holders_leave_out_the_run_itself(holder):
    found = device.holders([], own=1)  # as a run's parent sees another process's memory
    assert [(h.pid, h.memory >> 20, h.device) for h in found] == [(holder, 70000, "0")]
    assert device.holders([]) == device.holders([], own=os.getppid()) == []  # this process and its descendants
    assert device.holders(["1"], own=1) == []  # another device


def workdir_with(tmp_path, submission: str | None = None, reference_patch: str = ""):
    workdir = make_workdir(tmp_path, SUBMISSIONS / "fast.py")
    if submission is not None:
        (workdir / "submission.py").write_text(submission)
    (workdir / "reference.py").write_text((FIXTURES / "matmul" / "reference.py").read_text() + reference_patch)
    return workdir


@pytest.mark.slow
@pytest.mark.parametrize("submission", [KERNEL_OOM, IMPORT_OOM], ids=["kernel", "import"])
def test_the_submissions_oom_on_a_full_device_is_the_devices_fault(tmp_path, holder, submission):
    result, _ = run_harness(job_for(workdir_with(tmp_path, submission), "test"))
    assert (result["status"], result["passed"]) == ("error", False)
    assert device.DEVICE_BUSY_FLAG in result["flags"] and PROBLEM_ERROR_FLAG not in result["flags"]
    assert result["device_holders"] == [{"pid": holder, "user": "root" if os.geteuid() == 0 else result[
        "device_holders"][0]["user"], "memory_mib": 70000, "device": "0"}]
    assert result["error"].startswith("the device ran out of memory while other processes held 70,000 MiB of it: "
                                      f"pid {holder} (")


@pytest.mark.slow
@pytest.mark.parametrize(("submission", "prefix"), [
    (KERNEL_OOM, "custom_kernel raised"), (IMPORT_OOM, "the submission could not be imported")])
def test_the_submissions_oom_on_an_empty_device_is_its_own_fail(tmp_path, submission, prefix):
    result, _ = run_harness(job_for(workdir_with(tmp_path, submission), "test"))
    assert (result["status"], result["verdict"]) == ("ok", "fail")
    assert result["error"].startswith(f"{prefix} (out of device memory; asked 20,480 MiB, free 1,536 MiB, total "
                                      "81,091 MiB; no other process used it): ")


@pytest.mark.slow
def test_the_problems_oom_on_a_full_device_is_the_devices_fault(tmp_path, holder):
    result, _ = run_harness(job_for(workdir_with(tmp_path, reference_patch=GENERATE_OOM), "test"))
    assert result["status"] == "error" and device.DEVICE_BUSY_FLAG in result["flags"]
    assert PROBLEM_ERROR_FLAG not in result["flags"] and result["device_holders"][0]["pid"] == holder


@pytest.mark.slow
def test_the_problems_oom_on_an_empty_device_is_a_problem_error(tmp_path):
    result, _ = run_harness(job_for(workdir_with(tmp_path, reference_patch=GENERATE_OOM), "test"))
    assert result["status"] == "error" and PROBLEM_ERROR_FLAG in result["flags"]
    assert result["error"].startswith("the problem's own code failed: generate_input: OutOfMemoryError: ")
    assert result["error"].endswith("(out of memory on a device no other process used: asked 20,480 MiB, free "
                                    "1,536 MiB, total 81,091 MiB)")


@pytest.mark.slow
def test_an_oom_under_the_popcorn_protocol_on_a_full_device_is_the_devices_fault(tmp_path, holder):
    workdir = workdir_with(tmp_path, KERNEL_OOM)
    (workdir / "eval.py").write_text((FIXTURES / "popcorn" / "eval.py").read_text())
    result, _ = run_harness(job_for(workdir, "test", protocol="popcorn"))
    assert result["status"] == "error" and device.DEVICE_BUSY_FLAG in result["flags"]
    assert result["device_holders"][0]["pid"] == holder


@pytest.mark.slow
def test_an_oom_under_the_popcorn_protocol_on_an_empty_device_stays_the_submissions(tmp_path):
    workdir = workdir_with(tmp_path, KERNEL_OOM)
    (workdir / "eval.py").write_text((FIXTURES / "popcorn" / "eval.py").read_text())
    result, _ = run_harness(job_for(workdir, "test", protocol="popcorn"))
    assert result["status"] == "ok" and result["verdict"] in ("crash", "fail")
    assert device.DEVICE_BUSY_FLAG not in result["flags"]
