"""Re-importing a fixed problem onto a live leaderboard (issue 26, item 7): what the organiser set stays unless the
import names it, no board is ever left without a GPU type, the admin previews what changes before it does, and a
refusal tells a web user which box to tick."""

import io
import shutil
import zipfile
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from leaderboards.importing import ImportRejected, do_import_task, previewed
from leaderboards.models import Leaderboard, Problem, RankingRule, Run
from runners.models import GpuType
from taskspec.loader import load_task

from ..conftest import REPO
from ..factories import submission
from .test_lifecycle import finish

pytestmark = pytest.mark.django_db
DEMO = REPO / "problems" / "demo"
URL = "/admin/leaderboards/problem/upload/"


@pytest.fixture
def gpus(db):
    return GpuType.objects.create(name="CPU", vendor="cpu"), GpuType.objects.create(name="H100", vendor="nvidia")


@pytest.fixture
def task_dir(tmp_path):
    shutil.copytree(DEMO / "vectoradd_py", tmp_path / "set" / "vectoradd_py")
    shutil.copy(DEMO / "utils.py", tmp_path / "set" / "utils.py")
    return tmp_path / "set" / "vectoradd_py"


def fix(task_dir, text: str = "  - {size: 77, seed: 1}") -> None:
    """The organiser's fix: one more benchmark, so a new problem version."""
    task_yml = task_dir / "task.yml"
    task_yml.write_text(task_yml.read_text().replace("benchmarks:", "benchmarks:\n" + text, 1))


def zipped(task_dir, name: str = "vectoradd-fixed.zip") -> io.BytesIO:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path in task_dir.parent.rglob("*"):
            if path.is_file():
                archive.write(path, str(path.relative_to(task_dir.parent.parent)))
    buffer.seek(0)
    buffer.name = name
    return buffer


@pytest.fixture
def live_board(gpus, task_dir):
    """vectoradd on H100 only, its rule changed by the organiser to the last benchmark, with a submission."""
    do_import_task(load_task(task_dir), leaderboard="va", deadline=timezone.now() + timedelta(days=5), gpus=["H100"])
    board = Leaderboard.objects.get(name="va")
    assert board.ranking_by == RankingRule.GEOM  # a new board takes its task's rule
    board.ranking_by = RankingRule.LAST
    board.save()
    submission(board)
    return board


def test_a_forced_reimport_without_gpus_keeps_the_boards_gpu_types_rule_and_deadline(live_board, task_dir):
    fix(task_dir)
    report = do_import_task(load_task(task_dir), leaderboard="va", force=True)
    board = Leaderboard.objects.get(name="va")
    assert [g.name for g in board.gpu_types.all()] == ["H100"]
    assert board.ranking_by == RankingRule.LAST and board.deadline == live_board.deadline
    assert board.problem.version == 2
    assert report.changes == {"va": ["problem vectoradd_py v1 → vectoradd_py v2"]}
    assert "GPUs H100" in str(report) and "GPUs ." not in str(report)


def test_a_board_that_follows_its_tasks_rule_follows_a_changed_rule_and_is_rescored(gpus, task_dir):
    do_import_task(load_task(task_dir), leaderboard="va", gpus=["CPU"])
    board = Leaderboard.objects.get(name="va")
    finish(submission(board), [1000.0, 4000.0])
    geom = set(Run.objects.values_list("score", flat=True))
    task_yml = task_dir / "task.yml"
    task_yml.write_text(task_yml.read_text().replace('ranking_by: "geom"', 'ranking_by: "last"'))
    report = do_import_task(load_task(task_dir), leaderboard="va", force=True)
    assert Leaderboard.objects.get(name="va").ranking_by == RankingRule.LAST
    assert report.changes["va"][-2:] == ["ranking rule geometric mean → last benchmark",
                                         "its scores are recomputed with the new rule"]
    assert set(Run.objects.values_list("score", flat=True)) == {4e-6} != geom


