"""The job contract is defined once: the platform builds jobs and the harness parses them from the same names and
defaults (runners/harness/contract.py)."""

import dataclasses

import pytest

from leaderboards.models import RankingRule, SubmissionMode
from runners.harness import contract
from runners.harness.job import Timing, parse_job
from runners.harness.sandbox import Limits
from runners.jobs import gpu_count, harness_job, job_payload, total_timeout
from runners.models import Gpu

from ..factories import submission


def test_the_platforms_choices_are_the_contracts():
    assert tuple(RankingRule.values) == contract.RANKING_RULES
    assert set(SubmissionMode.values) == set(contract.MODES) == set(contract.MODE_PHASES)


def test_one_set_of_defaults():
    limits = Limits()
    assert {k: getattr(limits, k) for k in contract.DEFAULT_LIMITS} == contract.DEFAULT_LIMITS
    assert limits.memory_bytes == 16 << 30
    assert dataclasses.asdict(Timing()) == contract.TIMING_DEFAULTS


@pytest.mark.django_db
def test_a_built_job_parses_with_the_platforms_values(leaderboard, tmp_path, settings):
    run = submission(leaderboard, mode="leaderboard").runs.get(secret=True)
    job = harness_job(run, tmp_path, [], Gpu.objects.get())
    assert set(job) <= set(contract.FIELDS)
    parsed = parse_job(job)
    assert parsed.sandbox_limits().memory_bytes == contract.DEFAULT_LIMITS["memory_bytes"]
    assert dataclasses.asdict(parsed.timing) == settings.HARNESS_TIMING
    definition = run.submission.problem.definition
    phases = definition["test_timeout"] + definition["benchmark_timeout"] + definition["ranked_timeout"]
    assert total_timeout(run) == phases + contract.TOTAL_MARGIN_S

    payload = job_payload(run, None)
    assert not set(payload["job"]) & set(contract.RUNNER_FIELDS)
    assert payload["job"]["seed"] == job["seed"] and payload["files"]["submission.py"] == run.submission.code.text
    assert (payload["gpu_count"], gpu_count(run)) == (0, 0)  # a CPU type needs no device


@pytest.mark.django_db
def test_a_boards_own_between_run_spread_reaches_the_harness(leaderboard, tmp_path, settings):
    run = submission(leaderboard, mode="leaderboard").runs.get(secret=True)
    gpu = Gpu.objects.get()
    assert parse_job(harness_job(run, tmp_path, [], gpu)).timing.run_spread == settings.HARNESS_TIMING["run_spread"]
    leaderboard.run_spread = 0.2
    leaderboard.save()
    run.submission.leaderboard.refresh_from_db()
    timing = parse_job(harness_job(run, tmp_path, [], gpu)).timing
    assert timing.run_spread == 0.2
    default = settings.HARNESS_TIMING["run_spread"]
    assert {**dataclasses.asdict(timing), "run_spread": default} == settings.HARNESS_TIMING  # the rest as before
    assert job_payload(run, None)["job"]["timing"]["run_spread"] == 0.2  # remote runners too
