"""Importing problems and competitions into the database: versioned, all-or-nothing."""

import io
import shutil
import zipfile
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from leaderboards.importing import ImportRejected, do_import_competition, do_import_task
from leaderboards.models import Competition, HarnessProtocol, Leaderboard, Problem
from leaderboards.taskfile import load_competition, load_task
from runners.models import GpuType

from ..conftest import REPO
from ..factories import submission

pytestmark = pytest.mark.django_db
DEMO = REPO / "problems" / "demo"


@pytest.fixture
def cpu(db):
    return GpuType.objects.create(name="CPU", vendor="cpu")


def test_demo_competition_imports_every_leaderboard_once(cpu):
    report = do_import_competition(load_competition(REPO / "problems" / "demo.yaml"))
    assert sorted(report.created) == ["matmul", "prefixsum", "softmax", "vectoradd"]
    assert Leaderboard.objects.count() == 4 and Problem.objects.count() == 4
    board = Leaderboard.objects.get(name="vectoradd")
    assert list(board.gpu_types.all()) == [cpu] and board.competition == Competition.objects.get()
    assert board.problem.harness == HarnessProtocol.KERNELBOT and board.problem.definition["tests"]
    again = do_import_competition(load_competition(REPO / "problems" / "demo.yaml"))
    assert sorted(again.unchanged) == sorted(report.created) and Problem.objects.count() == 4


def test_a_task_with_eval_py_defaults_to_the_popcorn_protocol(cpu):
    do_import_task(load_task(DEMO / "vectoradd_eval_py"), leaderboard="va-eval",
                   deadline=timezone.now() + timedelta(days=1), gpus=["CPU"])
    problem = Leaderboard.objects.get(name="va-eval").problem
    assert problem.harness == HarnessProtocol.POPCORN and problem.definition["main"] == "eval.py"
    with pytest.raises(ImportRejected, match="popcorn protocol needs config.main"):
        do_import_task(load_task(DEMO / "vectoradd_py"), harness="popcorn")


def test_unknown_gpu_type_rejects_the_whole_competition(cpu, tmp_path):
    shutil.copytree(DEMO, tmp_path / "demo")
    text = (REPO / "problems" / "demo.yaml").read_text().replace(
        '{name: "matmul", directory: "demo/matmul_py", deadline: "2027-12-31T23:59:00Z", gpus: ["CPU"]}',
        '{name: "matmul", directory: "demo/matmul_py", deadline: "2027-12-31T23:59:00Z", gpus: ["H100"]}')
    (tmp_path / "set.yaml").write_text(text)
    with pytest.raises(ImportRejected) as info:
        do_import_competition(load_competition(tmp_path / "set.yaml"))
    assert "leaderboard matmul: unknown GPU type(s) H100 (known: CPU)" in str(info.value)
    assert not Leaderboard.objects.exists() and not Problem.objects.exists() and not Competition.objects.exists()


def test_changing_a_running_leaderboard_needs_force_and_makes_a_new_version(cpu, tmp_path):
    shutil.copytree(DEMO / "vectoradd_py", tmp_path / "vectoradd_py")
    shutil.copy(DEMO / "utils.py", tmp_path / "utils.py")
    deadline = timezone.now() + timedelta(days=1)
    do_import_task(load_task(tmp_path / "vectoradd_py"), leaderboard="va", deadline=deadline, gpus=["CPU"])
    board = Leaderboard.objects.get(name="va")
    old = submission(board)
    task_yml = tmp_path / "vectoradd_py" / "task.yml"
    task_yml.write_text(task_yml.read_text().replace("benchmarks:", "benchmarks:\n  - {size: 77, seed: 1}", 1))
    changed = load_task(tmp_path / "vectoradd_py")
    with pytest.raises(ImportRejected, match="needs an explicit force"):
        do_import_task(changed, leaderboard="va", deadline=deadline, gpus=["CPU"])
    assert Leaderboard.objects.get(name="va").problem == board.problem
    do_import_task(changed, leaderboard="va", deadline=deadline, gpus=["CPU"], force=True)
    board.refresh_from_db()
    assert board.problem.version == 2 and old.problem.version == 1  # past runs keep the version they ran


def test_import_command_reports_precise_errors(cpu, tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "task.yml").write_text("lang: py\ndescription: x\nfiles: [\n")
    with pytest.raises(CommandError, match=r"bad/task.yml: invalid YAML at line \d+"):
        call_command("import_problems", str(tmp_path / "bad"))
    with pytest.raises(CommandError, match="no such file or directory"):
        call_command("import_problems", str(tmp_path / "missing"))
    assert not Problem.objects.exists()


def test_admin_zip_upload_imports_and_rejects_bad_archives(admin_client, cpu):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path in (DEMO / "vectoradd_py").rglob("*"):
            if path.is_file():
                archive.write(path, f"set/vectoradd_py/{path.relative_to(DEMO / 'vectoradd_py')}")
        archive.write(DEMO / "utils.py", "set/utils.py")
    buffer.seek(0)
    buffer.name = "vectoradd.zip"
    response = admin_client.post("/admin/leaderboards/problem/upload/", {
        "archive": buffer, "harness": "auto", "leaderboard": "uploaded", "deadline": "2030-01-01 00:00",
        "gpus": "CPU"})
    assert response.status_code == 302, response.content.decode()[:2000]
    assert Leaderboard.objects.get(name="uploaded").problem.name == "vectoradd_py"

    bad = io.BytesIO()
    with zipfile.ZipFile(bad, "w") as archive:
        archive.writestr("../escape/task.yml", "lang: py")
    bad.seek(0)
    bad.name = "bad.zip"
    response = admin_client.post("/admin/leaderboards/problem/upload/", {"archive": bad, "harness": "auto"})
    assert response.status_code == 200 and b"errorlist" in response.content
    assert Problem.objects.count() == 1


def test_admin_pages_render(admin_client, leaderboard):
    submission(leaderboard)
    for url in ["/admin/leaderboards/leaderboard/", "/admin/leaderboards/run/", "/admin/leaderboards/submission/",
                "/admin/leaderboards/boardentry/", "/admin/leaderboards/problem/", "/admin/runners/gpupool/",
                f"/admin/leaderboards/submission/{leaderboard.submissions.get().pk}/change/",
                "/admin/leaderboards/problem/upload/", "/"]:
        assert admin_client.get(url).status_code == 200, url
