"""Case values reach the problem as they do under KernelBot: its eval.py reads one `f"{k}: {v}"` line per
case (joined by "; "), and parses integers as int and `[a, b]` as a tuple of ints, keeping other text."""

import pytest

from runners.harness.problem import case_args, format_spec

from .helpers import FIXTURES, job_for, make_workdir, run_harness

CASES = [{"m": [128, 256], "nomask": True, "dtype": "fp16", "size": 7, "seed": 1},
         {"m": [96], "nomask": False, "dtype": "fp16", "size": "12", "seed": 2}]
# What KernelBot writes for these cases (Python's str of each YAML value).
LINES = ["m: [128, 256]; nomask: True; dtype: fp16; size: 7; seed: 1",
         "m: [96]; nomask: False; dtype: fp16; size: 12; seed: 2"]


def test_lines_are_written_as_kernelbot_writes_them():
    assert [format_spec(case) for case in CASES] == LINES


@pytest.mark.parametrize(("value", "received"), [
    (7, 7), ("12", 12), ("-3", -3), ("fp16", "fp16"), ("1.5", "1.5"), (True, "True"), (False, "False"),
    ([128, 256], (128, 256)), ([], ()), ([True], "[True]"), (["a", 1], "['a', 1]"),
])
def test_generate_input_receives_what_eval_py_parses(value, received):
    got = case_args({"v": value})["v"]
    assert got == received and type(got) is type(received)


@pytest.mark.slow
def test_trusted_harness_passes_booleans_and_lists(tmp_path):
    workdir = make_workdir(tmp_path, FIXTURES / "submissions" / "fast.py", problem="casevalues")
    (workdir / "submission.py").write_text("def custom_kernel(data):\n    return data + 1\n")
    result, _ = run_harness(job_for(workdir, "test", tests=CASES, benchmarks=CASES[:1]))
    assert result["verdict"] == "pass", result["error"]
    assert [case["spec"] for case in result["tests"]] == LINES


@pytest.mark.slow
def test_popcorn_eval_py_reads_the_kernelbot_lines(tmp_path):
    workdir = make_workdir(tmp_path, FIXTURES / "submissions" / "fast.py", problem="casevalues")
    result, _ = run_harness(job_for(workdir, "test", protocol="popcorn", main="eval.py", tests=CASES))
    assert result["verdict"] == "pass", result["error"]
    assert [case["spec"] for case in result["tests"]] == LINES