def test_no_board_is_left_without_a_gpu_type(gpus, task_dir):
    with pytest.raises(ImportRejected, match="leaderboard va: no GPU type to run on: name at least one"):
        do_import_task(load_task(task_dir), leaderboard="va")  # the task lists no gpus
    assert not Leaderboard.objects.exists()
    with pytest.raises(CommandError, match="no GPU type to run on"):
        call_command("import_problems", str(task_dir), "--leaderboard", "va")


def test_the_preview_changes_nothing(live_board, task_dir):
    fix(task_dir)
    report = previewed(do_import_task, load_task(task_dir), leaderboard="va", gpus=["CPU"], force=True)
    assert report.changes == {"va": ["problem vectoradd_py v1 → vectoradd_py v2", "GPU types H100 → CPU"]}
    board = Leaderboard.objects.get(name="va")
    assert board.problem.version == 1 and [g.name for g in board.gpu_types.all()] == ["H100"]
    assert Problem.objects.count() == 1


def test_the_admin_refusal_says_which_box_to_tick(admin_client, live_board, task_dir):
    fix(task_dir)
    response = admin_client.post(URL, {"archive": zipped(task_dir), "harness": "auto", "leaderboard": "va"})
    page = response.content.decode()
    assert response.status_code == 400
    assert "changing its files or benchmarks needs an explicit force: tick “Force” below" in page
    assert "--force" not in page


def test_the_admin_previews_a_change_then_applies_it_without_asking_for_the_zip_again(admin_client, live_board,
                                                                                       task_dir):
    fix(task_dir)
    response = admin_client.post(URL, {"archive": zipped(task_dir), "harness": "auto", "leaderboard": "va",
                                       "force": "on"})
    page = response.content.decode()
    assert response.status_code == 200, page[:3000]
    assert "Nothing is imported yet" in page and "va: problem vectoradd_py v1 → vectoradd_py v2" in page
    assert "Kept from the preview: <strong>vectoradd-fixed.zip</strong>" in page
    assert Leaderboard.objects.get(name="va").problem.version == 1
    staged = page.split('name="staged" value="')[1].split('"')[0]
    response = admin_client.post(URL, {"staged": staged, "staged_name": "vectoradd-fixed.zip", "harness": "auto",
                                       "leaderboard": "va", "force": "on", "confirmed": "yes"}, follow=True)
    board = Leaderboard.objects.get(name="va")
    assert board.problem.version == 2 and [g.name for g in board.gpu_types.all()] == ["H100"]
    assert board.ranking_by == RankingRule.LAST
    assert "changed: problem vectoradd_py v1 → vectoradd_py v2" in response.content.decode()


def test_an_unchanged_reimport_needs_no_preview(admin_client, live_board, task_dir):
    response = admin_client.post(URL, {"archive": zipped(task_dir), "harness": "auto", "leaderboard": "va"})
    assert response.status_code == 302
    assert "Unchanged leaderboard va" in admin_client.get(response["Location"]).content.decode()


def test_errors_name_the_uploaded_file(admin_client, gpus, task_dir):
    (task_dir / "task.yml").write_text("lang: py\ndescription: x\nfiles: [\n")
    page = admin_client.post(URL, {"archive": zipped(task_dir, "my-problem.zip"), "harness": "auto",
                                   "gpus": "CPU"}).content.decode()
    assert "my-problem.zip/set/vectoradd_py/task.yml" in page and "upload.zip" not in page


def test_a_whole_collection_is_refused_with_the_way_to_import_it(admin_client, gpus, task_dir):
    shutil.copytree(task_dir, task_dir.parent / "second_py")
    page = admin_client.post(URL, {"archive": zipped(task_dir), "harness": "auto", "gpus": "CPU"}).content.decode()
    assert "the archive must contain exactly one task.yml" in page and "competition file" in page
    assert "Zipping the whole collection works too" not in admin_client.get(URL).content.decode()
