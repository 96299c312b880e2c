"""The platform side of `lang: cu` tasks: import, the harness job, and a submission through the queue, the
local backend and the real harness (real nvcc, real sandbox; the fixture task is host-only)."""

from __future__ import annotations

import pytest

from leaderboards.actions import check_submission, do_submit
from leaderboards.importing import ImportRejected, store_problem
from leaderboards.models import BoardEntry, RunStatus
from runners.harness.job import parse_job
from runners.jobs import CUDA_COMPILE_TIMEOUT, harness_job, total_timeout, workdir_files
from runners.models import Gpu, GpuType
from taskspec.loader import load_task

from ..factories import LeaderboardFactory, UserFactory, submission
from .helpers import FIXTURES

pytestmark = [pytest.mark.django_db, pytest.mark.slow]
TASK = FIXTURES / "cuda_host"
GOOD = (TASK / "submissions" / "good.cu").read_text()


@pytest.fixture
def cu_board(cpu_pool):
    problem, _ = store_problem(load_task(TASK))
    return LeaderboardFactory(problem=problem, gpu_types=[cpu_pool.cpu])


def test_a_cu_task_imports_as_its_own_evaluator():
    task = load_task(TASK)
    assert store_problem(task)[0].harness == "popcorn"
    with pytest.raises(ImportRejected, match="runs its own eval.cu"):
        store_problem(task, harness="kernelbot")


def test_the_job_carries_the_task_files_and_config_as_declared(cu_board, tmp_path):
    h100 = GpuType.objects.create(name="H100", architecture="sm_90a")
    cu_board.gpu_types.add(h100)
    (run,) = submission(cu_board, code=GOOD, mode="test", gpu_type=h100).runs.all()
    files = workdir_files(run)
    assert files == {"eval.cu": (TASK / "eval.cu").read_text(), "task.h": (TASK / "task.h").read_text(),
                     "submission.cu": GOOD}
    job = harness_job(run, tmp_path, ["0"], Gpu.objects.get())
    assert (job["lang"], job["protocol"], job["timeouts"]["compile"]) == ("cu", "popcorn", CUDA_COMPILE_TIMEOUT)
    assert job["cuda"] == {"sources": ["eval.cu", "submission.cu"], "headers": ["task.h"], "include_dirs": [],
                           "defines": {"SCALE": 3}, "compile_flags": ["-DFROM_COMPILE_FLAGS=1"], "arch": "90a"}
    assert parse_job(job).cuda.defines == {"SCALE": "3"}
    assert total_timeout(run) == 60 + CUDA_COMPILE_TIMEOUT + 60


def test_cpu_gpu_type_compiles_for_the_native_arch(cu_board, tmp_path):
    (run,) = submission(cu_board, code=GOOD, mode="test").runs.all()
    assert harness_job(run, tmp_path, [], Gpu.objects.get())["cuda"]["arch"] == ""


def submit(board, code: str, mode: str, capture):
    user = UserFactory()
    request = check_submission(user, board.name, ["CPU"], mode, "submission.cu", code.encode())
    with capture(execute=True):
        sub = do_submit(user, request)
    return list(sub.runs.order_by("secret"))


def test_a_cu_submission_is_compiled_run_scored_and_ranked(cu_board, sync_queue, settings,
                                                           django_capture_on_commit_callbacks):
    runs = submit(cu_board, GOOD, "leaderboard", django_capture_on_commit_callbacks)
    assert [run.status for run in runs] == [RunStatus.SUCCEEDED] * 2, [(r.verdict, r.error) for r in runs]
    for run in runs:
        assert run.passed and run.score > 0 and run.result["protocol"] == "popcorn"
        assert len(run.result["tests"]) == 2 and len(run.result["ranked"]) == 1
        assert "files: _popcorn_cases.txt eval.out" in run.stdout
    assert BoardEntry.objects.with_rank().get(leaderboard=cu_board).rank == 1
    assert not [p for p in settings.RUNS_DIR.iterdir() if p.name.startswith("run-")]


def test_a_cu_submission_that_does_not_compile_fails_with_nvccs_message(cu_board, sync_queue,
                                                                       django_capture_on_commit_callbacks):
    broken = (TASK / "submissions" / "syntax_error.cu").read_text()
    (run,) = submit(cu_board, broken, "test", django_capture_on_commit_callbacks)
    assert (run.status, run.verdict, run.passed) == (RunStatus.FAILED, "compile_error", False)
    assert 'submission.cu(5): error: expected a ";"' in run.error
    assert not BoardEntry.objects.exists()
