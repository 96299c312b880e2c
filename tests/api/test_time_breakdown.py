"""Issue 41: where a run's seconds went is shown, not only stored: /api/v1 and popcorn's submission detail carry each
run's `dispatched_at` and its seconds by phase, and the submission page shows them in one line. The harness's phases
follow the run's timings' visibility (a secret run shows its owner queue and dispatch only)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from leaderboards import lifecycle
from leaderboards.access.actions import do_create_token
from leaderboards.models import Run
from leaderboards.serializers import phase_seconds

from ..factories import UserFactory, ranked_result, submission
from ..leaderboards.test_lifecycle import dispatch
from .conftest import Popcorn
from .test_privacy import bearer

HARNESS = {"parent_start": 0.25, "child_start": 0.5, "device_context": 0.5, "problem_load": 0.2, "child_ready": 0.5,
           "calibrate": 0.1, "submission_import": 0.05, "tests": 1.0, "reference_start": 1.5, "benchmark": 2.0,
           "ranked": 3.0, "teardown": 0.1}
HARNESS_PHASES = {"harness_start": 1.25, "device_context": 0.5, "problem": 0.3, "import": 0.05, "tests": 1.0,
                  "reference": 1.5, "benchmarks": 2.0, "ranked": 3.0, "teardown": 0.1}


@pytest.fixture
def finished(leaderboard):
    sub = submission(leaderboard, user=UserFactory())
    queued = timezone.now() - timedelta(minutes=5)
    for run in sub.runs.all():
        assert lifecycle.do_ingest_result(run.pk, dispatch(run), {**ranked_result([1000.0]), "seconds": HARNESS})
        Run.objects.filter(pk=run.pk).update(queued_at=queued, dispatched_at=queued + timedelta(seconds=2),
                                             started_at=queued + timedelta(seconds=2.5))
    return sub


@pytest.mark.django_db
def test_api_v1_gives_each_run_its_dispatch_time_and_seconds_by_phase(client, finished):
    body = client.get(f"/api/v1/submissions/{finished.pk}", headers=bearer(finished.user))
    assert body.status_code == 200
    runs = {r["secret"]: r for r in body.json()["runs"]}
    public, secret = runs[False], runs[True]
    assert public["dispatched_at"] and secret["dispatched_at"]
    assert public["seconds"] == {"queue": 2.0, "dispatch": 0.5, **HARNESS_PHASES}
    assert list(public["seconds"]) == ["queue", "dispatch", "harness_start", "device_context", "problem", "import",
                                       "tests", "reference", "benchmarks", "ranked", "teardown"]
    assert secret["seconds"] == {"queue": 2.0, "dispatch": 0.5}  # its timings are staff's


@pytest.mark.django_db
def test_popcorn_submission_detail_carries_the_same(client, finished):
    popcorn = Popcorn(client, do_create_token(finished.user)[1])
    detail = json.loads(popcorn.get(f"user/submissions/{finished.pk}").content)
    public = next(r for r in detail["runs"] if not r["secret"])
    assert public["dispatched_at"].endswith("Z") or "+" in public["dispatched_at"]
    assert public["seconds"] == {"queue": 2.0, "dispatch": 0.5, **HARNESS_PHASES}


@pytest.mark.django_db
def test_the_submission_page_shows_the_breakdown_in_one_line(client, finished):
    client.force_login(finished.user)
    page = client.get(f"/s/{finished.pk}/").content.decode()
    assert ("Where the time went: queued 2.0 s · dispatch 0.5 s · harness start 1.2 s · device context 0.5 s · "
            "problem setup 0.3 s · import 50 ms · tests 1.0 s · reference start 1.5 s · benchmarks 2.0 s · "
            "ranked 3.0 s · teardown 0.1 s"
            ) in page
    assert "Where the time went: queued 2.0 s · dispatch 0.5 s</p>" in page  # the secret run's


@pytest.mark.django_db
def test_queue_is_the_wait_for_a_device_and_dispatch_ends_when_the_agent_has_the_job(cpu_pool, leaderboard):
    """Issue 49: a run handed to a local pool at submit time that waits a minute for a free device shows that minute
    as its queue, not as dispatch."""
    run = submission(leaderboard, mode="test").runs.get()
    lifecycle.dispatch_run(run.pk)
    waited = timezone.now() - timedelta(minutes=1)
    Run.objects.filter(pk=run.pk).update(queued_at=waited, dispatched_at=waited + timedelta(milliseconds=50))
    [claim] = lifecycle.do_claim_runs(cpu_pool.nodes.get(), [0])  # a device is chosen now
    run.refresh_from_db()
    assert run.dispatched_at == run.started_at > waited + timedelta(minutes=1)
    assert lifecycle.do_mark_running(run.pk, claim["attempt"])  # the agent fetches the job
    run.refresh_from_db()
    fetched = run.started_at
    assert fetched > run.dispatched_at
    assert lifecycle.do_mark_running(run.pk, claim["attempt"]) and Run.objects.get(pk=run.pk).started_at == fetched
    seconds = phase_seconds(run, {})
    assert seconds["queue"] == round((run.dispatched_at - waited).total_seconds(), 3) >= 60
    assert seconds["dispatch"] == round((fetched - run.dispatched_at).total_seconds(), 3)
