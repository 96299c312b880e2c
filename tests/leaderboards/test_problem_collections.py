"""A problem is its collection and its name (issue 36): collections reuse directory names (demo/matmul_py,
pmpp_v2/matmul_py), and importing one never adds a version to another's problem."""

import shutil
from datetime import timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from leaderboards.importing import do_import_competition, do_import_task
from leaderboards.models import Leaderboard, Problem
from runners.models import GpuType
from taskspec.loader import load_competition, load_task

from ..conftest import REPO

DEMO = REPO / "problems" / "demo"
SHARED = ("vectoradd_py", "matmul_py", "prefixsum_py")


@pytest.fixture
def cpu(db):
    return GpuType.objects.create(name="CPU", vendor="cpu")


def second_collection(base, timeout: int = 61):
    """pmpp_v2.yaml over pmpp_v2/{vectoradd,matmul,prefixsum}_py: the demo's directory names, other problems."""
    for name in SHARED:
        shutil.copytree(DEMO / name, base / "pmpp_v2" / name, dirs_exist_ok=True)
        task_yml = base / "pmpp_v2" / name / "task.yml"
        text = (DEMO / name / "task.yml").read_text()
        task_yml.write_text(text.replace("test_timeout: 60", f"test_timeout: {timeout}"))
    shutil.copy(DEMO / "utils.py", base / "pmpp_v2" / "utils.py")
    shutil.copy(DEMO / "eval.py", base / "pmpp_v2" / "eval.py")
    entries = "\n".join(f'  - {{name: "{n.removesuffix("_py")}-v2", directory: "pmpp_v2/{n}", gpus: ["CPU"]}}'
                        for n in SHARED)
    (base / "pmpp_v2.yaml").write_text(f'name: "PMPP v2"\ndeadline: "2027-12-31"\nproblems:\n{entries}\n')
    return base / "pmpp_v2.yaml"


def versions(name: str) -> list[tuple[str, int]]:
    return sorted(Problem.objects.filter(name=name).values_list("collection", "version"))


def test_another_collection_with_the_same_directory_names_never_versions_the_demos_problems(cpu, tmp_path):
    do_import_competition(load_competition(REPO / "problems" / "demo.yaml"))
    demo = {b.name: b.problem for b in Leaderboard.objects.all()}
    report = do_import_competition(load_competition(second_collection(tmp_path)))
    assert sorted(report.created) == ["matmul-v2", "prefixsum-v2", "vectoradd-v2"]
    for name in SHARED:
        assert versions(name) == [("CPU demo", 1), ("PMPP v2", 1)]
    assert {b.name: b.problem for b in Leaderboard.objects.filter(competition__name="CPU demo")} == demo
    assert str(Leaderboard.objects.get(name="matmul-v2").problem) == "matmul_py v1"

    # Re-importing either collection finds its own problems; a changed one is a version of its own line only.
    assert sorted(do_import_competition(load_competition(REPO / "problems" / "demo.yaml")).unchanged) == \
        ["matmul", "prefixsum", "softmax", "vectoradd"]
    assert sorted(do_import_competition(load_competition(second_collection(tmp_path))).unchanged) == \
        ["matmul-v2", "prefixsum-v2", "vectoradd-v2"]
    report = do_import_competition(load_competition(second_collection(tmp_path, timeout=62)))
    assert report.changes["matmul-v2"] == ["problem matmul_py v1 → matmul_py v2"]
    assert versions("matmul_py") == [("CPU demo", 1), ("PMPP v2", 1), ("PMPP v2", 2)]
    assert Leaderboard.objects.get(name="matmul").problem.version == 1


def test_single_directories_of_two_collections_are_two_problems(cpu, tmp_path):
    second_collection(tmp_path)
    for task_dir in (DEMO / "vectoradd_py", tmp_path / "pmpp_v2" / "vectoradd_py") * 2:
        do_import_task(load_task(task_dir), collection=task_dir.parent.name)
    assert versions("vectoradd_py") == [("demo", 1), ("pmpp_v2", 1)]


