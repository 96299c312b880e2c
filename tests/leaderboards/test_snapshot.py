"""A private snapshot of live boards to the Hugging Face Hub (issue 44, point 4): on request (popcorn's
`POST /admin/export-hf`, KernelBot's body) and every 6 hours (`tasks.export_snapshot`), only to a private repository;
the public export stays as it is (closed boards whose code is public). The Hub is faked at its network edge."""

import io
import json
from importlib import import_module

import pyarrow.parquet as pq
import pytest
from django.apps import apps as django_apps
from django_q.models import Schedule

from leaderboards import tasks
from leaderboards.models import Profile

from ..factories import UserFactory, submission
from ..fakes.huggingface import FakeHub
from .test_lifecycle import finish

pytestmark = pytest.mark.django_db
ADMIN = {"Authorization": "Bearer s3cret-admin"}


@pytest.fixture
def hub(settings, monkeypatch):
    fake = FakeHub(token="hf_test_token").start()
    settings.HF_ENDPOINT = fake.url
    settings.ADMIN_TOKEN = "s3cret-admin"
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    yield fake
    fake.stop()


@pytest.fixture
def live(leaderboard):
    """An open board: alice's ranked submission, bob's (opted out), carol's test run."""
    alice, bob, carol = (UserFactory(username=n) for n in ("alice", "bob", "carol"))
    Profile.objects.create(user=bob, publish_submissions=False)
    finish(submission(leaderboard, alice, code="def custom_kernel(data): return 'a'"), [2000.0], [2100.0])
    finish(submission(leaderboard, bob, code="def custom_kernel(data): return 'b'"), [1000.0], [1100.0])
    finish(submission(leaderboard, carol, code="def custom_kernel(data): return 'c'", mode="test"), [9.0])
    return leaderboard


def export(client, board, private=True, filename="live.parquet"):
    body = {"leaderboard_ids": [board.pk], "filename": filename, "private": private}
    return client.post("/popcorn/admin/export-hf", json.dumps(body), content_type="application/json", headers=ADMIN)


def test_a_live_boards_private_snapshot_on_request_only_to_a_private_repository(client, hub, live, settings):
    settings.HF_PRIVATE_DATASET = "org/live-data"
    answer = export(client, live)
    assert answer.status_code == 200, answer.content
    assert hub.private[("dataset", "org/live-data")] is True
    table = pq.read_table(io.BytesIO(hub.repos[("dataset", "org/live-data")]["live.parquet"]))
    assert table.column("user_name").to_pylist() == ["alice"]  # ranked only; bob opted out
    assert table.column("code").to_pylist() == ["def custom_kernel(data): return 'a'"]

    hub.repos[("dataset", "org/open-data")], hub.private[("dataset", "org/open-data")] = {}, False
    settings.HF_PRIVATE_DATASET = "org/open-data"
    commits = len(hub.commits)
    refused = export(client, live)
    assert refused.status_code == 409 and "public repository" in refused.json()["detail"]
    assert len(hub.commits) == commits and hub.repos[("dataset", "org/open-data")] == {}

    settings.HF_PUBLIC_DATASET = "org/public-data"
    public = export(client, live, private=False)  # the public export stays as it was: closed boards only
    assert public.status_code == 409 and "still open" in public.json()["detail"]
    assert export(client, live, filename="../x.parquet").status_code == 400


def test_the_scheduled_snapshot_pushes_live_boards_every_six_hours(hub, live, settings, monkeypatch):
    # made by the migration; a transactional test before this one may have flushed it, so make it as it does
    import_module("leaderboards.migrations.0028_snapshot_schedule").create_schedule(django_apps, None)
    schedule = Schedule.objects.get(name="private snapshot")
    assert schedule.func == "leaderboards.tasks.export_snapshot" and schedule.minutes == 360
    settings.HF_PRIVATE_DATASET = ""
    assert tasks.export_snapshot().startswith("off") and hub.commits == []
    settings.HF_PRIVATE_DATASET = "org/live-data"
    assert "/commit/" in tasks.export_snapshot()
    table = pq.read_table(io.BytesIO(hub.repos[("dataset", "org/live-data")]["active_submissions.parquet"]))
    assert table.column("leaderboard").to_pylist() == [live.name]
    assert hub.private[("dataset", "org/live-data")] is True
