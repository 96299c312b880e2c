"""GET /metrics (issue 42): Prometheus text read by prometheus_client's own parser, every figure equal to the
database's, closed without the token or a staff session."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from leaderboards.actions import check_submission
from leaderboards.errors import SubmissionRejected
from leaderboards.models import Run, RunStatus, Submission, SubmissionMode
from runners.harness.node import node_token
from runners.models import Gpu, Node
from runners.reservations.models import Reservation, ReservationStatus

from .conftest import RUNNER_KEY
from .factories import UserFactory
from .runners.test_node_agent import dispatch_all, node_call, submit

TOKEN = "metrics-token-0123456789"


def scrape(client: Client | None = None, token: str | None = TOKEN):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return (client or Client()).get("/metrics", headers=headers)


def types(text: str) -> dict[str, str]:
    return {family.name: family.type for family in text_string_to_metric_families(text)}


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.mark.django_db
def test_metrics_are_closed_without_the_token_or_a_staff_session(settings):
    settings.METRICS_TOKEN = TOKEN
    assert scrape(token=None).status_code == 401 and scrape(token=None)["WWW-Authenticate"] == "Bearer"
    assert scrape(token="wrong").status_code == 403
    settings.METRICS_TOKEN = ""
    assert scrape(token="").status_code == 401 and scrape(token="anything").status_code == 403  # no token: none
    user, staff = Client(), Client()
    user.force_login(UserFactory())
    staff.force_login(UserFactory(is_staff=True))
    assert scrape(user, token=None).status_code == 403
    response = scrape(staff, token=None)
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")


@pytest.mark.django_db
def test_every_figure_equals_the_databases(leaderboard, cpu_pool, settings):
    settings.METRICS_TOKEN = TOKEN
    pool, cpu = cpu_pool, cpu_pool.cpu
    live = cpu_pool.nodes.get()
    dead = Node.objects.create(pool=pool, hostname="gone", agent_seen_at=timezone.now() - timedelta(hours=2))
    Gpu.objects.create(node=dead, gpu_type=cpu, index=0)
    user = UserFactory()
    for _ in range(3):
        submit(leaderboard, user=user)
    dispatch_all()  # three runs dispatched to the pool, none claimed
    submit(leaderboard)  # one queued
    finished = Run.objects.filter(status=RunStatus.DISPATCHED).first()
    now = timezone.now()
    Run.objects.filter(pk=finished.pk).update(status=RunStatus.SUCCEEDED, queued_at=now - timedelta(seconds=40),
                                              dispatched_at=now - timedelta(seconds=39.8),
                                              started_at=now - timedelta(seconds=37), finished_at=now)
    old = submit(leaderboard).runs.get()  # finished before the window: no phase figure counts it
    Run.objects.filter(pk=old.pk).update(status=RunStatus.SUCCEEDED, queued_at=now - timedelta(hours=3),
                                         dispatched_at=now - timedelta(hours=3), started_at=now - timedelta(hours=3),
                                         finished_at=now - timedelta(hours=2, minutes=59))
    old.submission.delete()
    for bad in (dict(mode="nope"), dict(gpu="H200")):
        with pytest.raises(SubmissionRejected):
            check_submission(user, leaderboard.name, [bad.get("gpu", "CPU")], bad.get("mode", SubmissionMode.TEST),
                             "k.py", b"x = 1")
    with pytest.raises(SubmissionRejected):
        check_submission(user, leaderboard.name, ["CPU"], SubmissionMode.TEST, "k.py", b"   ")
    Reservation.objects.create(user=user, project="p", pool=pool, gpu_type=cpu, gpu_count=1, minutes=10,
                               status=ReservationStatus.PENDING)
    sample = {"index": 0, "utilization": 0.42, "memory_used": 3 << 30, "memory_total": 80 << 30}
    assert node_call("poll", {"pool": "local", "hostname": "localhost", "free": [], "samples": [sample]}
                     ).status_code == 200

    response = scrape()
    assert response.status_code == 200
    found = samples(response.content.decode())

    def value(name, **labels):
        return found.get((name, tuple(sorted(labels.items()))))

    assert value("kernelbot_queue_depth", pool="local", gpu_type="CPU") == 2
    assert value("kernelbot_queue_depth", pool="", gpu_type="CPU") == 1
    for status in RunStatus.values:
        assert value("kernelbot_runs", status=status) == Run.objects.filter(status=status).count()
    assert value("kernelbot_runs", status="succeeded") == 1
    assert value("kernelbot_submissions_stored") == Submission.objects.count() == 4
    assert value("kernelbot_submissions_refused_total", status="400") == 3
    assert value("kernelbot_nodes", pool="local", service="in_service") == 1
    assert value("kernelbot_nodes", pool="local", service="no_agent") == 1
    assert value("kernelbot_nodes_in_service", pool="local") == 1
    assert value("kernelbot_reservations", pool="local", status="pending") == 1
    assert value("kernelbot_gpu_utilization", pool="local", node=live.hostname, index="0") == pytest.approx(0.42)
    assert value("kernelbot_gpu_memory_used_bytes", pool="local", node=live.hostname, index="0") == 3 << 30
    assert value("kernelbot_gpu_memory_total_bytes", pool="local", node=live.hostname, index="0") == 80 << 30
    phase = "kernelbot_recent_run_phase_seconds"
    assert value(f"{phase}_count", phase="running") == 1
    assert value(f"{phase}_sum", phase="running") == pytest.approx(37, abs=0.01)
    assert value(f"{phase}_bucket", phase="running", le="30.0") == 0
    assert value(f"{phase}_bucket", phase="running", le="60.0") == 1
    assert value(f"{phase}_bucket", phase="running", le="+Inf") == 1
    assert value(f"{phase}_bucket", phase="queued", le="0.25") == 1
    assert value(f"{phase}_bucket", phase="queued", le="0.1") == 0


@pytest.mark.django_db
def test_figures_read_from_current_rows_are_gauges_and_go_down_with_them(leaderboard, settings):
    """A counter that goes down reads as a reset to Prometheus: what is read from current rows (submissions
    stored, recent runs' phases) is a gauge, and falls when a submission is deleted or a run requeued."""
    settings.METRICS_TOKEN = TOKEN
    run = submit(leaderboard).runs.get()
    submit(leaderboard)
    now = timezone.now()
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED, queued_at=now - timedelta(seconds=5),
                                         dispatched_at=now - timedelta(seconds=4),
                                         started_at=now - timedelta(seconds=3), finished_at=now)
    text = scrape().content.decode()
    kinds, before = types(text), samples(text)
    assert kinds["kernelbot_submissions_refused"] == "counter"
    for name in ("kernelbot_submissions_stored", "kernelbot_recent_run_phase_seconds_bucket",
                 "kernelbot_recent_run_phase_seconds_count", "kernelbot_recent_run_phase_seconds_sum"):
        assert kinds[name] == "gauge", (name, kinds)
    assert before[("kernelbot_submissions_stored", ())] == 2
    assert before[("kernelbot_recent_run_phase_seconds_count", (("phase", "running"),))] == 1
    Submission.objects.exclude(pk=run.submission_id).delete()
    Run.objects.filter(pk=run.pk).update(status=RunStatus.QUEUED, dispatched_at=None, started_at=None,
                                         finished_at=None)  # requeued by an organiser
    after = samples(scrape().content.decode())
    assert after[("kernelbot_submissions_stored", ())] == 1
    assert after[("kernelbot_recent_run_phase_seconds_count", (("phase", "running"),))] == 0


