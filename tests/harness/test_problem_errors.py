"""A problem whose own code raises is the problem's fault: one result with status "error" and the flag
"problem-error" (the platform neither retries nor charges it), never a verdict against the submission."""

import shutil

import pytest

from runners.harness.result import PROBLEM_ERROR_FLAG

from .helpers import FIXTURES, SUBMISSIONS, job_for, make_workdir, run_harness

pytestmark = pytest.mark.slow


def broken(tmp_path, patch: str, submission: str = "fast.py"):
    workdir = make_workdir(tmp_path, SUBMISSIONS / submission)
    (workdir / "reference.py").write_text((FIXTURES / "matmul" / "reference.py").read_text() + patch)
    return workdir


@pytest.mark.parametrize(("where", "patch"), [
    ("generate_input", "\n_gen = generate_input\ndef generate_input(m, n, k, seed):\n"
                       "    if m == 33:\n        raise ValueError('bad case m=33')\n    return _gen(m, n, k, seed)\n"),
    ("ref_kernel", "\ndef ref_kernel(data):\n    raise KeyError('no reference today')\n"
                   "check_implementation = make_match_reference(ref_kernel)\n"),
    ("check_implementation", "\ndef check_implementation(data, output):\n    return output.nope\n"),
    ("importing reference.py", "\nraise ImportError('utils moved')\n"),
])
def test_problem_code_that_raises_is_a_problem_error(tmp_path, where, patch):
    result, _ = run_harness(job_for(broken(tmp_path, patch), "leaderboard"))
    assert (result["status"], result["passed"]) == ("error", False)
    assert PROBLEM_ERROR_FLAG in result["flags"]
    assert result["error"].startswith(f"the problem's own code failed: {where}: ")
    assert result["problem_error"]["where"] == where
    assert "Traceback" in result["problem_error"]["traceback"]


def test_a_checker_that_chokes_on_a_bad_output_blames_the_output(tmp_path):
    """The checker raises on this output but not on the reference's own: the submission failed, not the problem."""
    patch = ("\ndef check_implementation(data, output):\n    expected = ref_kernel(data)\n"
             "    if output.shape != expected.shape:\n        raise ValueError('shape mismatch')\n"
             "    return make_match_reference(ref_kernel)(data, output)\n")
    workdir = broken(tmp_path, patch, "wrong.py")
    shutil.copyfile(SUBMISSIONS / "wrong.py", workdir / "submission.py")
    (workdir / "submission.py").write_text("def custom_kernel(data):\n    a, b = data\n    return a[:, :1]\n")
    result, _ = run_harness(job_for(workdir, "test"))
    assert (result["status"], result["verdict"]) == ("ok", "fail")
    assert "the checker rejected the output: ValueError: shape mismatch" in result["error"]
    assert PROBLEM_ERROR_FLAG not in result["flags"]


@pytest.mark.parametrize(("patch", "said"), [
    ("\nimport os, sys\n_ref = ref_kernel\ndef ref_kernel(data):\n"
     "    if sys.argv[0].endswith('_harness_child.py'):\n        os._exit(3)\n    return _ref(data)\n",
     "its process ended"),
    ("\nimport sys\n_ref = ref_kernel\ndef ref_kernel(data):\n"
     "    if sys.argv[0].endswith('_harness_child.py'):\n        raise RuntimeError('only in its own process')\n"
     "    return _ref(data)\n", "only in its own process"),
])
def test_the_reference_failing_in_its_own_process_is_a_problem_error(tmp_path, patch, said):
    """The reference is timed in a child of its own (kernelbot.ReferenceSession): its crash or error there is the
    problem's, never a verdict against the submission, whose own child is well."""
    result, _ = run_harness(job_for(broken(tmp_path, patch), "benchmark"))
    assert (result["status"], result["passed"]) == ("error", False)
    assert PROBLEM_ERROR_FLAG in result["flags"]
    assert result["error"].startswith("the problem's own code failed: the reference") and said in result["error"]
