"""Issue 44 (site and admin) in a real browser (Debian's chromium driven by Playwright, as test_browser.py): a user
name with U+202E reverses nothing after it on a board, a submission page, a profile, the home page and the admin; the
link-CLI paste form asks before linking and declining tells the waiting `kernelbot login`; the final-standings admin
at 390 px clips no cell (checked cell by cell, not by the page's scroll width); /api/docs renders with the network cut
off; at 390 px the tokens page copies a new token and keeps "Revoke" in view, and the submit page warns only of the
chosen board's unavailable GPU types."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import timedelta
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.hashers import make_password
from django.test import Client
from django.utils import timezone

from leaderboards.models import ApiToken, BoardEntry, Final, FinalEntry, FinalStatus
from leaderboards.ranks import do_recompute_ranks
from runners.models import GpuType

from ..conftest import REPO
from ..factories import LeaderboardFactory, UserFactory, local_cpu_pool, problem_from, submission
from ..leaderboards.test_ranks import with_ratio
from .test_browser import browser, shot  # noqa: F401 - fixtures
from .test_first_hour import PASSWORD, log_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
RLO_NAME = "ada\u202eecalevol"  # shows as "adalovelace" and reverses whatever follows it unless isolated

# Visible text holding U+202E with text after it inside the element the override ends with (the nearest that
# isolates, by the browser's computed unicode-bidi: <bdi>, dir=…; else its block), unless FSI…PDI enclose it: the
# text the override turns around. A name in its own <bdi>, or alone in its table cell, turns nothing else.
NOT_ISOLATED = """(name) => {
  const found = [], walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const text = node.textContent, at = text.indexOf('\\u202e');
    if (at < 0 || node.parentElement.closest('script, svg, template, title')) continue;
    // isolated within the text itself (FIRST STRONG ISOLATE … POP DIRECTIONAL ISOLATE around it: plain-text labels)
    if (text.lastIndexOf('\\u2068', at) >= 0 && text.indexOf('\\u2069', at) > at) continue;
    if (!node.parentElement.getClientRects().length) continue;
    let el = node.parentElement;
    for (; el && el !== document.body; el = el.parentElement) {  // the element the override ends with
      const style = getComputedStyle(el);
      if (['isolate', 'isolate-override', 'plaintext'].includes(style.unicodeBidi)) break;
      if (!style.display.startsWith('inline')) break;  // a block ends the paragraph the override runs to the end of
    }
    const after = document.createRange();
    const named = text.indexOf(name, Math.max(0, at - name.length));
    after.setStart(node, named >= 0 ? named + name.length : at + 1);  // from the end of the name on
    after.setEndAfter(el || document.body);
    if (after.toString().trim())
      found.push(`${node.parentElement.tagName.toLowerCase()} "${text.trim().slice(0, 30)}" not isolated; `
                 + `after it: "${after.toString().trim().slice(0, 40)}"`);
  }
  return found;
}"""

# A cell cut off by a box that hides its overflow (the admin's .form-row), or past the screen's edge, with no box
# that scrolls in between: the page itself never gets wider, so its scrollWidth cannot tell.
CLIPPED = """(selector) => {
  const found = [], width = window.innerWidth;
  for (const cell of document.querySelectorAll(selector)) {
    const box = cell.getBoundingClientRect();
    if (!box.width) continue;
    for (let up = cell.parentElement; up; up = up.parentElement) {
      const overflow = getComputedStyle(up).overflowX;
      if (['auto', 'scroll'].includes(overflow)) {
        if (up.getBoundingClientRect().right > width + 0.5) found.push(`a scroll box ends past the screen`);
        break;
      }
      const edge = up === document.documentElement ? width : up.getBoundingClientRect().right;
      if ((['hidden', 'clip'].includes(overflow) || up === document.documentElement) && box.right > edge + 0.5) {
        found.push(`"${cell.innerText.trim().slice(0, 30)}" ends at ${Math.round(box.right)}px, clipped at `
                   + `${Math.round(edge)}px by ${up.tagName.toLowerCase()}.${[...up.classList].join('.')}`);
        break;
      }
    }
  }
  return found;
}"""


@pytest.fixture
def site(live_server, demo_task, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API runs an event loop
    pool = local_cpu_pool()
    board = LeaderboardFactory(name="vectoradd", problem=problem_from(demo_task), gpu_types=[pool.cpu])
    return live_server.url, board, pool


def session_of(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def test_a_right_to_left_override_in_a_name_reverses_nothing_after_it(site, browser):  # noqa: F811
    base, board, pool = site
    mallory = UserFactory(username=RLO_NAME, is_staff=True, is_superuser=True)  # made before sign-up's rule reached
    # the management commands; staff, to see the admin's tables too
    mine = submission(board, mallory)
    with_ratio(mine, 1500.0, 0.8)
    with_ratio(submission(board, UserFactory(username="grace")), 2500.0, 1.2)
    do_recompute_ranks(board.pk, pool.cpu.pk)
    entry = BoardEntry.objects.get(user=mallory)  # its admin page's title and breadcrumbs name it
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.add_cookies([{"name": "sessionid", "value": session_of(mallory), "url": base}])
    page = context.new_page()
    problems = {}
    for name, path in [("home", "/"), ("board", f"/lb/{board.name}/"), ("submission", f"/s/{mine.pk}/"),
                       ("profile", f"/u/{RLO_NAME}/"), ("admin-entries", "/admin/leaderboards/boardentry/"),
                       ("admin-entry", f"/admin/leaderboards/boardentry/{entry.pk}/change/"),
                       ("admin-submissions", "/admin/leaderboards/submission/"), ("admin-users", "/admin/auth/user/")]:
        assert page.goto(base + path).status == 200, path
        assert page.locator(f"text={RLO_NAME}").count(), f"{path} names the user"
        if found := page.evaluate(NOT_ISOLATED, RLO_NAME):
            problems[name] = found
        shot(page, f"rlo-{name}")
        if name == "submission":  # "submission.py by <name> on vectoradd": the board's name still after the user's
            by = page.locator("main p.muted a[href^='/u/']").bounding_box()
            on = page.locator("main p.muted a[href^='/lb/']").bounding_box()
            assert on["x"] >= by["x"] + by["width"] - 1, (by, on)
    assert not problems, problems


def test_a_pasted_cli_id_is_linked_only_once_confirmed_and_declining_stops_the_waiting_cli(site, browser, tmp_path):  # noqa: F811
    base, _, _ = site
    UserFactory(username="ada", password=make_password(PASSWORD))
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    log_in(page, base, "ada")

    def waiting_cli(name: str) -> tuple[subprocess.Popen, str]:
        """`kernelbot login` with no token: prints an id to paste and waits for the link."""
        env = {**os.environ, "KERNELBOT_CONFIG": str(tmp_path / f"{name}.json"), "COLUMNS": "200"}
        cli = subprocess.Popen([sys.executable, "-m", "kernelbot.cli.main", "login", "--url", base], cwd=REPO,
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        printed = ""
        while not (found := re.search(r"paste this id:\s+(\S+)", printed)):
            line = cli.stdout.readline()
            assert line, printed
            printed += line
        return cli, found.group(1)

    def paste(cli_id: str) -> None:
        page.goto(f"{base}/tokens/link-cli/")
        page.fill("#cli-id", cli_id)
        page.click("#link-cli button[type=submit]")
        page.wait_for_selector("#confirm-link")
        warning = page.inner_text("#link-warning")
        assert "becomes an API token" in warning and "do not link it" in warning, warning
        assert "The kernelbot CLI on" in page.inner_text("#confirm-link")
        shot(page, "link-cli-confirm")
        assert not ApiToken.objects.exists(), "nothing linked before the user confirms"

    declined, declined_id = waiting_cli("declined")
    try:
        paste(declined_id)
        page.click("#confirm-link button[name=decline]")
        page.wait_for_url(f"{base}/tokens/")
        assert "Not linked" in page.inner_text("main")
        out, _ = declined.communicate(timeout=60)  # it polls every 2 s: it stops, told why
        assert declined.returncode != 0 and "declined" in out, out
        assert not ApiToken.objects.exists()
    finally:
        declined.kill()

    linked, linked_id = waiting_cli("linked")
    try:
        paste(linked_id)
        page.click("#confirm-link button[name=confirm]")
        page.wait_for_url(f"{base}/tokens/")
        out, _ = linked.communicate(timeout=60)
        assert linked.returncode == 0 and "as ada" in out, out
        assert ApiToken.objects.get().user.username == "ada"
    finally:
        linked.kill()


def test_the_final_standings_admin_clips_no_cell_on_a_phone(site, browser):  # noqa: F811
    base, board, pool = site
    organiser = UserFactory(username="organiser", is_staff=True, is_superuser=True)
    subs = [submission(board, UserFactory(username=f"competitor-with-a-long-name-{i}")) for i in range(4)]
    for i, sub in enumerate(subs):
        with_ratio(sub, 1000.0 * (i + 1), 0.5 * (i + 1))
    do_recompute_ranks(board.pk, pool.cpu.pk)
    board.deadline = timezone.now() - timedelta(hours=1)
    board.save(update_fields=["deadline"])
    final = Final.objects.create(leaderboard=board, top_n=10, rounds=3, status=FinalStatus.RUNNING)
    for i, sub in enumerate(subs):  # re-runs under way: one entry dropped out, the others wait for their turn
        FinalEntry.objects.create(final=final, gpu_type=pool.cpu, submission=sub, user=sub.user, board_rank=i + 1,
                                  position=i, dropped="re-run 1 on fresh inputs: failed: wrong answer on case 3"
                                  if i == 2 else "")
    context = browser.new_context(viewport={"width": 390, "height": 844})
    context.add_cookies([{"name": "sessionid", "value": session_of(organiser), "url": base}])
    page = context.new_page()
    assert page.goto(f"{base}/admin/leaderboards/final/{final.pk}/change/").status == 200
    shot(page, "narrow-admin-final")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390  # the check that missed it
    clipped = page.evaluate(CLIPPED, ".field-comparison td, .field-comparison th")
    assert not clipped, "\n".join(clipped)
    new_ranks = [row.split("\t")[3] for row in page.locator(".field-comparison tbody tr").all_inner_texts()]
    assert new_ranks == ["re-running", "re-running", "dropped", "re-running"]


def test_api_docs_render_with_the_network_cut_off(site, browser):  # noqa: F811
    base, _, _ = site
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    outside = []

    def only_local(route):
        host = urlsplit(route.request.url).hostname
        if host in ("127.0.0.1", "localhost"):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort("internetdisconnected")

    page.route("**/*", only_local)
    assert page.goto(f"{base}/api/docs").status == 200
    page.wait_for_selector(".swagger-ui .opblock", timeout=20_000)  # the operations, drawn by Swagger UI
    assert page.locator(".swagger-ui .opblock").count() > 10
    assert "kernelbot" in page.inner_text(".swagger-ui .info")
    shot(page, "api-docs-offline")
    assert not outside, outside


def test_on_a_phone_the_tokens_page_copies_and_keeps_revoke_in_view_and_submit_warns_of_its_board_only(
        site, browser):  # noqa: F811
    base, board, _ = site
    ada = UserFactory(username="ada")
    GpuType.objects.create(name="L4")  # another board's GPU type, served by no pool: unavailable
    LeaderboardFactory(name="on-l4", problem=board.problem, gpu_types=[GpuType.objects.get(name="L4")])
    context = browser.new_context(viewport={"width": 390, "height": 844})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=base)
    context.add_cookies([{"name": "sessionid", "value": session_of(ada), "url": base}])
    page = context.new_page()
    page.goto(f"{base}/tokens/")
    page.fill("#token-name", "a-laptop-with-a-rather-long-token-name")
    page.click("#create-token button[type=submit]")
    page.wait_for_selector("#new-token")
    page.click("#new-token button.copy")
    assert page.evaluate("navigator.clipboard.readText()") == page.inner_text("#token-value").strip()
    revoke = page.locator("button[name=revoke]").bounding_box()
    assert revoke["x"] >= 0 and revoke["x"] + revoke["width"] <= 390, revoke  # in view without scrolling sideways
    shot(page, "narrow-tokens-copied")

    page.goto(f"{base}/submit/?leaderboard={board.name}")
    assert page.locator("[data-unavailable]:visible").count() == 0  # L4 is not this board's
    assert page.locator("#submit-form").bounding_box()["y"] < 400
    page.select_option("select[name=leaderboard]", "on-l4")
    assert page.locator("[data-unavailable=L4]:visible").count() == 1  # the chosen board's GPU type is
    shot(page, "narrow-submit-other-board")
