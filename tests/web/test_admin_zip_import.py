"""The admin's zip import as a first-time organiser meets it: where shared ../ files go, a flat zip's hint, YAML
errors at the line they start, a past deadline refused unless meant, each error once, the file asked for again,
and success that links to the new leaderboard."""

import io
import re
import zipfile

import pytest

from leaderboards.models import Leaderboard, Problem
from runners.models import GpuType

from ..conftest import REPO

pytestmark = pytest.mark.django_db
DEMO = REPO / "problems" / "demo"
URL = "/admin/leaderboards/problem/upload/"


@pytest.fixture
def cpu(db):
    return GpuType.objects.create(name="CPU", vendor="cpu")


def demo_zip(prefix: str, *, task_yml: str | None = None, name: str = "vectoradd.zip") -> io.BytesIO:
    """The demo vectoradd problem under `prefix` (e.g. "set/vectoradd_py/" or "" for a flat zip), its shared
    utils.py one folder up when there is one."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path in (DEMO / "vectoradd_py").rglob("*"):
            if path.is_file():
                archive.write(path, prefix + str(path.relative_to(DEMO / "vectoradd_py")))
        if prefix:
            archive.write(DEMO / "utils.py", prefix.rstrip("/").rpartition("/")[0] + "/utils.py")
        if task_yml is not None:
            archive.writestr(prefix + "task.yml", task_yml)
    buffer.seek(0)
    buffer.name = name
    return buffer


def post(client, archive, **fields):
    return client.post(URL, {"archive": archive, "harness": "auto", "gpus": "CPU", **fields})


def errors(page: str) -> list[str]:
    return [re.sub(r"<[^>]+>", "", e) for e in re.findall(r'<ul class="errorlist[^"]*"[^>]*>(.*?)</ul>', page, re.S)]


def test_the_form_says_where_shared_files_go(admin_client):
    page = admin_client.get(URL).content.decode()
    assert "set/vectoradd/task.yml naming ../utils.py needs set/utils.py beside that folder" in page


def test_a_flat_zip_gets_a_hint_how_to_fix_it_each_error_once_and_the_file_asked_again(admin_client, cpu):
    response = post(admin_client, demo_zip("", name="flat.zip"), leaderboard="flat", deadline="2030-01-01")
    page = response.content.decode()
    assert response.status_code == 400
    assert "task.yml is at the top of this archive, so ../ leads out of it: put the problem in a folder" in page
    shown = errors(page)
    assert len(shown) == len(set(shown)) and all(page.count(e[:60]) == 1 for e in shown)  # each error once
    assert "Choose the zip again (flat.zip)" in page
    assert not Problem.objects.exists()


def test_a_yaml_error_is_reported_where_it_starts(admin_client, cpu):
    broken = "lang: py\ndescription: 'never closed\nfiles: []\ntests: []\nbenchmarks: []\n"
    page = post(admin_client, demo_zip("set/vectoradd_py/", task_yml=broken), deadline="2030-01-01").content.decode()
    assert "invalid YAML at line 2, column 14: a quoted scalar that is never closed" in page


def test_a_past_deadline_is_refused_unless_meant(admin_client, cpu):
    response = post(admin_client, demo_zip("set/vectoradd_py/"), leaderboard="old", deadline="2020-01-01 00:00")
    assert response.status_code == 400
    page = response.content.decode()
    assert "2020-01-01 00:00 UTC is in the past" in page and page.count("UTC is in the past") == 1
    assert not Leaderboard.objects.exists()
    response = post(admin_client, demo_zip("set/vectoradd_py/"), leaderboard="old", deadline="2020-01-01 00:00",
                    past_deadline="on")
    assert response.status_code == 302
    assert Leaderboard.objects.get(name="old").is_finished


def test_success_links_to_the_new_leaderboard(admin_client, cpu):
    response = post(admin_client, demo_zip("set/vectoradd_py/"), leaderboard="fresh", deadline="2030-01-01")
    board = Leaderboard.objects.get(name="fresh")
    assert response["Location"] == f"/admin/leaderboards/leaderboard/{board.pk}/change/"
    page = admin_client.get(response["Location"]).content.decode()
    assert "Created leaderboard fresh: problem vectoradd_py v1" in page
    assert '<a href="/lb/fresh/" target="_blank" rel="noopener">Open fresh on the site ↗</a>' in page
