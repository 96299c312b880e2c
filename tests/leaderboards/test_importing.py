"""Importing problems and competitions into the database: versioned, all-or-nothing."""

import io
import re
import shutil
import zipfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from leaderboards.importing import ImportRejected, do_import_competition, do_import_task
from leaderboards.management.commands.import_problems import Command as ImportProblems
from leaderboards.models import Competition, Final, FinalStatus, HarnessProtocol, Leaderboard, Problem, Visibility
from runners.models import GpuType
from taskspec.loader import load_competition, load_task

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
    with pytest.raises(ImportRejected, match="the popcorn protocol runs the problem's own eval.py, but there is "
                       "no config.main; add it to files, or use the trusted harness"):
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
    assert response.status_code == 400 and b"errorlist" in response.content
    assert Problem.objects.count() == 1


def test_admin_pages_render(admin_client, leaderboard):
    submission(leaderboard)
    for url in ["/admin/leaderboards/leaderboard/", "/admin/leaderboards/run/", "/admin/leaderboards/submission/",
                "/admin/leaderboards/boardentry/", "/admin/leaderboards/problem/", "/admin/runners/gpupool/",
                f"/admin/leaderboards/submission/{leaderboard.submissions.get().pk}/change/",
                "/admin/leaderboards/problem/upload/", "/"]:
        assert admin_client.get(url).status_code == 200, url


def collection(base: Path, task_yml: str | None = None, competition: str | None = None) -> Path:
    """A small problem collection like reference-kernels: set/vectoradd_py with ../utils.py, set/eval.py."""
    shutil.copytree(DEMO / "vectoradd_py", base / "set" / "vectoradd_py")
    shutil.copy(DEMO / "utils.py", base / "set" / "utils.py")
    shutil.copy(DEMO / "eval.py", base / "set" / "eval.py")
    if task_yml is not None:
        (base / "set" / "vectoradd_py" / "task.yml").write_text(task_yml)
    if competition is not None:
        (base / "set" / "set.yaml").write_text(competition)
    return base / "set"


FILES_WITHOUT_EVAL = """files:
  - {name: "submission.py", source: "@SUBMISSION@"}
  - {name: "reference.py", source: "reference.py"}
  - {name: "utils.py", source: "../utils.py"}
lang: "py"
description: vector addition
config:
  main: "eval.py"
tests:
  - {size: 1, seed: 4242, nomask: true, m: [128, 256]}
benchmarks:
  - {size: 65536, seed: 7153}
"""


def test_main_without_eval_py_runs_under_the_trusted_harness(cpu, tmp_path):
    task = load_task(collection(tmp_path, FILES_WITHOUT_EVAL) / "vectoradd_py")
    assert task.main == "eval.py" and "eval.py" not in task.files
    report = do_import_task(task, harness="kernelbot")
    assert Problem.objects.get().harness == HarnessProtocol.KERNELBOT
    assert str(report) == "created problem vectoradd_py v1: trusted harness (reference.py) (no leaderboard)"
    assert str(do_import_task(task)) == "unchanged problem vectoradd_py v1: trusted harness (reference.py) " \
                                        "(no leaderboard)"  # auto: reference.py is there
    with pytest.raises(ImportRejected, match="config.main eval.py is not one of the files; add it to files, or "
                                             "use the trusted harness"):
        do_import_task(task, harness="popcorn")


def test_the_trusted_harness_needs_reference_py(cpu, tmp_path):
    text = FILES_WITHOUT_EVAL.replace('  - {name: "reference.py", source: "reference.py"}\n', "")
    task = load_task(collection(tmp_path, text) / "vectoradd_py")
    with pytest.raises(ImportRejected, match="the trusted harness needs reference.py among the files .* or name "
                                             "config.main's eval.py among the files"):
        do_import_task(task)
    assert not Problem.objects.exists()


