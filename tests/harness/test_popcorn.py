import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from runners.harness.popcorn import FLAG, PopcornError, parse_lines, verdict_from
from runners.harness.result import Result

from .helpers import BENCHMARKS, FIXTURES, SUBMISSIONS, TESTS, job_for, make_workdir, run_harness

REPORT = """garbage line
test-count: 2
test.0.spec: n: 1
test.0.status: pass
test.1.spec: n: 2
test.1.status: fail
test.1.error: mismatch at 3
unknown.key: ignored
benchmark-count: 1
benchmark.0.spec: n: 8
benchmark.0.runs: 10
benchmark.0.mean: 1000.5
benchmark.0.std: 10
benchmark.0.err: 3.2
benchmark.0.best: 990
benchmark.0.worst: 1020
check: fail
"""


def test_parse_and_verdict():
    fields = parse_lines(REPORT)
    assert "unknown.key" not in fields
    result = Result(mode="benchmark", protocol="popcorn")
    verdict_from(fields, result, 112, "")
    assert result.verdict == "fail" and result.error == "n: 2: mismatch at 3"
    assert [t.status for t in result.tests] == ["pass", "fail"]
    bench = result.benchmarks[0].as_dict()
    assert bench["runs"] == 10 and bench["mean"] == 1000.5 and bench["ci_low"] < 1000.5 < bench["ci_high"]


def test_duplicate_keys_are_forgery():
    with pytest.raises(PopcornError, match="duplicated"):
        parse_lines("check: pass\ncheck: fail\n")


@pytest.mark.parametrize(
    ("text", "rc", "verdict"),
    [("check: pass\n", 0, "pass"), ("check: pass\n", 3, "crash"), ("", 0, "crash"), ("check: maybe", 0, "crash"),
     ("x" * (2 << 20) + "\ncheck: pass\n", 0, "crash")],
)
def test_verdicts(text, rc, verdict):
    result = Result(mode="test", protocol="popcorn")
    verdict_from(parse_lines(text), result, rc, "")
    assert result.verdict == verdict


def popcorn_job(tmp_path, submission, mode):
    workdir = make_workdir(tmp_path, submission)
    (workdir / "eval.py").write_text((FIXTURES / "popcorn" / "eval.py").read_text())
    return job_for(workdir, mode, protocol="popcorn")


@pytest.mark.slow
@pytest.mark.parametrize(("submission", "mode", "verdict"), [
    ("fast.py", "test", "pass"), ("fast.py", "leaderboard", "pass"), ("wrong.py", "test", "fail"),
    ("popcorn_forger.py", "test", "hacked"), ("fast.py", "profile", "fail"),
])
def test_real_popcorn_runs(tmp_path, submission, mode, verdict):
    result, _ = run_harness(popcorn_job(tmp_path, SUBMISSIONS / submission, mode))
    assert result["verdict"] == verdict, result["error"]
    assert FLAG in result["flags"]
    if mode == "leaderboard":  # KernelBot's order: tests, benchmarks, then the ranked case (ranking by last)
        assert [len(result[k]) for k in ("tests", "benchmarks", "ranked")] == [len(TESTS), len(BENCHMARKS), 1]
        assert result["ranked"][0]["runs"] == 20 and result["ranked"][0]["spec"] == result["benchmarks"][-1]["spec"]


@pytest.mark.slow
def test_a_leaderboard_run_stops_at_the_first_failing_stage_and_reports_what_passed(tmp_path):
    result, progress = run_harness(popcorn_job(tmp_path, SUBMISSIONS / "wrong.py", "leaderboard"))
    assert result["verdict"] == "fail" and result["tests"] and not result["benchmarks"] and not result["ranked"]
    passed = sum(t["status"] == "pass" for t in result["tests"])
    assert progress[-1] == {"event": "progress", "phase": "test", "done": passed, "total": len(TESTS)}


@pytest.fixture
def short_tmp() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="kb-", dir="/tmp") as path:
        yield path


@pytest.mark.slow
@pytest.mark.parametrize(("submission", "verdict"), [("allreduce.py", "pass"), ("allreduce_wrong.py", "fail")])
def test_a_multi_process_task_rendezvous_on_the_sandboxs_loopback(short_tmp, submission, verdict):
    """Two ranks of torch.distributed (gloo) meet on localhost inside the sandbox's private network namespace, as a
    multi-GPU task's eval.py makes its ranks meet (NCCL bootstraps the same way). The workdir is the sandbox's TMPDIR,
    where multiprocessing binds its AF_UNIX sockets (108 bytes at most): a short one, as a node's, not pytest's deep
    per-worker tmp_path."""
    workdir = Path(short_tmp) / "work"
    shutil.copytree(FIXTURES / "distributed", workdir)
    shutil.copyfile(SUBMISSIONS / submission, workdir / "submission.py")
    job = job_for(workdir, "test", protocol="popcorn", multi_gpu=True,
                  tests=[{"size": 64, "world_size": 2, "seed": 1}, {"size": 1000, "world_size": 2, "seed": 2}])
    result, _ = run_harness(job)
    assert result["verdict"] == verdict, (result["error"], result["stderr"][-2000:])
    assert [t["status"] for t in result["tests"]] == [verdict] * 2
    if os.environ.get("CI") == "true":  # CI runs under KERNELBOT_SANDBOX=require: the private network namespace
        assert result["system"]["sandbox"]["network"] == "isolated"
