"""The between-run spread is measured per (problem, GPU type) by A/A runs and widens that pair's intervals
(leaderboards/spread.py); until measured, the default applies and says it is provisional."""

import math
import statistics
from datetime import timedelta

import pytest
from django.core.management import call_command

from leaderboards.errors import SubmissionRejected
from leaderboards.models import Problem, Run, RunSpread, RunStatus
from leaderboards.spread import AA_HOOK, MIN_SAMPLES, do_measure_due_spreads, do_measure_spread, do_record_spread
from leaderboards.tasks import check_pools
from runners.harness.job import parse_job
from runners.jobs import harness_job, job_payload
from runners.models import Gpu, Node

from ..factories import LeaderboardFactory, submission

pytestmark = pytest.mark.django_db


def finish(runs, ratios, passed=True) -> None:
    for run, ratio in zip(runs, ratios, strict=True):
        Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED, passed=passed, ratio=ratio)
    do_record_spread(runs[-1].pk)


def test_an_interval_uses_the_spread_measured_on_its_gpu_type_and_the_organisers_wins(leaderboard, tmp_path,
                                                                                       settings):
    run = submission(leaderboard).runs.get(secret=False)
    gpu = Gpu.objects.get()
    assert parse_job(harness_job(run, tmp_path, [], gpu)).timing.run_spread == settings.HARNESS_TIMING["run_spread"]
    RunSpread.objects.create(problem=leaderboard.problem, gpu_type=run.gpu_type, spread=0.043, samples=10)
    assert parse_job(harness_job(run, tmp_path, [], gpu)).timing.run_spread == 0.043
    assert job_payload(run, None)["job"]["timing"]["run_spread"] == 0.043  # remote runners too
    other = LeaderboardFactory(problem=leaderboard.problem, gpu_types=[run.gpu_type], run_spread=0.2)
    assert job_payload(submission(other).runs.first(), None)["job"]["timing"]["run_spread"] == 0.2


def test_a_measurement_times_the_reference_as_a_submission_and_replaces_the_figure(leaderboard):
    gpu_type = leaderboard.gpu_types.get()
    runs = do_measure_spread(leaderboard.problem, gpu_type, 6)
    assert len(runs) == 6 and {r.on_finish for r in runs} == {AA_HOOK} and {r.secret for r in runs} == {False, True}
    aa = runs[0].submission
    assert aa.leaderboard.internal and aa.mode == "leaderboard"
    assert aa.code.text.startswith(leaderboard.problem.definition["files"]["reference.py"])
    assert aa.code.text.endswith("custom_kernel = ref_kernel\n")
    assert {r.node.hostname for r in runs} == {"localhost"}  # pinned to the nodes serving the type
    with pytest.raises(SubmissionRejected, match="being measured") as refused:
        do_measure_spread(leaderboard.problem, gpu_type, 6)
    assert refused.value.status == 409

    ratios = [0.97, 1.02, 1.0, 1.05, 0.99, 0.98]
    finish(runs[:5], ratios[:5])
    assert RunSpread.objects.get().spread is None  # one run still queued: nothing recorded yet
    finish(runs[5:], ratios[5:])
    record = RunSpread.objects.get()
    about_one = math.sqrt(sum(math.log(r) ** 2 for r in ratios) / 5)  # their sd about 1.00x, not about their mean
    assert record.spread == pytest.approx(1.96 * about_one, abs=1e-4)
    assert record.spread >= 1.96 * statistics.stdev(math.log(r) for r in ratios)
    assert (record.samples, record.pending_since, record.warning) == (6, None, "")
    assert record.nodes["localhost"]["runs"] == 6

    again = do_measure_spread(leaderboard.problem, gpu_type, 4)  # measured again: replaces the figure
    finish(again, [1.0, 1.2, 0.8, 1.1])
    record.refresh_from_db()
    assert record.samples == 4 and record.spread > 0.2

    biased = do_measure_spread(leaderboard.problem, gpu_type, 4)  # identical code steadily timed 5 % fast
    finish(biased, [0.95, 0.951, 0.949, 0.95])
    record.refresh_from_db()
    assert record.spread >= 1.96 * abs(math.log(0.95))  # wide enough to cover 1, though their own sd is ~0.001


def test_too_few_passed_runs_keep_the_figure_and_say_so(leaderboard):
    gpu_type = leaderboard.gpu_types.get()
    RunSpread.objects.create(problem=leaderboard.problem, gpu_type=gpu_type, spread=0.05, samples=8)
    runs = do_measure_spread(leaderboard.problem, gpu_type, MIN_SAMPLES)
    finish(runs, [1.0] * len(runs), passed=False)
    record = RunSpread.objects.get()
    assert (record.spread, record.samples, record.pending_since) == (0.05, 8, None)
    assert f"kept 0 of {len(runs)} runs" in record.warning