def test_command_reports_deadline_and_harness_per_leaderboard(cpu, tmp_path):
    root = collection(tmp_path, competition=(
        'name: Practice\ndeadline: ""\ndescription: ""\nproblems:\n'
        '  - {directory: vectoradd_py, name: va, deadline: "2030-06-30", gpus: [CPU]}\n'
        '  - {directory: vectoradd_py, name: va-late, deadline: "2030-11-29 6:59", gpus: [CPU], harness: kernelbot}\n'
        '  - {directory: vectoradd_py, name: va-open, gpus: [CPU]}\n'))
    out = io.StringIO()
    call_command("import_problems", str(root / "set.yaml"), stdout=out)
    lines = out.getvalue().splitlines()
    opened = Leaderboard.objects.get(name="va-open").deadline
    assert abs(opened - timezone.now() - timedelta(days=365)) < timedelta(hours=1)
    assert lines[0] == "competition Practice: deadline 2030-11-29 06:59 UTC (none given: its latest leaderboard's)"
    assert lines[1] == ("created leaderboard va: problem vectoradd_py v1, trusted harness (reference.py), "
                        "deadline 2030-06-30 00:00 UTC, GPUs CPU")
    assert lines[2].startswith("created leaderboard va-late: problem vectoradd_py v1, trusted harness (reference.py), "
                               "deadline 2030-11-29 06:59 UTC")
    assert lines[3] == (f"created leaderboard va-open: problem vectoradd_py v1, trusted harness (reference.py), "
                        f"deadline {opened:%Y-%m-%d %H:%M} UTC (none given: 365 days from now), GPUs CPU")
    assert Competition.objects.get().deadline == datetime(2030, 11, 29, 6, 59, tzinfo=UTC)
    call_command("import_problems", str(root / "set.yaml"), stdout=io.StringIO())
    assert Leaderboard.objects.get(name="va-open").deadline == opened  # re-importing keeps it


def test_command_takes_kernelbot_deadlines_and_documents_root(cpu, tmp_path):
    task_dir = collection(tmp_path) / "vectoradd_py"
    out = io.StringIO()
    call_command("import_problems", str(task_dir), "--leaderboard", "va", "--deadline", "2030-06-30 6:59",
                 "--gpu", "CPU", stdout=out)
    assert "deadline 2030-06-30 06:59 UTC" in out.getvalue()
    with pytest.raises(CommandError, match="not a date and time"):
        call_command("import_problems", str(task_dir), "--leaderboard", "va", "--deadline", "soon")
    help_text = ImportProblems().create_parser("manage.py", "import_problems").format_help()
    assert "--root ROOT" in help_text and "../../pmpp_v2/utils.py" in " ".join(help_text.split())


def test_command_root_lets_a_helper_two_levels_up_in_and_nothing_else(cpu, tmp_path):
    root = collection(tmp_path)
    shutil.copy(DEMO / "utils.py", root / "shared_utils.py")
    (root / "linalg").mkdir()
    task_dir = (root / "vectoradd_py").rename(root / "linalg" / "vectoradd_py")
    task_yml = task_dir / "task.yml"
    task_yml.write_text(task_yml.read_text().replace('source: "../utils.py"', 'source: "../../shared_utils.py"'))
    with pytest.raises(CommandError, match=r"../../shared_utils.py resolves outside the problem collection; .*"
                                           r"\(pass --root with a directory that holds both the task and the file\)"):
        call_command("import_problems", str(task_dir))
    call_command("import_problems", str(task_dir), "--root", str(root), stdout=io.StringIO())
    assert Problem.objects.get().definition["files"]["utils.py"] == (DEMO / "utils.py").read_text()
    task_yml.write_text(task_yml.read_text().replace("../../shared_utils.py", "../../../escape.py"))
    (tmp_path / "escape.py").write_text("x = 1\n")
    with pytest.raises(CommandError, match="../../../escape.py resolves outside the problem collection"):
        call_command("import_problems", str(task_dir), "--root", str(root))