def test_an_upload_onto_a_board_is_a_version_of_the_boards_problem(cpu, tmp_path):
    do_import_competition(load_competition(REPO / "problems" / "demo.yaml"))
    do_import_competition(load_competition(second_collection(tmp_path)))
    changed = load_task(second_collection(tmp_path, timeout=70).parent / "pmpp_v2" / "vectoradd_py")
    report = do_import_task(changed, leaderboard="vectoradd")  # the zip front-ends: no collection of their own
    assert report.changes["vectoradd"] == ["problem vectoradd_py v1 → vectoradd_py v2"]
    assert versions("vectoradd_py") == [("CPU demo", 1), ("CPU demo", 2), ("PMPP v2", 1)]
    do_import_task(changed, leaderboard="fresh", deadline=timezone.now() + timedelta(days=1), gpus=["CPU"])
    assert Leaderboard.objects.get(name="fresh").problem.label == "vectoradd_py v1 (no collection)"


def test_the_admin_says_where_each_version_came_from(admin_client, cpu, tmp_path):
    do_import_competition(load_competition(REPO / "problems" / "demo.yaml"))
    do_import_competition(load_competition(second_collection(tmp_path)))
    page = admin_client.get("/admin/leaderboards/problem/?name=matmul_py").content.decode()
    assert page.count("<td class=\"field-origin\">CPU demo</td>") == 1
    assert page.count("<td class=\"field-origin\">PMPP v2</td>") == 1
    board = Leaderboard.objects.get(name="matmul")
    form = admin_client.get(f"/admin/leaderboards/leaderboard/{board.pk}/change/").content.decode()
    assert "matmul_py v1 (CPU demo)</option>" in form and "matmul_py v1 (PMPP v2)</option>" in form
    listing = admin_client.get("/admin/leaderboards/leaderboard/").content.decode()
    assert "matmul_py v1 (PMPP v2)" in listing


@pytest.fixture
def migrator(transactional_db):
    """Migrates as a test says; leaves the schema the rest of the session expects (every migration applied)."""
    yield lambda targets: MigrationExecutor(connection).migrate(targets)
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
def test_the_migration_gives_existing_versions_their_collection_and_renumbers_each_line(cpu, migrator):
    executor = MigrationExecutor(connection)
    before = [("leaderboards", "0017_profile_publish_submissions")]
    after = [("leaderboards", "0018_problem_collection")]
    migrator(before)
    apps = executor.loader.project_state(before).apps
    Problem_, Competition_, Leaderboard_ = (apps.get_model("leaderboards", m) for m in
                                            ("Problem", "Competition", "Leaderboard"))
    Submission_, User_ = apps.get_model("leaderboards", "Submission"), apps.get_model("auth", "User")
    deadline = timezone.now() + timedelta(days=30)
    demo, pmpp = (Competition_.objects.create(name=n, deadline=deadline) for n in ("CPU demo", "PMPP v2"))

    def problem(version: int):
        return Problem_.objects.create(name="matmul_py", version=version, content_hash=str(version), lang="py",
                                       description="", definition={})
    # demo v1 (replaced, ran a submission), demo v2 (its board's), pmpp_v2's import made v3 (replaced), v4 (board's)
    v1, v2, v3, v4, loose = (problem(v) for v in (1, 2, 3, 4, 5))
    matmul = Leaderboard_.objects.create(name="matmul", competition=demo, problem=v2, deadline=deadline)
    Leaderboard_.objects.create(name="matmul-v2", competition=pmpp, problem=v4, deadline=deadline)
    Leaderboard_.objects.create(name="standalone", problem=loose, deadline=deadline)
    user = User_.objects.create(username="u")
    code = apps.get_model("leaderboards", "Code").objects.create(sha256="x", text="x")
    Submission_.objects.create(leaderboard=matmul, problem=v1, user=user, code=code)

    migrator(after)
    got = {p.pk: (p.collection, p.version) for p in Problem.objects.all()}
    assert got == {v1.pk: ("CPU demo", 1), v2.pk: ("CPU demo", 2), v3.pk: ("PMPP v2", 1), v4.pk: ("PMPP v2", 2),
                   loose.pk: ("", 1)}