@pytest.mark.django_db
def test_bad_samples_are_refused_precisely(cpu_pool):
    response = node_call("poll", {"pool": "local", "hostname": "localhost", "free": [], "samples": [{"index": "0"}]})
    assert response.status_code == 400 and "samples" in response.json()["detail"]
    token = node_token(RUNNER_KEY, "local", "localhost")
    good = {"index": 0, "utilization": 0.5, "memory_used": 1 << 30, "memory_total": 80 << 30}
    for field, bad in (("memory_used", "1e400"), ("memory_total", "NaN"), ("utilization", "Infinity"),
                       ("memory_used", "1" + "0" * 400), ("memory_used", "-1"), ("index", "5000"),
                       ("utilization", "true")):
        raw = json.dumps({"pool": "local", "hostname": "localhost", "free": [],
                          "samples": [{**good, field: "BAD"}]}).replace('"BAD"', bad)
        response = Client().post("/api/runner/v1/nodes/poll", raw, content_type="application/json",
                                 headers={"Authorization": f"Bearer {token}"})
        assert response.status_code == 400 and "finite, non-negative" in response.json()["detail"], (field, bad)
    assert node_call("poll", {"pool": "local", "hostname": "localhost", "free": [], "samples": [good]}
                     ).status_code == 200
    assert Node.objects.get(hostname="localhost").samples == [good]


@pytest.mark.django_db
def test_the_phase_histograms_read_of_recently_finished_runs_is_served_by_an_index(postgres):
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # an empty table: make the planner show what could serve it
    since = timezone.now() - timedelta(hours=1)
    plan = Run.objects.filter(started_at__isnull=False, finished_at__gte=since, finished_at__isnull=False).explain()
    assert "run_finished_at" in plan, plan