def test_a_competition_does_not_take_over_another_competitions_leaderboards(cpu, tmp_path):
    do_import_competition(load_competition(REPO / "problems" / "demo.yaml"))
    demo_board = Leaderboard.objects.get(name="vectoradd")
    before = (demo_board.problem_id, demo_board.deadline, demo_board.competition_id)
    root = collection(tmp_path, competition=(
        'name: Practice\ndeadline: "2090-01-01"\nproblems:\n'
        '  - {directory: vectoradd_py, name: vectoradd, gpus: [CPU]}\n'
        '  - {directory: vectoradd_py, name: fresh, gpus: [CPU]}\n'))
    with pytest.raises(ImportRejected) as info:
        do_import_competition(load_competition(root / "set.yaml"))
    assert info.value.errors == ["leaderboard vectoradd belongs to the competition 'CPU demo'; importing "
                                 "'Practice' would take it over. Rename it in this file, or pass --force to move "
                                 "it into this competition"]
    demo_board.refresh_from_db()
    assert (demo_board.problem_id, demo_board.deadline, demo_board.competition_id) == before
    assert not Competition.objects.filter(name="Practice").exists() and not Leaderboard.objects.filter(
        name="fresh").exists()
    do_import_competition(load_competition(root / "set.yaml"), force=True)
    assert Leaderboard.objects.get(name="vectoradd").competition.name == "Practice"


def test_a_standalone_import_keeps_the_boards_competition(cpu):
    do_import_competition(load_competition(REPO / "problems" / "demo.yaml"))
    do_import_task(load_task(DEMO / "vectoradd_py"), leaderboard="vectoradd",
                   deadline=timezone.now() + timedelta(days=3), gpus=["CPU"])
    assert Leaderboard.objects.get(name="vectoradd").competition.name == "CPU demo"


@pytest.mark.parametrize(("args", "message"), [
    (["--leaderboard", "bad name!"], "'bad name!' is not a valid leaderboard name: use only letters, digits"),
    (["--leaderboard", "x" * 101], "leaderboard names are at most 100 characters, got 101"),
])
def test_command_refuses_names_a_leaderboard_cannot_have(cpu, tmp_path, args, message):
    with pytest.raises(CommandError, match=message):
        call_command("import_problems", str(collection(tmp_path) / "vectoradd_py"), *args, "--gpu", "CPU")
    assert not Problem.objects.exists() and not Leaderboard.objects.exists()


@pytest.mark.parametrize(("competition", "message"), [
    ("name: x\nproblems:\n  - {directory: vectoradd_py, name: 'bad name!', gpus: [CPU]}\n",
     "problems[0].name: 'bad name!' is not a valid leaderboard name"),
    ("name: x\nproblems:\n  - {directory: vectoradd_py, name: " + "l" * 101 + ", gpus: [CPU]}\n",
     "problems[0].name: leaderboard names are at most 100 characters"),
    ("name: " + "c" * 121 + "\nproblems:\n  - {directory: vectoradd_py, name: ok, gpus: [CPU]}\n",
     "name: at most 120 characters, got 121"),
])
def test_competition_names_are_checked_before_the_database(cpu, tmp_path, competition, message):
    root = collection(tmp_path, competition=competition)
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("import_problems", str(root / "set.yaml"))
    assert not Competition.objects.exists() and not Problem.objects.exists()


@pytest.mark.parametrize(("change", "message"), [
    (lambda text: text.replace('name: "reference.py"', 'name: "ref/reference.py"'),
     "expected a plain file name like eval.py \\(no directory\\), got str 'ref/reference.py'"),
    (lambda text: text.replace("test_timeout: 60", "test_timeout: 100000000000000000000000000000"),
     "test_timeout: expected a positive int of seconds up to 86400"),
])
def test_what_a_run_needs_is_checked_at_import(cpu, tmp_path, change, message):
    task_dir = collection(tmp_path) / "vectoradd_py"
    (task_dir / "task.yml").write_text(change((task_dir / "task.yml").read_text()))
    with pytest.raises(CommandError, match=message):
        call_command("import_problems", str(task_dir))
    assert not Problem.objects.exists()


