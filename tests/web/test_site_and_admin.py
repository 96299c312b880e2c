"""Issue 44's site and admin points without a browser (test_site_in_a_browser.py has the browser's): names checked
as sign-up checks them, a declined CLI link told to the waiting CLI, published final standings on profiles and the
home page, the final table's wording, the submit page's banners, the tokens page, /api/docs without a CDN, the health
check kept out of organisers' lists, one machine per local pool, a new board's header, secret runs' wording and
`./dev serve`'s output."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.staticfiles import finders
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from leaderboards import finals, health, ranks
from leaderboards.access.models import ApiToken, PendingLogin
from leaderboards.management.commands import serve
from leaderboards.models import Run
from runners.actions import NodeRejected, do_register_node
from runners.models import GpuPool, GpuType

from ..conftest import REPO
from ..factories import LeaderboardFactory, UserFactory, submission
from ..leaderboards.test_lifecycle import finish
from ..leaderboards.test_ranks import with_ratio

pytestmark = pytest.mark.django_db
RLO_NAME = "ada\u202eecalevol"


def test_submit_create_user_refuses_a_name_sign_up_refuses(leaderboard):
    with pytest.raises(CommandError, match=r"'ada\\u202eecalevol' is not a valid username: Enter a valid username"):
        call_command("submit", str(REPO / "problems/demo/vectoradd_py/solutions/fast.py"), user=RLO_NAME,
                     create_user=True, leaderboard=leaderboard.name, gpus=["CPU"])
    assert not get_user_model().objects.filter(username=RLO_NAME).exists()


def test_a_pasted_id_is_linked_only_once_confirmed(client):
    cli_id = client.post("/api/v1/auth/cli").json()["cli_id"]
    client.force_login(UserFactory(username="ada"))
    page = client.post("/tokens/link-cli/", {"cli_id": cli_id})
    assert page.status_code == 200 and 'id="confirm-link"' in page.content.decode()
    assert "The id becomes an API token:" in page.content.decode()
    assert not ApiToken.objects.exists()
    assert client.post("/tokens/link-cli/", {"cli_id": cli_id, "confirm": "yes"}).status_code == 302
    assert ApiToken.objects.get().user.username == "ada"


@pytest.mark.parametrize("how", ["pasted", "link"])
def test_declining_tells_the_waiting_cli(client, how):
    cli_id = client.post("/api/v1/auth/cli").json()["cli_id"]
    popcorn_id = json.loads(client.get("/popcorn/auth/init?provider=github").content)["state"]
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {cli_id}"}
    assert client.get("/api/v1/me", **bearer).status_code == 401  # waiting: not linked yet
    client.force_login(UserFactory(username="ada"))
    if how == "link":
        assert 'name="decline"' in client.get(f"/tokens/link-cli/?state={cli_id}").content.decode()
    for raw in (cli_id, popcorn_id):
        page = client.post("/tokens/link-cli/", {"cli_id": raw, "decline": "yes"}, follow=True).content.decode()
        assert "Not linked: the CLI waiting on that id is told so" in page
    client.logout()
    told = client.get("/api/v1/me", **bearer)
    assert told.status_code == 403 and "declined in the browser" in told.json()["detail"]
    popcorn = client.get("/popcorn/user/submissions", HTTP_X_POPCORN_CLI_ID=popcorn_id)
    assert popcorn.status_code == 403 and "declined in the browser" in popcorn.content.decode()
    client.force_login(UserFactory(username="bob"))  # a declined id is never linked afterwards
    assert client.post("/tokens/link-cli/", {"cli_id": cli_id, "confirm": "yes"}).status_code == 404
    assert not ApiToken.objects.exists() and PendingLogin.objects.filter(declined__isnull=False).count() == 2


def published_final(leaderboard, cpu_pool, monkeypatch, times: list[float]):
    """Ranked entries (racer0 first on the board), then re-verified with `times` (by board position) and published."""
    monkeypatch.setattr("leaderboards.tasks.dispatch_run", lambda run_id: None)
    for i in range(len(times)):
        sub = submission(leaderboard, UserFactory(username=f"racer{i}"), code=f"k{i}")
        finish(sub, [1000.0 * (i + 1)])
        ranks.do_rank_result(sub.runs.get(secret=True).pk)
    leaderboard.deadline, leaderboard.final_rounds = timezone.now() - timedelta(minutes=1), 1
    leaderboard.save(update_fields=["deadline", "final_rounds"])
    final = finals.do_start_final(leaderboard, requested_by=UserFactory(is_staff=True), publish_when_done=False)
    finals.advance(final.pk, cpu_pool.cpu.pk)
    while run := Run.objects.filter(submission__final_entry__final=final, status="queued").first():
        finish(run.submission, [times[run.submission.final_entry.position]])
        finals.advance(final.pk, cpu_pool.cpu.pk)
    return finals.do_publish_final(final)


def test_profiles_and_the_home_page_show_the_published_final_standings(client, leaderboard, cpu_pool, monkeypatch):
    published_final(leaderboard, cpu_pool, monkeypatch, [3000.0, 1000.0])  # the board's second wins the final
    row = re.search(r"<td class=\"num final-rank\">(.*?)</td><td class=\"num\">(\d+)</td>",
                    client.get("/u/racer1/").content.decode())
    assert row.groups() == ("1", "2")  # published rank 1, board rank 2
    assert "Published rank" in client.get("/u/racer1/").content.decode()
    home = client.get("/").content.decode()
    leader = re.search(r'<a href="/u/(\w+)/"><bdi>\w+</bdi></a> <span class="muted">[^<]*</span>( <span class="badge"'
                       r'[^>]*>final</span>)?', home)
    assert leader.group(1) == "racer1" and leader.group(2), home


def test_the_final_table_leads_with_the_ratio_and_counts_the_entries_it_re_ran(client, leaderboard, cpu_pool,
                                                                                monkeypatch):
    published_final(leaderboard, cpu_pool, monkeypatch, [3000.0, 1000.0, 2000.0, 4000.0])  # 4 entries, top 10
    page = client.get(f"/lb/{leaderboard.name}/").content.decode()
    head = re.search(r'<table id="final-ranking">\s*<thead><tr>(.*?)</tr>', page).group(1)
    assert re.findall(r"<th[^>]*>([^<]*)</th>", head)[:4] == ["Rank", "User", "× reference, 95 % interval", "Time"]
    note = re.search(r'<p class="muted" id="final-note">(.*?)</p>', page, re.S).group(1)
    assert note.startswith("All 4 entries of the board were re-run 1 time each") and "top 10" not in note


def test_the_submit_page_warns_only_of_the_chosen_boards_gpu_types(client, leaderboard):
    l4 = GpuType.objects.create(name="L4")  # served by no pool: unavailable
    other = LeaderboardFactory(name="on-l4", problem=leaderboard.problem, gpu_types=[l4])
    client.force_login(UserFactory())
    banner = re.compile(r'<div class="flash warning" role="status" data-unavailable="L4"( hidden)?>')
    assert banner.search(client.get(f"/submit/?leaderboard={leaderboard.name}").content.decode()).group(1)
    assert not banner.search(client.get(f"/submit/?leaderboard={other.name}").content.decode()).group(1)
    script = (REPO / "static/kb/site.js").read_text()
    assert 'document.querySelectorAll("[data-unavailable]")' in script  # swapped with the board, as the GPU list


def test_the_tokens_page_has_a_copy_button_and_revoke_in_the_first_column(client):
    client.force_login(UserFactory())
    page = client.post("/tokens/", {"name": "laptop"}).content.decode()
    assert '<button type="button" class="copy" data-copy="#token-value">Copy</button>' in page
    assert '<pre id="token-value">' in page
    row = re.search(r"<tr><td>(.*?)</td>\s*<td><bdi>laptop</bdi></td>", page, re.S)
    assert row and ">Revoke</button>" in row.group(1)


def test_api_docs_load_swagger_ui_from_this_site(client):
    page = client.get("/api/docs", follow=True).content.decode()
    assert "cdn.jsdelivr.net" not in page and "unpkg.com" not in page
    assert "/static/ninja/swagger-ui-bundle.js" in page
    assert finders.find("ninja/swagger-ui-bundle.js")  # collected with the site's static files (ninja is an app)


def test_the_health_check_is_in_no_organiser_list_and_has_no_public_page(admin_client, client, cpu_pool, leaderboard):
    board = health.check_leaderboard([cpu_pool.cpu])
    user = health.check_user()
    assert admin_client.get(f"/admin/leaderboards/leaderboard/{board.pk}/change/").status_code == 200  # still reachable
    assert board.name not in admin_client.get("/admin/leaderboards/leaderboard/").content.decode()
    assert leaderboard.name in admin_client.get("/admin/leaderboards/leaderboard/").content.decode()
    problems = admin_client.get("/admin/leaderboards/problem/").content.decode()
    assert f"/admin/leaderboards/problem/{board.problem_id}/change/" not in problems
    assert f"/admin/leaderboards/problem/{leaderboard.problem_id}/change/" in problems
    assert user.username not in admin_client.get("/admin/auth/user/").content.decode()
    assert client.get(f"/u/{user.username}/").status_code == 404


def test_a_second_local_pool_cannot_claim_a_machine_another_has(cpu_pool, admin_client):
    second = GpuPool.objects.create(name="second")
    with pytest.raises(NodeRejected, match="localhost already belongs to pool local: a machine serves one pool"):
        do_register_node(second, {"devices": []}, hostname="localhost")  # manage.py register_node
    response = admin_client.post("/admin/runners/gpupool/add/", {
        "name": "third", "backend": "local", "enabled": "on", "settings": "{}",
        "devices-TOTAL_FORMS": "1", "devices-INITIAL_FORMS": "0", "devices-MIN_NUM_FORMS": "0",
        "devices-MAX_NUM_FORMS": "1000", "devices-0-hostname": "localhost", "devices-0-index": "0",
        "devices-0-gpu_type": str(cpu_pool.cpu.pk), "devices-0-enabled": "on"})
    assert response.status_code == 200 and "a machine serves one pool" in response.content.decode()
    assert not GpuPool.objects.filter(name="third").exists()


def test_a_new_boards_header_reads_as_it_will_once_results_arrive(client, leaderboard, cpu_pool):
    basis = re.compile(r'<span id="rank-basis">(.*?)</span>', re.S)
    before = basis.search(client.get(f"/lb/{leaderboard.name}/").content.decode()).group(1)
    ranks.do_rank_result(with_ratio(submission(leaderboard, UserFactory()), 1500.0, 0.8))
    after = basis.search(client.get(f"/lb/{leaderboard.name}/").content.decode()).group(1)
    assert before == after and after.endswith("relative to the reference")


def test_the_profile_history_plots_the_ratio_and_says_so(client, leaderboard, cpu_pool):
    user = UserFactory(username="ada")
    ranks.do_rank_result(with_ratio(submission(leaderboard, user), 1500.0, 0.8))
    page = client.get("/u/ada/").content.decode()
    history = json.loads(page.split('id="history-data" type="application/json">')[1].split("</script>")[0])
    assert history["onRatio"] is True and [p[1] for s in history["series"].values() for p in s] == [0.8]
    assert re.search(r'<span class="muted" id="history-measure">× the reference', page)


def test_serve_prints_the_new_admin_password_last_and_quiets_the_task_queue(monkeypatch, capsys, cpu_pool):
    started = []
    monkeypatch.delenv("Q_LOG_LEVEL", raising=False)

    class Child:
        def __init__(self, command, **kwargs):
            started.append((command, dict(__import__("os").environ)))

        def poll(self):
            return 0  # the server "exits" at once: serve stops

        def send_signal(self, sig): ...

        def wait(self, timeout=None): ...

    monkeypatch.setattr(serve.subprocess, "Popen", Child)
    monkeypatch.setattr(serve, "wait_for_port", lambda *args: True)
    monkeypatch.setattr(serve, "port_taken", lambda *args: "")
    call_command("serve", "--no-demo", "--port", "8123")
    out = capsys.readouterr().out
    lines = out.splitlines()
    up = next(i for i, line in enumerate(lines) if "kernelbot is up" in line)
    assert any("Created superuser 'admin' with password: " in line for line in lines[up:]), out
    assert all(env.get("Q_LOG_LEVEL") == "WARNING" for _, env in started)