def test_a_node_far_off_the_others_is_flagged(leaderboard, cpu_pool):
    gpu_type = leaderboard.gpu_types.get()
    for name in ("node-b", "node-c"):
        Gpu.objects.create(node=Node.objects.create(pool=cpu_pool, hostname=name), gpu_type=gpu_type, index=0)
    runs = do_measure_spread(leaderboard.problem, gpu_type, 12)
    by_host = {"localhost": [1.0, 1.01, 0.99, 1.0], "node-b": [1.0, 0.99, 1.01, 1.0], "node-c": [1.3, 1.32, 1.29, 1.31]}
    finish(runs, [by_host[r.node.hostname].pop() for r in runs])
    record = RunSpread.objects.get()
    assert record.warning.startswith("node-c: A/A 1.30") and "localhost" not in record.warning
    assert {host: n["runs"] for host, n in record.nodes.items()} == {"localhost": 4, "node-b": 4, "node-c": 4}


def test_a_problem_without_a_python_reference_is_refused(leaderboard):
    problem = leaderboard.problem
    problem.definition = {**problem.definition, "files": {"eval.py": "..."}}
    problem.save()
    with pytest.raises(SubmissionRejected, match="no Python reference.py"):
        do_measure_spread(problem, leaderboard.gpu_types.get())


def test_the_command_measures_unmeasured_pairs_within_its_budget(leaderboard, cpu_pool):
    other = LeaderboardFactory(problem=leaderboard.problem, gpu_types=[cpu_pool.cpu])  # same pair: measured once
    call_command("measure_spread", "--runs", "4", "--budget", "4", verbosity=0)
    assert Run.objects.filter(on_finish=AA_HOOK).count() == 4
    RunSpread.objects.update(pending_since=None, spread=0.05)
    call_command("measure_spread", leaderboard.name, other.name, "--runs", "4", verbosity=0)  # measured: skipped
    assert Run.objects.filter(on_finish=AA_HOOK).count() == 4
    call_command("measure_spread", leaderboard.name, "--runs", "4", "--again", verbosity=0)
    assert Run.objects.filter(on_finish=AA_HOOK).count() == 8


def test_the_workers_measure_an_unmeasured_pair_when_no_competitor_waits_and_again_when_stale(
        leaderboard, cpu_pool, settings):
    settings.SPREAD_REFRESH_DAYS, settings.SPREAD_RUNS = 0, 4
    assert check_pools() == 0 and not Run.objects.filter(on_finish=AA_HOOK).exists()  # 0: only when asked

    settings.SPREAD_REFRESH_DAYS = 30
    problem = leaderboard.problem  # a problem of its own evaluator (no Python reference) first: skipped, not in the way
    unmeasurable = Problem.objects.create(name="aaa", version=1, content_hash="x", lang=problem.lang,
                                          definition={**problem.definition, "files": {"eval.py": "..."}})
    LeaderboardFactory(problem=unmeasurable, gpu_types=[cpu_pool.cpu])
    waiting = submission(leaderboard)  # a competitor's runs wait for the type: no measurement yet
    assert do_measure_due_spreads() == 0
    Run.objects.filter(submission=waiting).update(status=RunStatus.SUCCEEDED)
    check_pools()  # the workers' minute tick
    runs = list(Run.objects.filter(on_finish=AA_HOOK))
    assert len(runs) == 4 and {r.submission.problem_id for r in runs} == {leaderboard.problem_id}
    assert do_measure_due_spreads() == 0  # under way: not twice

    finish(runs, [1.0, 1.02, 0.98, 1.01])
    record = RunSpread.objects.get()
    assert record.spread is not None and do_measure_due_spreads() == 0  # measured: not due for 30 days
    RunSpread.objects.update(measured_at=record.measured_at - timedelta(days=31))
    Run.objects.filter(on_finish=AA_HOOK).update(first_queued_at=record.measured_at - timedelta(days=31))
    assert do_measure_due_spreads() == 4  # stale: measured again

    finish(list(Run.objects.filter(on_finish=AA_HOOK, status=RunStatus.QUEUED)), [1.0] * 4, passed=False)
    assert RunSpread.objects.get().pending_since is None and "kept 0 of 4" in RunSpread.objects.get().warning
    assert do_measure_due_spreads() == 0  # a failed try is not repeated every minute: due again in 30 days


def test_the_board_and_the_admin_say_whether_the_spread_is_provisional(leaderboard, client, admin_client):
    page = client.get(f"/lb/{leaderboard.name}/").content.decode()
    assert "<strong>provisional</strong>" in page and "±12.0 %" in page
    assert "(provisional)" in admin_client.get(f"/admin/leaderboards/leaderboard/{leaderboard.pk}/change/") \
        .content.decode()

    runs = do_measure_spread(leaderboard.problem, leaderboard.gpu_types.get(), 4)
    assert "provisional (not measured)" in admin_client.get("/admin/leaderboards/runspread/").content.decode()
    finish(runs, [1.0, 1.02, 0.98, 1.01])
    spread = RunSpread.objects.get().spread
    page = client.get(f"/lb/{leaderboard.name}/").content.decode()
    assert "provisional" not in page and "measured from 4 A/A runs" in page and f"±{spread * 100:.1f} %" in page
    listing = admin_client.get("/admin/leaderboards/runspread/").content.decode()
    assert f"±{spread:.1%}" in listing and "(measured)" in admin_client.get(
        f"/admin/leaderboards/leaderboard/{leaderboard.pk}/change/").content.decode()