def test_a_problem_directory_name_longer_than_its_column(cpu, tmp_path):
    root = collection(tmp_path)
    long_dir = (root / "vectoradd_py").rename(root / ("v" * 101))
    with pytest.raises(CommandError, match="the problem name \\(its directory name\\) is 101 characters"):
        call_command("import_problems", str(long_dir))


def vectoradd_zip(folder: str) -> io.BytesIO:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path in (DEMO / "vectoradd_py").rglob("*"):
            if path.is_file():
                archive.write(path, f"set/{folder}/{path.relative_to(DEMO / 'vectoradd_py')}")
        archive.write(DEMO / "utils.py", "set/utils.py")
    buffer.seek(0)
    buffer.name = f"{folder}.zip"
    return buffer


@pytest.mark.parametrize(("folder", "leaderboard", "message"), [
    ("v" * 101, "ok", "the problem name (its directory name) is 101 characters; at most 100"),
    ("vectoradd_py", "x" * 101, "leaderboard names are at most 100 characters, got 101"),
])
def test_admin_zip_upload_refuses_long_names_with_a_message(admin_client, cpu, folder, leaderboard, message):
    response = admin_client.post("/admin/leaderboards/problem/upload/", {
        "archive": vectoradd_zip(folder), "harness": "auto", "leaderboard": leaderboard, "deadline": "2030-01-01",
        "gpus": "CPU"})
    assert response.status_code == 400 and message in response.content.decode()
    assert not Problem.objects.exists()


@pytest.mark.parametrize(("name", "message"), [
    ("bad name!", "'bad name!' is not a valid leaderboard name"),
    ("x" * 101, "leaderboard names are at most 100 characters"),
])
def test_popcorn_admin_route_refuses_bad_leaderboard_names(client, settings, cpu, tmp_path, name, message):
    settings.ADMIN_TOKEN = "s3cret-admin"
    settings.PROBLEMS_DIR = collection(tmp_path)
    response = client.post("/popcorn/admin/leaderboards", {"directory": "vectoradd_py", "name": name,
                                                           "gpus": ["CPU"]}, content_type="application/json",
                           headers={"Authorization": "Bearer s3cret-admin"})
    assert response.status_code == 400 and message in response.content.decode()
    assert not Problem.objects.exists() and not Leaderboard.objects.exists()


def test_popcorn_update_problems_imports_a_problem_with_a_collection_helper(client, settings, cpu, tmp_path):
    settings.ADMIN_TOKEN = "s3cret-admin"
    settings.PROBLEMS_DIR = collection(tmp_path)
    task_dir = settings.PROBLEMS_DIR / "vectoradd_py"
    (settings.PROBLEMS_DIR / "linalg").mkdir()
    task_dir.rename(settings.PROBLEMS_DIR / "linalg" / "vectoradd_py")
    task_yml = settings.PROBLEMS_DIR / "linalg" / "vectoradd_py" / "task.yml"
    task_yml.write_text(task_yml.read_text().replace('"../utils.py"', '"../../utils.py"'))
    (settings.PROBLEMS_DIR / "set.yaml").write_text("name: s\nproblems: []\n")  # marks the collection root
    response = client.post("/popcorn/admin/update-problems?directory=linalg/vectoradd_py",
                           headers={"Authorization": "Bearer s3cret-admin"})
    assert response.json() == {"created": ["vectoradd_py v1"], "updated": [], "skipped": [], "errors": []}


def test_two_copies_of_one_collection_reimport_without_new_versions(cpu, tmp_path):
    """Two checkouts of one collection (set/) that differ: versions of one problem, each found again on re-import.
    (Collections with other names are other problems: test_problem_collections.)"""
    first = collection(tmp_path / "a") / "vectoradd_py"
    second = collection(tmp_path / "b") / "vectoradd_py"
    (second / "task.yml").write_text((second / "task.yml").read_text().replace("test_timeout: 60", "test_timeout: 61"))
    assert [str(do_import_task(load_task(d), collection="set")) for d in (first, second, first, second)] == [
        "created problem vectoradd_py v1: trusted harness (reference.py) (no leaderboard)",
        "created problem vectoradd_py v2: trusted harness (reference.py) (no leaderboard)",
        "unchanged problem vectoradd_py v1: trusted harness (reference.py) (no leaderboard)",
        "unchanged problem vectoradd_py v2: trusted harness (reference.py) (no leaderboard)"]


