"""GET /metrics (issue 42): Prometheus text read by prometheus_client's own parser, every figure equal to the
database's, closed without the token or a staff session."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from leaderboards.actions import check_submission
from leaderboards.errors import SubmissionRejected
from leaderboards.models import Run, RunStatus, SubmissionMode
from runners.models import Gpu, Node
from runners.reservations.models import Reservation, ReservationStatus

from .factories import UserFactory
from .runners.test_node_agent import dispatch_all, node_call, submit

TOKEN = "metrics-token-0123456789"


def scrape(client: Client | None = None, token: str | None = TOKEN):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return (client or Client()).get("/metrics", headers=headers)


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
    assert value("kernelbot_submissions_accepted_total") == 4
    assert value("kernelbot_submissions_refused_total", status="400") == 3
    assert value("kernelbot_nodes", pool="local", service="in_service") == 1
    assert value("kernelbot_nodes", pool="local", service="no_agent") == 1
    assert value("kernelbot_nodes_in_service", pool="local") == 1
    assert value("kernelbot_reservations", pool="local", status="pending") == 1
    assert value("kernelbot_gpu_utilization", pool="local", node=live.hostname, index="0") == pytest.approx(0.42)
    assert value("kernelbot_gpu_memory_used_bytes", pool="local", node=live.hostname, index="0") == 3 << 30
    assert value("kernelbot_gpu_memory_total_bytes", pool="local", node=live.hostname, index="0") == 80 << 30
    assert value("kernelbot_run_phase_seconds_count", phase="running") == 1
    assert value("kernelbot_run_phase_seconds_sum", phase="running") == pytest.approx(37, abs=0.01)
    assert value("kernelbot_run_phase_seconds_bucket", phase="running", le="30.0") == 0
    assert value("kernelbot_run_phase_seconds_bucket", phase="running", le="60.0") == 1
    assert value("kernelbot_run_phase_seconds_bucket", phase="queued", le="0.25") == 1
    assert value("kernelbot_run_phase_seconds_bucket", phase="queued", le="0.1") == 0


@pytest.mark.django_db
def test_bad_samples_are_refused_precisely(cpu_pool):
    response = node_call("poll", {"pool": "local", "hostname": "localhost", "free": [], "samples": [{"index": "0"}]})
    assert response.status_code == 400 and "samples" in response.json()["detail"]
