"""The submissions dataset: KernelBot's parquet schema plus our per-run columns, one row per distinct code, closed
boards only, opted-out users left out; the command, the admin action, the board page's download, the Hub push."""

import io
from datetime import timedelta

import pyarrow.parquet as pq
import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from leaderboards import dataset
from leaderboards.models import Profile, Run

from ..factories import UserFactory, submission
from ..fakes.huggingface import FakeHub
from .test_lifecycle import finish

pytestmark = pytest.mark.django_db
KERNELBOT_COLUMNS = ["submission_id", "leaderboard_id", "problem_name", "user_id", "user_name", "code_id", "file_name",
                     "submission_time", "status", "score", "passed", "mode", "runner", "code"]
OUR_COLUMNS = ["gpu_type", "device_name", "torch_version", "driver_version", "ratio", "ratio_low", "ratio_high",
               "verdict"]
SYSTEM = {"device": "NVIDIA H100 80GB HBM3", "torch": "2.9.1+cu128", "driver": "580.95.05"}


@pytest.fixture
def closed(leaderboard):
    """A board past its deadline, its code public: alice submitted one file twice and another once, bob (opted
    out) once, carol a test run of alice's first file (the same code: one row) and a failing kernel."""
    alice, bob, carol = (UserFactory(username=n) for n in ("alice", "bob", "carol"))
    Profile.objects.create(user=bob, publish_submissions=False)
    first = submission(leaderboard, alice, code="def custom_kernel(data): return 1")
    finish(first, [2000.0], [3000.0])
    Run.objects.filter(submission=first).update(system_info=SYSTEM)
    finish(submission(leaderboard, alice, code="def custom_kernel(data): return 1"), [1000.0])  # the same file
    finish(submission(leaderboard, alice, code="def custom_kernel(data): return 2"), [1500.0])
    finish(submission(leaderboard, bob, code="def custom_kernel(data): return 'bob'"), [500.0])
    finish(submission(leaderboard, carol, code="def custom_kernel(data): return 1", mode="test"), [9.0])
    finish(submission(leaderboard, carol, code="def custom_kernel(data): return 0"), [100.0], verdict="fail")
    leaderboard.deadline = timezone.now() - timedelta(hours=1)
    leaderboard.code_public_after_deadline = True
    leaderboard.save(update_fields=["deadline", "code_public_after_deadline"])
    return leaderboard, first


def read(data: bytes):
    return pq.read_table(io.BytesIO(data))


def test_the_export_reads_back_in_kernelbots_schema_plus_ours_one_row_per_code_without_opted_out_users(closed,
                                                                                                        tmp_path):
    board, first = closed
    out = tmp_path / "board.parquet"
    call_command("export_dataset", board.name, out=str(out), stdout=io.StringIO())
    table = pq.read_table(out)
    assert table.schema.names == KERNELBOT_COLUMNS + ["leaderboard"] + OUR_COLUMNS
    assert table.schema.equals(dataset.SCHEMA)
    rows = table.to_pylist()
    codes = [r["code"] for r in rows]
    assert len(codes) == len(set(codes)) == len({r["code_id"] for r in rows}) == 3
    assert "bob" not in {r["user_name"] for r in rows} and "return 'bob'" not in "".join(codes)
    row = next(r for r in rows if r["submission_id"] == first.pk)  # the file's first submission stands for it
    secret = first.runs.get(secret=True)  # the slower of its two runs: the one its score comes from
    assert (row["score"], row["status"], row["passed"], row["verdict"]) == (secret.score, "succeeded", True, "pass")
    assert (row["device_name"], row["torch_version"], row["driver_version"], row["gpu_type"]) == \
        (SYSTEM["device"], SYSTEM["torch"], SYSTEM["driver"], "CPU")
    assert row["user_name"] == "alice" and row["problem_name"] == board.problem.name and row["mode"] == "leaderboard"
    assert row["submission_time"] == first.created
    failing = next(r for r in rows if r["user_name"] == "carol")
    assert (failing["status"], failing["passed"], failing["score"]) == ("failed", False, None)


def test_opting_out_on_the_site_leaves_a_user_out_of_later_exports(closed, client):
    board, _ = closed
    client.force_login(UserFactory(username="alice"))
    assert client.post("/tokens/publishing/", {"publish": "maybe"}).status_code == 400
    assert "Yours are included" in client.get("/tokens/").content.decode()
    assert client.post("/tokens/publishing/", {"publish": "no"}).status_code == 302
    assert "Yours are left out" in client.get("/tokens/").content.decode()
    assert {r["user_name"] for r in read(dataset.parquet_bytes([board])).to_pylist()} == {"carol"}


def test_only_closed_boards_export_and_the_page_offers_the_download_once_the_code_is_public(closed, client):
    board, _ = closed
    page = client.get(f"/lb/{board.name}/").content.decode()
    assert 'id="dataset-download"' in page
    download = client.get(f"/lb/{board.name}/dataset.parquet")
    assert download.status_code == 200 and download["Content-Disposition"].endswith(f'"{board.name}.parquet"')
    assert read(download.content).num_rows == 3
    board.code_public_after_deadline = False
    board.save(update_fields=["code_public_after_deadline"])
    assert 'id="dataset-download"' not in client.get(f"/lb/{board.name}/").content.decode()
    assert client.get(f"/lb/{board.name}/dataset.parquet").status_code == 404
    board.deadline = timezone.now() + timedelta(days=1)
    board.save(update_fields=["deadline"])
    with pytest.raises(CommandError, match="still open"):
        call_command("export_dataset", board.name, out="/dev/null")
    with pytest.raises(CommandError, match="no leaderboard named nope"):
        call_command("export_dataset", "nope")


def test_the_admin_action_downloads_the_selected_boards_dataset(closed, client):
    board, _ = closed
    client.force_login(UserFactory(username="organiser", is_staff=True, is_superuser=True))
    response = client.post("/admin/leaderboards/leaderboard/", {"action": "export_dataset",
                                                                 "_selected_action": [board.pk]})
    assert response.status_code == 200 and read(response.content).num_rows == 3
    board.deadline = timezone.now() + timedelta(days=1)
    board.save(update_fields=["deadline"])
    response = client.post("/admin/leaderboards/leaderboard/", {"action": "export_dataset",
                                                                 "_selected_action": [board.pk]}, follow=True)
    assert response.status_code == 200 and "still open" in response.content.decode()


@pytest.fixture
def hub():
    fake = FakeHub(token="hf_test_token").start()
    yield fake
    fake.stop()


def test_the_command_pushes_the_export_to_a_hugging_face_dataset_repository(closed, hub, settings, monkeypatch,
                                                                             tmp_path):
    board, _ = closed
    settings.HF_ENDPOINT = hub.url
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(CommandError, match="Set HF_TOKEN"):
        call_command("export_dataset", board.name, out=str(tmp_path / "a.parquet"), push="gpu-mode/kernelbot-data")
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(CommandError, match="refused"):
        call_command("export_dataset", board.name, out=str(tmp_path / "a.parquet"), push="gpu-mode/kernelbot-data")
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    out = io.StringIO()
    for _ in range(2):  # the repository exists the second time: the push goes on
        call_command("export_dataset", board.name, out=str(tmp_path / "b.parquet"), push="gpu-mode/kernelbot-data",
                     path_in_repo="data/board.parquet", stdout=out)
    pushed = hub.repos[("dataset", "gpu-mode/kernelbot-data")]["data/board.parquet"]
    assert read(pushed).equals(pq.read_table(tmp_path / "b.parquet"))
    assert len(hub.commits) == 2 and "pushed to " + hub.url in out.getvalue()