def test_admin_zip_upload_says_which_deadline_and_harness_it_chose(admin_client, cpu):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path in (DEMO / "vectoradd_eval_py").rglob("*"):
            archive.write(path, f"set/vectoradd_eval_py/{path.name}")
        for name in ("utils.py", "eval.py"):
            archive.write(DEMO / name, f"set/{name}")
        archive.write(DEMO / "vectoradd_py" / "reference.py", "set/vectoradd_py/reference.py")
        archive.write(DEMO / "vectoradd_py" / "template.py", "set/vectoradd_py/template.py")
    buffer.seek(0)
    buffer.name = "eval.zip"
    response = admin_client.post("/admin/leaderboards/problem/upload/", {
        "archive": buffer, "harness": "auto", "leaderboard": "va-eval", "deadline": "", "gpus": "CPU"}, follow=True)
    text = response.content.decode()
    deadline = Leaderboard.objects.get(name="va-eval").deadline
    assert abs(deadline - timezone.now() - timedelta(days=365)) < timedelta(hours=1)
    assert "Created leaderboard va-eval: problem vectoradd_eval_py v1, popcorn protocol (eval.py), deadline " \
           f"{deadline:%Y-%m-%d %H:%M} UTC (none given: 365 days from now)" in text


def test_command_options_that_a_competition_file_would_ignore_are_refused(cpu, tmp_path):
    root = collection(tmp_path, competition="name: s\nproblems:\n  - {directory: vectoradd_py, name: va}\n")
    with pytest.raises(CommandError, match="--harness: only for a problem directory"):
        call_command("import_problems", str(root / "set.yaml"), "--harness", "kernelbot")
    with pytest.raises(CommandError, match="--root .*: not a directory"):
        call_command("import_problems", str(root / "set.yaml"), "--root", str(root / "set.yaml"))
    assert not Leaderboard.objects.exists()


def test_a_competition_file_sets_a_boards_between_run_spread_and_a_file_without_one_keeps_it(cpu, tmp_path):
    root = collection(tmp_path, competition="name: CPU demo\nproblems:\n  - {directory: vectoradd_py, name: vectoradd, "
                                            "gpus: [CPU], run_spread: 0.18}\n")
    do_import_competition(load_competition(root / "set.yaml"))
    assert Leaderboard.objects.get(name="vectoradd").run_spread == 0.18  # as the file says
    do_import_competition(load_competition(REPO / "problems" / "demo.yaml"))
    assert set(Leaderboard.objects.filter(run_spread__isnull=True).values_list("name", flat=True)) == {
        "softmax", "prefixsum", "matmul"}  # the demo sets none: the workers measure them

    (root / "set.yaml").write_text("name: CPU demo\nproblems:\n  - {directory: vectoradd_py, name: vectoradd, "
                                   "gpus: [CPU], run_spread: 0.25}\n")
    report = do_import_competition(load_competition(root / "set.yaml"), force=True)
    assert any("between-run spread 0.18 → 0.25" in line for line in report.lines), report.lines
    assert Leaderboard.objects.get(name="vectoradd").run_spread == 0.25
    (root / "set.yaml").write_text("name: CPU demo\nproblems:\n  - {directory: vectoradd_py, name: vectoradd, "
                                   "gpus: [CPU]}\n")
    do_import_competition(load_competition(root / "set.yaml"), force=True)
    assert Leaderboard.objects.get(name="vectoradd").run_spread == 0.25  # what the organiser set stays


