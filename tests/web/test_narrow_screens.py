"""At 390 px (a phone), every page a competitor or an organiser opens fits the screen (issue 36): the page never
scrolls sideways, and nothing passes the screen's right edge unless it sits in a box that scrolls (wide tables do).
Screenshots land in $KERNELBOT_SCREENSHOTS_DIR (default: the temp dir's kernelbot-screenshots)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from leaderboards.models import Run
from leaderboards.ranks import do_recompute_ranks

from ..factories import LeaderboardFactory, UserFactory, local_cpu_pool, problem_from, submission
from ..leaderboards.test_ranks import with_ratio
from .test_browser import SHOTS, browser, shot  # noqa: F401 - fixtures

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
START = datetime(2026, 11, 1, tzinfo=UTC)

# What passes the viewport's right edge outside a box that scrolls it (overflow-x auto or scroll), and whether the
# document itself is wider than the viewport. Clipped (overflow hidden) content counts: it is cut off.
OVERFLOW = """() => {
  const width = window.innerWidth, found = [];
  if (document.documentElement.scrollWidth > width)
    found.push(`the page is ${document.documentElement.scrollWidth}px wide`);
  const scrolls = el => ['auto', 'scroll'].includes(getComputedStyle(el).overflowX);
  for (const el of document.body.querySelectorAll('*')) {
    const box = el.getBoundingClientRect();
    if (!box.width || !box.height || box.right <= width + 0.5 || getComputedStyle(el).visibility === 'hidden') continue;
    let up = el.parentElement, inside = false;
    for (; up && up !== document.body; up = up.parentElement)
      if (scrolls(up) && up.getBoundingClientRect().right <= width + 0.5) { inside = true; break; }
    const classes = typeof el.className === 'string' && el.className.trim()
      ? '.' + el.className.trim().split(/\\s+/).join('.') : '';
    if (!inside) found.push(`${el.tagName.toLowerCase()}${el.id ? '#' + el.id : ''}${classes} `
      + `"${(el.innerText || '').trim().slice(0, 40)}" ends at ${Math.round(box.right)}px`);
  }
  return found;
}"""
# Two boxes in one line that overlap: a line's text under a button, a status step over its neighbour.
OVERLAP = """(selectors) => {
  const found = [];
  for (const selector of selectors) {
    const els = [...document.querySelectorAll(selector)].filter(e => e.getBoundingClientRect().height);
    for (let i = 0; i < els.length; i++) for (let j = i + 1; j < els.length; j++) {
      const a = els[i].getBoundingClientRect(), b = els[j].getBoundingClientRect();
      if (a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1)
        found.push(`${selector}: "${els[i].innerText.trim().slice(0, 30)}" overlaps `
          + `"${els[j].innerText.trim().slice(0, 30)}"`);
    }
  }
  return found;
}"""
# A button set in a line of text (the board's "Submit a kernel") must not cover the text around it.
BUTTON_OVER_TEXT = """() => {
  const found = [];
  for (const button of document.querySelectorAll('main a.button, main button')) {
    const b = button.getBoundingClientRect();
    if (!b.height) continue;
    const walker = document.createTreeWalker(button.parentElement, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      if (button.contains(node) || !node.textContent.trim()) continue;
      const range = document.createRange();
      range.selectNodeContents(node);
      for (const t of range.getClientRects())
        if (t.left < b.right - 1 && b.left < t.right - 1 && t.top < b.bottom - 1 && b.top < t.bottom - 1)
          found.push(`"${button.innerText.trim()}" covers "${node.textContent.trim().slice(0, 30)}"`);
    }
  }
  return found;
}"""
OVERLAPPING = ["main > *", "main .card > *", ".timeline li", "header.top nav > *", "#content-main > *"]


@pytest.fixture
def site(live_server, demo_task, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API runs an event loop
    pool = local_cpu_pool()
    node = pool.nodes.first() or pool.nodes.create(hostname="box")
    node.sandbox = {"mode": "auto", "backend": "bubblewrap", "memory_cgroup_error": "",  # what a container reports
                    "memory_cgroup": "v1 /sys/fs/cgroup/memory/process_api/8ca1c30f4a7a1686f968b1d3922756dd"}
    node.save(update_fields=["sandbox"])
    board = LeaderboardFactory(name="vectoradd-with-a-rather-long-name", problem=problem_from(demo_task),
                               gpu_types=[pool.cpu])
    ada = UserFactory(username="ada-lovelace-the-analytical", is_staff=True, is_superuser=True)
    for i, (mean, ratio) in enumerate([(1200.0, 0.8), (1500.0, 0.6), (2500.0, 1.3), (9100.0, 2.0)]):
        with_ratio(submission(board, UserFactory(username=f"competitor-with-long-name-{i}"), created=START
                              + timedelta(hours=i)), mean, ratio)
    mine = submission(board, ada)
    with_ratio(mine, 3000.0, 0.7)
    submission(board, ada, mode="test")  # still queued: its steps show where it stands
    do_recompute_ranks(board.pk, pool.cpu.pk)  # no cluster here to run the task it queued
    client = Client()
    client.force_login(ada)
    return live_server.url, client.cookies["sessionid"].value, board, mine


def pages(board, mine) -> list[tuple[str, str]]:
    return [("home", "/"), ("board", f"/lb/{board.name}/"), ("submit", "/submit/"), ("join", "/join/"),
            ("submission", f"/s/{mine.pk}/"), ("queued-submission", f"/s/{mine.pk + 1}/"),
            ("user", "/u/ada-lovelace-the-analytical/"), ("tokens", "/tokens/"), ("gpus", "/gpus/"),
            ("admin-index", "/admin/"), ("admin-upload", "/admin/leaderboards/problem/upload/"),
            ("admin-leaderboards", "/admin/leaderboards/leaderboard/"),
            ("admin-submissions", "/admin/leaderboards/submission/"), ("admin-runs", "/admin/leaderboards/run/"),
            ("admin-problems", "/admin/leaderboards/problem/"), ("admin-entries", "/admin/leaderboards/boardentry/"),
            ("admin-pools", "/admin/runners/gpupool/"), ("admin-users", "/admin/auth/user/"),
            ("admin-leaderboard", f"/admin/leaderboards/leaderboard/{board.pk}/change/"),
            ("admin-run", f"/admin/leaderboards/run/{Run.objects.filter(submission=mine).first().pk}/change/")]


def test_every_page_fits_a_phone(site, browser):  # noqa: F811 - the site first: its data outside Playwright's loop
    base, session, board, mine = site
    context = browser.new_context(viewport={"width": 390, "height": 844})
    context.add_cookies([{"name": "sessionid", "value": session, "url": base}])
    page = context.new_page()
    problems = {}
    for name, path in pages(board, mine) + [("new-token", "/tokens/")]:
        response = page.goto(base + path)
        assert response.status == 200, path
        if name == "new-token":  # the page that shows a created token and the commands that use it
            page.click("#create-token button[type=submit]")
            page.wait_for_selector("#new-token")
            path += " (a token created)"
        page.wait_for_load_state("networkidle")
        shot(page, f"narrow-{name}")
        found = page.evaluate(OVERFLOW) + page.evaluate(OVERLAP, OVERLAPPING) + page.evaluate(BUTTON_OVER_TEXT)
        if name in ("board", "user"):  # the chart's time axis: two different, readable moments
            start, end = (page.text_content(f"#chart .x-{edge}") for edge in ("start", "end"))
            assert start and end == "now" and start != end, (start, end)
        if name == "home":  # no list of boards scrolls sideways: a board's deadline, entrants and leader in view
            assert page.evaluate("[...document.querySelectorAll('main .table-scroll')]"
                                 ".every(box => box.scrollWidth <= box.clientWidth)")
            for label in ("Deadline", "Entrants", "Leader"):
                box = page.locator(f"table.boards td[data-label={label}]").first.bounding_box()
                assert box and box["width"] and box["x"] + box["width"] <= 390, (label, box)
        if name == "board":  # the board ranks on the ratio to the reference, and so does its chart
            assert page.text_content("#chart .y-title") == "× reference, lower is better"
            assert page.text_content("#chart .y-bottom") == "0.600×"
            page.locator("#chart").screenshot(path=str(SHOTS / "narrow-board-chart.png"))
        if found:
            problems[path] = found[:8]
    assert not problems, "\n".join(f"{path}:\n  " + "\n  ".join(found) for path, found in problems.items())
