"""In a real browser (Debian's chromium driven by Playwright): an open board page learns that its final standings
started and were published without a reload (issue 36, item 3). The pages are the site's own, rendered by Django at
each stage; the browser runs the real site.js against a stand-in websocket that delivers the consumer's events
(tests/web/test_consumers.py checks the consumer sends them), so this needs neither PostgreSQL nor a server."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from leaderboards import finals
from leaderboards.models import Run

from ..conftest import REPO
from .test_browser import browser  # noqa: F401 - the fixture
from .test_consumers import dispatch, lifecycle, ranked_result
from .test_views import ranked_board

pytestmark = [pytest.mark.django_db, pytest.mark.slow]
SITE = "http://kb.test"
FAKE_SOCKET = """
window.sockets = [];
window.WebSocket = class {
  constructor(url) { this.url = url; window.sockets.push(this); setTimeout(() => this.onopen && this.onopen(), 0); }
  send() {}
  close() {}
};
window.deliver = (msg) => window.sockets.at(-1).onmessage({ data: JSON.stringify(msg) });
"""


@pytest.fixture
def stages(leaderboard, cpu_pool, monkeypatch):
    """The board page as a reload shows it: closed and waiting, its final standings being verified, published."""
    monkeypatch.setattr("leaderboards.tasks.dispatch_run", lambda run_id: None)
    ranked_board(leaderboard, 2)
    leaderboard.deadline, leaderboard.final_rounds = timezone.now() - timedelta(minutes=1), 1
    leaderboard.save(update_fields=["deadline", "final_rounds"])
    page = f"/lb/{leaderboard.name}/"
    shown = {"waiting": Client().get(page).content.decode()}
    final = finals.do_start_final(leaderboard)
    finals.advance(final.pk, cpu_pool.cpu.pk)
    shown["running"] = Client().get(page).content.decode()
    while run := Run.objects.filter(submission__final_entry__final=final, status="queued").first():
        lifecycle.do_ingest_result(run.pk, dispatch(run), ranked_result([800.0]))
        finals.run_finished(run.pk)
    shown["published"] = Client().get(page).content.decode()
    return page, final, shown


def open_page(browser, page: str, shown: dict[str, str], now: dict[str, str]):  # noqa: F811
    """A tab on the board page; the site answers with the stage `now` names, and counts the page's fetches."""
    tab = browser.new_context().new_page()
    tab.add_init_script(FAKE_SOCKET)
    fetches = []

    def answer(route):
        path = route.request.url.removeprefix(SITE)
        if path.startswith("/static/"):
            return route.fulfill(path=str(REPO / "static" / path.removeprefix("/static/")))
        if path.split("?")[0] == page:
            fetches.append(now["stage"])
            return route.fulfill(body=shown[now["stage"]], content_type="text/html; charset=utf-8")
        return route.fulfill(status=404, body="")
    tab.route(f"{SITE}/**", answer)
    tab.goto(SITE + page)
    tab.wait_for_function("() => window.sockets.length && window.sockets[0].onmessage")
    tab.evaluate("window.loadedOnce = true")  # gone if the page reloads
    return tab, fetches


def test_the_board_page_shows_the_verification_then_the_final_table_without_a_reload(stages, browser):  # noqa: F811 - the pages before the browser
    page, final, shown = stages
    now = {"stage": "waiting"}
    tab, fetches = open_page(browser, page, shown, now)
    assert "will be re-run" in tab.inner_text("#final-status") and tab.locator("#final-standings").count() == 0

    now["stage"] = "running"
    tab.evaluate("deliver", {"type": "final", "final": final.pk, "status": "running"})
    tab.wait_for_function("() => /final standings being verified/.test(document.querySelector('#final-status')"
                          ".textContent)")
    assert "runs done" in tab.inner_text("#final-status") and "provisional" in tab.inner_text("#ranking-title")

    now["stage"] = "published"
    tab.evaluate("deliver", {"type": "final", "final": final.pk, "status": "published"})
    tab.wait_for_selector("#final-standings")
    assert tab.locator("#final-status").count() == 0
    assert tab.inner_text("#ranking-title").startswith("Board before the re-verification")
    rows = tab.locator("#final-ranking tbody tr").all_inner_texts()
    assert [row.split("\t")[1] for row in rows] == ["racer0", "racer1"]
    assert tab.evaluate("window.loadedOnce") is True and fetches == ["waiting", "running", "published"]
    assert tab.locator("#live-status.on").count() == 1  # the socket's status mark was not swapped out


def test_a_page_that_missed_the_event_catches_up_from_the_snapshot(stages, browser):  # noqa: F811 - the pages before the browser
    page, final, shown = stages
    now = {"stage": "running"}
    tab, fetches = open_page(browser, page, shown, now)
    version = int(tab.get_attribute("#live-status", "data-version"))
    snapshot = {"type": "snapshot", "version": version, "entries": [], "final": f"/{final.pk}"}
    tab.evaluate("deliver", snapshot)  # what the page shows: nothing to fetch
    now["stage"] = "published"
    tab.evaluate("deliver", {**snapshot, "final": f"{final.pk}/"})  # a reconnect after the publication
    tab.wait_for_selector("#final-standings")
    assert fetches == ["running", "published"] and tab.evaluate("window.loadedOnce") is True