@pytest.mark.parametrize("value", ["-0.1", "1.5", "wide", "true"])
def test_a_between_run_spread_out_of_range_is_refused_before_the_database(cpu, tmp_path, value):
    root = collection(tmp_path, competition="name: x\nproblems:\n  - {directory: vectoradd_py, name: va, gpus: [CPU], "
                                            f"run_spread: {value}}}\n")
    with pytest.raises(CommandError, match=re.escape("problems[0].run_spread: expected a number from 0 to 1, got ")):
        call_command("import_problems", str(root / "set.yaml"))
    assert not Leaderboard.objects.exists() and not Competition.objects.exists()


def test_an_organiser_sets_a_boards_spread_in_the_admin_and_an_out_of_range_one_is_refused(admin_client, leaderboard):
    url = f"/admin/leaderboards/leaderboard/{leaderboard.pk}/change/"
    page = admin_client.get(url)
    assert page.status_code == 200 and 'name="run_spread"' in page.content.decode()
    form = page.context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None and k != "gpu_types"}
    data.update({"gpu_types": [g.pk for g in leaderboard.gpu_types.all()], "deadline_0": "2099-01-01",
                 "deadline_1": "00:00:00", "starts_at_0": "", "starts_at_1": ""})
    data.pop("deadline", None)
    data.pop("starts_at", None)
    refused = admin_client.post(url, {**data, "run_spread": "1.5"})
    assert refused.status_code == 200
    assert "Ensure this value is less than or equal to 1.0." in refused.content.decode()
    leaderboard.refresh_from_db()
    assert leaderboard.run_spread is None
    saved = admin_client.post(url, {**data, "run_spread": "0.2"})
    assert saved.status_code == 302, saved.content.decode()[-3000:]
    leaderboard.refresh_from_db()
    assert leaderboard.run_spread == 0.2


def test_a_reimport_keeps_a_visibility_an_organiser_edited_in_the_admin(db):
    """The demo's boards are public; one an organiser closed or unlisted in the admin stays so through `./dev
    serve`'s re-import (load_demo) and an import of the same file, --reset too (the file names no visibility)."""
    call_command("load_demo", stdout=io.StringIO())
    edited = {"matmul": Visibility.CLOSED, "softmax": Visibility.UNLISTED}
    for name, visibility in edited.items():
        board = Leaderboard.objects.get(name=name)
        board.visibility = visibility  # as the admin's change form saves it
        board.save()
    call_command("load_demo", stdout=io.StringIO())
    call_command("import_problems", "demo.yaml", "--reset", stdout=io.StringIO())
    assert dict(Leaderboard.objects.filter(name__in=edited).values_list("name", "visibility")) == edited
    assert Leaderboard.objects.get(name="vectoradd").visibility == Visibility.PUBLIC


def test_a_restart_of_serve_keeps_an_edited_deadline_and_a_published_final(db):
    """`./dev serve` re-imports problems/demo.yaml at every start (load_demo): with matmul closed in the admin and its
    final published, a restart reopened the board (issue 52). Only `--reset` takes the file's deadline back."""
    call_command("load_demo", stdout=io.StringIO())
    board = Leaderboard.objects.get(name="matmul")
    board.deadline = timezone.now() - timedelta(hours=1)  # as the admin's change form saves it
    board.save()
    Final.objects.create(leaderboard=board, status=FinalStatus.PUBLISHED, top_n=10, rounds=3,
                         published_at=timezone.now())
    out = io.StringIO()
    call_command("load_demo", stdout=out)
    board.refresh_from_db()
    assert not board.is_open and board.finals.get().status == FinalStatus.PUBLISHED
    assert "deadline 2027-12-31 23:59 UTC" not in next(line for line in out.getvalue().splitlines()
                                                         if "leaderboard matmul" in line)
    assert "kept as set since the last import: deadline" in out.getvalue() and "pass --reset" in out.getvalue()
    assert Leaderboard.objects.get(name="softmax").deadline == datetime(2027, 12, 31, 23, 59, tzinfo=UTC)

    call_command("import_problems", str(REPO / "problems" / "demo.yaml"), "--reset", stdout=io.StringIO())
    board.refresh_from_db()
    assert board.is_open and board.deadline == datetime(2027, 12, 31, 23, 59, tzinfo=UTC)


