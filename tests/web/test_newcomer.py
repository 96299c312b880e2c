"""A newcomer's path through the README (issue 26, items 2, 3, 5, 6): the CLI walk works as written, the token pages
look like the site and are linked from it, the board says what it ranks on, and the docs say what the code does."""

import re

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from ..conftest import REPO
from ..factories import UserFactory

pytestmark = pytest.mark.django_db
README = (REPO / "README.md").read_text()


def test_submit_create_user_prints_a_password_the_cli_login_takes(client, leaderboard, capsys):
    call_command("submit", str(REPO / "problems/demo/vectoradd_py/solutions/fast.py"), user="alice",
                 create_user=True, leaderboard=leaderboard.name, gpus=["CPU"], mode="test")
    out = capsys.readouterr().out
    password = re.search(r"created user alice with password (\S+) \(log in on the site, or `kernelbot login "
                         r"--username alice`\)", out).group(1)
    assert get_user_model().objects.get(username="alice").check_password(password)
    answer = client.post("/api/v1/auth/password", {"username": "alice", "password": password},
                         content_type="application/json")
    assert answer.status_code == 201 and answer.json()["token"]  # what `kernelbot login --username alice` does


def test_submit_create_user_takes_a_chosen_password(leaderboard, capsys):
    call_command("submit", str(REPO / "problems/demo/vectoradd_py/solutions/fast.py"), user="bob", create_user=True,
                 password="kernels-are-fun-42", leaderboard=leaderboard.name, gpus=["CPU"], mode="test")
    assert "with password" not in capsys.readouterr().out
    assert get_user_model().objects.get(username="bob").check_password("kernels-are-fun-42")


def test_the_readme_says_where_alices_password_comes_from():
    walk = README[README.index("--user alice --create-user"):README.index("In Discord")]
    assert "prints" in walk and "password" in walk and "/tokens/" in walk


@pytest.mark.parametrize("path", ["/tokens/", "/tokens/link-cli/"])
def test_token_pages_have_the_sites_layout_and_are_linked_from_every_page(client, path):
    client.force_login(UserFactory(username="newcomer"))
    page = client.get(path).content.decode()
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in page
    assert 'href="/static/kb/site.css"' in page and '<header class="top">' in page
    assert '<a href="/tokens/">API tokens</a>' in client.get("/").content.decode()


def test_a_created_token_says_how_to_log_in_with_it(client):
    client.force_login(UserFactory(username="newcomer"))
    page = client.post("/tokens/", {"name": "laptop"}).content.decode()
    assert "kernelbot login --url http://testserver --token " in page


def test_an_empty_boards_header_can_be_replaced_when_rows_arrive(client, leaderboard):
    page = client.get(f"/lb/{leaderboard.name}/").content.decode()
    assert '<span id="rank-basis">ranked by' in page
    assert re.search(r'<p class="muted" id="ratio-note" hidden>', page)
    script = (REPO / "static/kb/site.js").read_text()
    assert '"#rank-basis"' in script and '"#ratio-note"' in script and 'if ($("tr.empty", tbody)) return refetch()' \
        in script


def test_the_charts_top_label_is_the_slowest_time():
    script = (REPO / "static/kb/site.js").read_text()
    top = re.search(r'<text x="2" y="\$\{T \+ 4\}" class="y-top">\$\{fig\(Math\.exp\((\w+)\)', script).group(1)
    assert top == "y1"  # y1 = the largest log time, which Y() puts at the top


@pytest.mark.parametrize("variable", ["KERNELBOT_ADMIN_TOKEN", "KERNELBOT_PUBLIC_URL", "KERNELBOT_RUNNER_KEY",
                                      "KERNELBOT_RUNS_DIR"])
def test_the_readme_configuration_table_names_what_its_workflows_use(variable):
    assert re.search(rf"^\| `{variable}` \|", README, re.M), variable
    assert variable in (REPO / "kernelbot" / "settings.py").read_text()


def test_the_docs_link_nothing_outside_the_repository_and_name_no_device_file_lock():
    for doc in [REPO / "README.md", *(REPO / "docs").glob("*.md")]:
        text = doc.read_text()
        assert "../shared/" not in text, doc
        assert "file lock per `Gpu` row" not in text, doc


def test_the_admin_start_page_says_whether_the_sandbox_is_active(admin_client, cpu_pool):
    page = admin_client.get("/admin/").content.decode()
    assert "Sandbox:</strong>" in page and "no node has reported yet" in page
    node = cpu_pool.nodes.first() or cpu_pool.nodes.create(hostname="box")
    node.sandbox = {"mode": "auto", "backend": "bubblewrap", "memory_cgroup": "v2 /sys/fs/cgroup/kb"}
    node.save()
    page = admin_client.get("/admin/").content.decode()
    assert f"{cpu_pool.name} / {node.hostname}: active (bubblewrap, memory cgroup v2 /sys/fs/cgroup/kb)" in page
    node.sandbox = {"mode": "auto", "backend": "rlimits-only", "memory_cgroup": None,
                    "memory_cgroup_error": "no cgroup v2", "error": "bwrap: not installed"}
    node.save()
    page = admin_client.get("/admin/").content.decode()
    assert "not fully active</strong> (rlimits-only, no memory cgroup (no cgroup v2) — bwrap: not installed)" in page