def test_a_reimport_writes_only_what_the_file_changed_since_the_last_import(cpu, tmp_path):
    GpuType.objects.create(name="H100", vendor="nvidia")
    entry = '  - {{directory: vectoradd_py, name: va, gpus: [CPU], deadline: "{}", run_spread: {}}}\n'
    root = collection(tmp_path, competition="name: Set\nproblems:\n" + entry.format("2090-01-01", 0.2))
    do_import_competition(load_competition(root / "set.yaml"))
    board = Leaderboard.objects.get(name="va")
    board.deadline, board.run_spread = datetime(2080, 1, 1, tzinfo=UTC), 0.3  # edited in the admin
    board.save()
    board.gpu_types.set([GpuType.objects.get(name="H100")])

    report = do_import_competition(load_competition(root / "set.yaml"))  # the same file: every edit stays
    board.refresh_from_db()
    assert (board.deadline.year, board.run_spread, [g.name for g in board.gpu_types.all()]) == (2080, 0.3, ["H100"])
    assert report.unchanged == ["va"] and "kept as set since the last import: deadline 2080-01-01 00:00 UTC, not " \
        "the file's 2090-01-01 00:00 UTC; between-run spread 0.3, not the file's 0.2; GPU types H100, not the " \
        "file's CPU; pass --reset to take the file's values)" in report.lines[1]

    (root / "set.yaml").write_text("name: Set\nproblems:\n" + entry.format("2095-06-30", 0.2))
    report = do_import_competition(load_competition(root / "set.yaml"))  # the file's deadline changed: it applies
    board.refresh_from_db()
    assert (board.deadline.year, board.run_spread, [g.name for g in board.gpu_types.all()]) == (2095, 0.3, ["H100"])
    assert "changed: deadline 2080-01-01 00:00 UTC → 2095-06-30 00:00 UTC" in report.lines[1]

    do_import_competition(load_competition(root / "set.yaml"), reset=True)  # the organiser asks for the file's values
    board.refresh_from_db()
    assert (board.deadline.year, board.run_spread, [g.name for g in board.gpu_types.all()]) == (2095, 0.2, ["CPU"])


def test_a_board_imported_before_its_values_were_recorded_keeps_them_until_the_file_changes(cpu, tmp_path):
    root = collection(tmp_path, competition='name: Set\nproblems:\n  - {directory: vectoradd_py, name: va, '
                                            'gpus: [CPU], deadline: "2090-01-01"}\n')
    do_import_competition(load_competition(root / "set.yaml"))
    Leaderboard.objects.filter(name="va").update(imported={}, deadline=datetime(2080, 1, 1, tzinfo=UTC))
    do_import_competition(load_competition(root / "set.yaml"))
    board = Leaderboard.objects.get(name="va")
    assert board.deadline.year == 2080 and board.imported["deadline"] == "2090-01-01T00:00:00+00:00"


def test_the_admin_zip_import_keeps_an_edited_deadline_unless_told_to_take_its_values(admin_client, cpu):
    def upload(**fields) -> str:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            for path in (DEMO / "vectoradd_py").glob("*.*"):
                archive.write(path, f"set/vectoradd_py/{path.name}")
            archive.write(DEMO / "utils.py", "set/utils.py")
        buffer.seek(0)
        buffer.name = "va.zip"
        return admin_client.post("/admin/leaderboards/problem/upload/", {
            "archive": buffer, "harness": "auto", "leaderboard": "va", "deadline": "2090-01-01 00:00", "gpus": "CPU",
            **fields}, follow=True).content.decode()

    upload()
    Leaderboard.objects.filter(name="va").update(deadline=datetime(2080, 1, 1, tzinfo=UTC))  # changed in the admin
    assert "not the file&#x27;s 2090-01-01 00:00 UTC; tick “Take these values” to take" in upload()
    assert Leaderboard.objects.get(name="va").deadline.year == 2080
    upload(reset="on", confirmed="yes")
    assert Leaderboard.objects.get(name="va").deadline.year == 2090
