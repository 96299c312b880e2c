"""A whole competition in one session, in a real browser (issue 36, "Done means"): a newcomer follows the README's
links and signs up, an organiser logs into the admin, imports a problem zip onto a new board and sets its finals, three
competitors submit (a web upload, a web paste and the kernelbot CLI with a token), test-mode runs with private code
among them, while a second, anonymous tab keeps the board open and sees the ranks arrive live; the organiser moves
the deadline near, it passes, the scheduled finals re-run the top entries and publish them, and the open tab shows
"final standings being verified" and then the final table without a reload. Then:
- the finals' re-runs are nobody's own: no competitor's list (site, API, CLI) shows one, the API marks one as a re-run
  of its original, and the published standings keep every entry (deleting an original is refused on the CLI, the API
  and the admin);
- red team: the anonymous dataset export holds only code the anonymous site serves (every parquet row's code is
  fetched from /s/<id>/code as an anonymous visitor and must match), and none of the private test-mode code;
- every page opened, by anyone, fits 1280 px and 390 px screens (test_narrow_screens.OVERFLOW: nothing passes the
  right edge outside a box that scrolls).

Uses test_browser.py's fixtures: daphne, a django-q2 cluster and a node agent on the PostgreSQL test database."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from django.contrib.auth.hashers import make_password
from django.utils import timezone
from django_q.models import Schedule

from leaderboards.models import Final, FinalStatus, Leaderboard, Submission

from ..conftest import REPO
from ..factories import UserFactory
from .test_browser import SOLUTIONS, browser, platform, platform_env, shot  # noqa: F401 - fixtures
from .test_first_hour import PASSWORD, log_in, problem_zip
from .test_narrow_screens import OVERFLOW

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
BOARD = "walk"
README = (REPO / "README.md").read_text()
WIDTHS = (1280, 390)


class Screens:
    """Checks every page it is shown at 1280 and 390 px, and collects what does not fit (reported at the end)."""

    def __init__(self) -> None:
        self.checked: list[str] = []
        self.problems: dict[str, list[str]] = {}

    def fit(self, page, what: str = "") -> None:
        page.wait_for_load_state()
        own = page.viewport_size
        label = what or page.url.split("//", 1)[-1].split("/", 1)[-1]
        for width in WIDTHS:
            page.set_viewport_size({"width": width, "height": 900})
            page.evaluate("document.querySelectorAll('.table-scroll').forEach(box => box.scrollLeft = 0)")
            found = page.evaluate(OVERFLOW)
            if found:
                self.problems[f"/{label} at {width}px"] = found[:6]
        page.set_viewport_size(own)
        self.checked.append(label)

    def open(self, page, url: str, what: str = "", status: int = 200):
        response = page.goto(url)
        assert response.status == status, (url, response.status)
        self.fit(page, what)
        return response


def cli_runner(tmp_path: Path, name: str):
    """The kernelbot CLI (`.venv/bin/kernelbot`'s module, this checkout's) run by its user, with their own config."""
    command = [sys.executable, "-m", "kernelbot.cli.main"]
    env = {**platform_env(tmp_path), "KERNELBOT_CONFIG": str(tmp_path / f"{name}.json"), "COLUMNS": "250"}

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([*command, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    return run


def private(solution: str, who: str) -> tuple[str, str]:
    """A correct kernel with a line only its author (and staff) may ever read: (code, the secret line)."""
    secret = f"# {who}'s private experiment PRIVATE-{who}-{abs(hash(who)) % 10**6}"
    return (SOLUTIONS / solution).read_text() + f"\n{secret}\n", secret


def wait_until(check, what, timeout: float = 240):
    """Polls `check` until it is true; `what` (text, or a function giving it at the end) names what never came."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"waited {timeout:.0f} s for {what() if callable(what) else what}"
        time.sleep(0.5)
    return value


@pytest.mark.timeout(1200)
@pytest.mark.slow(seconds=270)
def test_a_whole_competition_from_the_readme_to_the_published_dataset(browser, platform, tmp_path):  # noqa: F811
    base, _ = platform
    screens = Screens()
    phone, desktop = {"width": 390, "height": 844}, {"width": 1280, "height": 900}

    # --- a newcomer opens what the README links, then signs up on a phone -----------------------------------------
    newcomer = browser.new_context(viewport=phone).new_page()
    linked = sorted({m.group(1) or "/" for m in re.finditer(r"http://127\.0\.0\.1:8000(/[\w/.-]*)?", README)})
    assert {"/", "/admin/", "/tokens/"} <= set(linked), linked
    for path in linked:
        if path.startswith("/popcorn"):
            continue  # popcorn-cli's API base, not a page
        screens.open(newcomer, base + path, f"README {path} (anonymous)")
    assert "/accounts/login/" in newcomer.url  # /tokens/ asks a visitor to log in first
    screens.open(newcomer, f"{base}/accounts/signup/")
    newcomer.fill("input[name=username]", "carol")
    newcomer.fill("input[name=password1]", PASSWORD)
    newcomer.fill("input[name=password2]", PASSWORD)
    newcomer.click("form [type=submit]")
    newcomer.wait_for_url(f"{base}/")
    screens.fit(newcomer, "(home, signed up)")
    newcomer.click("header.top >> text=API tokens")
    newcomer.wait_for_url(f"{base}/tokens/")
    screens.fit(newcomer, "tokens/")
    newcomer.click("#create-token button[type=submit]")
    token = newcomer.inner_text("#new-token pre").strip()
    screens.fit(newcomer, "tokens/ (a token created)")

    # --- the organiser imports a problem onto a new board and sets its finals --------------------------------------
    UserFactory(username="organiser", is_staff=True, is_superuser=True, password=make_password(PASSWORD))
    admin = browser.new_context(viewport=desktop).new_page()
    log_in(admin, base, "organiser", admin=True)
    admin.wait_for_selector(".start-here")
    screens.fit(admin, "admin/")
    admin.click(".start-here >> text=Import a problem")
    screens.fit(admin, "admin: import a problem")
    admin.set_input_files("input[name=archive]", problem_zip(tmp_path / "vectoradd.zip"))
    admin.fill("input[name=leaderboard]", BOARD)
    admin.fill("input[name=deadline]", f"{timezone.now() + timedelta(hours=2):%Y-%m-%d %H:%M}")
    admin.fill("input[name=gpus]", "CPU")
    admin.click("#problem-upload input[type=submit]")
    admin.wait_for_selector(f".messagelist .success >> text=Created leaderboard {BOARD}")
    board = Leaderboard.objects.get(name=BOARD)
    screens.fit(admin, "admin: the new leaderboard")
    admin.check("input[name=code_public_after_deadline]")
    admin.fill("input[name=final_top_n]", "3")
    admin.fill("input[name=final_rounds]", "1")
    admin.click("input[name=_continue]")
    admin.wait_for_selector(".messagelist .success")
    board.refresh_from_db()
    assert board.code_public_after_deadline and (board.final_top_n, board.final_rounds) == (3, 1)

    # --- an anonymous second tab keeps the board open --------------------------------------------------------------
    spectator = browser.new_context(viewport=desktop).new_page()
    screens.open(spectator, f"{base}/lb/{BOARD}/", "lb/walk/ (anonymous, open)")
    spectator.wait_for_selector("#live-status.on", timeout=15_000)
    spectator.evaluate("window.kbNoReload = true")

    # --- three competitors submit: a web upload, a web paste, the CLI --------------------------------------------
    for username in ("ada", "bob"):
        UserFactory(username=username, password=make_password(PASSWORD))
    ada = browser.new_context(viewport=desktop).new_page()
    log_in(ada, base, "ada")
    screens.open(ada, f"{base}/submit/?leaderboard={BOARD}")
    ada.select_option("select[name=mode]", "leaderboard")
    ada.set_input_files("input[name=file]", str(SOLUTIONS / "fast.py"))
    ada.click("#submit-form button[type=submit]")
    ada.wait_for_url(f"{base}/s/*/")
    screens.fit(ada, "ada's submission")

    bob = browser.new_context(viewport=phone).new_page()
    log_in(bob, base, "bob")
    bob_test, bob_secret = private("correct.py", "bob")
    for mode, code in (("leaderboard", (SOLUTIONS / "correct.py").read_text() + "\n# bob\n"), ("test", bob_test)):
        screens.open(bob, f"{base}/submit/?leaderboard={BOARD}")
        bob.select_option("select[name=mode]", mode)
        bob.fill("textarea[name=code]", code)
        bob.click("#submit-form button[type=submit]")
        bob.wait_for_url(f"{base}/s/*/")
        screens.fit(bob, f"bob's {mode} submission")

    carol = cli_runner(tmp_path, "carol")
    login = carol("login", "--url", base, "--token", token)
    assert login.returncode == 0 and "as carol" in login.stdout, login.stdout + login.stderr
    carol_test, carol_secret = private("correct.py", "carol")
    (tmp_path / "carol_test.py").write_text(carol_test)
    (tmp_path / "carol.py").write_text((SOLUTIONS / "correct.py").read_text() + "\n# carol\n")
    for file, mode in (("carol_test.py", "test"), ("carol.py", "leaderboard")):
        done = carol("submit", str(tmp_path / file), "--leaderboard", BOARD, "--gpu", "CPU", "--mode", mode,
                     timeout=600)
        assert done.returncode == 0 and "succeeded" in done.stdout, done.stdout + done.stderr

    # the open tab sees all three ranked, live
    spectator.wait_for_function("() => document.querySelectorAll('#ranking tr[data-user]').length === 3",
                                timeout=300_000)
    assert spectator.evaluate("window.kbNoReload") is True
    assert {row.split("\t")[1] for row in spectator.locator("#ranking tr[data-user]").all_inner_texts()} == {
        "ada", "bob", "carol"}
    screens.fit(spectator, "lb/walk/ (three ranked, live)")
    tests = list(Submission.objects.filter(leaderboard=board, mode="test").order_by("pk"))
    assert [s.user.username for s in tests] == ["bob", "carol"]
    wait_until(lambda: all(s.done for s in Submission.objects.filter(leaderboard=board)), "every run to end")
    # the live chart plots and labels what a reload does (the board ranks on the ratio to the reference)
    reloaded = browser.new_context(viewport=desktop).new_page()
    screens.open(reloaded, f"{base}/lb/{BOARD}/", "lb/walk/ (anonymous, reloaded)")
    axis = "() => ['.y-title', '.y-top', '.y-bottom'].map(c => document.querySelector('#chart ' + c)?.textContent)"
    assert reloaded.evaluate(axis)[0] == "× reference, lower is better"
    wait_until(lambda: spectator.evaluate(axis) == reloaded.evaluate(axis),
               lambda: f"the live chart {spectator.evaluate(axis)} to read as reloaded {reloaded.evaluate(axis)}", 30)
    assert spectator.evaluate("window.kbNoReload") is True

    # --- the organiser moves the deadline near; it passes; the scheduled finals run and publish --------------------
    deadline = timezone.now() + timedelta(seconds=20)
    # as migration 0016 makes it (a flushed test DB lost it), its next minute's tick falling due at the deadline (the
    # cluster's scheduler looks every 30 s): the finals start at the first look past the deadline, not a minute on
    Schedule.objects.update_or_create(name="final standings", defaults={
        "func": "leaderboards.tasks.verify_finals", "schedule_type": "I", "minutes": 1, "repeats": -1,
        "next_run": deadline})
    admin.goto(f"{base}/admin/leaderboards/leaderboard/{board.pk}/change/")
    admin.fill("input[name=deadline_0]", f"{deadline:%Y-%m-%d}")
    admin.fill("input[name=deadline_1]", f"{deadline:%H:%M:%S}")
    admin.click("input[name=_continue]")
    admin.wait_for_selector(".messagelist .success")
    screens.fit(admin, "admin: the leaderboard, deadline moved")
    board.refresh_from_db()
    assert abs((board.deadline - deadline).total_seconds()) < 1
    time.sleep(max(0.0, (deadline - timezone.now()).total_seconds()) + 1)
    late = carol("submit", str(tmp_path / "carol.py"), "--leaderboard", BOARD, "--gpu", "CPU", "--no-wait")
    assert late.returncode != 0 and "Submitted" not in late.stdout, late.stdout

    # the open tab hears the finals start, then their publication, without a reload
    spectator.wait_for_function("() => /final standings being verified/i.test("
                                "document.querySelector('#final-status')?.textContent || '')", timeout=180_000)
    screens.fit(spectator, "lb/walk/ (being verified)")
    spectator.wait_for_selector("#final-standings", timeout=300_000)
    assert spectator.evaluate("window.kbNoReload") is True
    final = Final.objects.get(leaderboard=board)
    assert final.status == FinalStatus.PUBLISHED and final.requested_by is None
    rows = spectator.locator("#final-ranking tbody tr").all_inner_texts()
    assert sorted(row.split("\t")[1] for row in rows) == ["ada", "bob", "carol"], rows
    assert spectator.locator("#final-status").count() == 0
    # and the board's head as a reload shows it: closed, at the deadline the organiser moved, nothing to submit
    assert "closed" in spectator.inner_text("#board-name")
    assert spectator.locator("#board-meta a.button").count() == 0
    assert datetime.fromisoformat(spectator.get_attribute("#board-meta time", "datetime")) == board.deadline
    shot(spectator, "walk-final-published")
    screens.fit(spectator, "lb/walk/ (final standings, live)")

    # --- the finals' re-runs are nobody's own; the published standings keep every entry ---------------------------
    copies = {s.user.username: s for s in Submission.objects.filter(final_entry__final=final)}
    originals = {e.user.username: e.submission_id for e in final.entries.all()}
    assert sorted(copies) == ["ada", "bob", "carol"]
    for name, page in (("ada", ada), ("bob", bob), ("carol", newcomer)):
        screens.open(page, f"{base}/u/{name}/", f"u/{name}/ (own page)")
        own = page.locator("main a[href^='/s/']").evaluate_all("links => links.map(a => a.getAttribute('href'))")
        assert f"/s/{originals[name]}/" in own and f"/s/{copies[name].pk}/" not in own, (name, own)
        screens.open(page, f"{base}/s/{copies[name].pk}/", f"{name}'s finals re-run")
        assert page.locator("#rerun-of").count() == 1
    listed = carol("submissions", "list", "--leaderboard", BOARD)
    assert listed.returncode == 0 and f" {originals['carol']} " in listed.stdout, listed.stdout
    assert f" {copies['carol'].pk} " not in listed.stdout
    shown = carol("submissions", "show", str(copies["carol"].pk))
    assert f"re-run 1 of #{originals['carol']} for the final standings" in shown.stdout, shown.stdout
    bearer = {"Authorization": f"Bearer {token}"}
    api = newcomer.request.get(f"{base}/api/v1/submissions?leaderboard={BOARD}", headers=bearer).json()
    assert copies["carol"].pk not in {r["id"] for r in api["results"]} and originals["carol"] in {
        r["id"] for r in api["results"]}
    popcorn = newcomer.request.get(f"{base}/popcorn/user/submissions?leaderboard={BOARD}",
                                   headers={"X-Popcorn-Cli-Id": token}).json()
    assert originals["carol"] in {r["id"] for r in popcorn} and copies["carol"].pk not in {r["id"] for r in popcorn}
    detail = newcomer.request.get(f"{base}/api/v1/submissions/{copies['carol'].pk}", headers=bearer).json()
    assert detail["rerun_of"] == {"submission_id": originals["carol"], "round": 1, "final_id": final.pk}

    published = list(final.entries.order_by("pk").values_list("pk", "submission_id", "rank", "score"))
    refused = carol("submissions", "delete", str(originals["carol"]), "--yes")
    assert refused.returncode != 0 and "published final standings" in refused.stdout, refused.stdout
    answer = newcomer.request.delete(f"{base}/api/v1/submissions/{originals['carol']}", headers=bearer)
    assert answer.status == 409 and "cannot be deleted" in answer.json()["detail"]
    admin.goto(f"{base}/admin/leaderboards/submission/{originals['ada']}/delete/")
    if admin.locator("form input[type=submit]").count():  # the confirmation page, if the admin offers one
        admin.click("form input[type=submit]")
    admin.wait_for_load_state()
    assert "published standings stay as they were published" in admin.inner_text("body")
    screens.fit(admin, "admin: deleting a finalist's submission")
    assert list(final.entries.order_by("pk").values_list("pk", "submission_id", "rank", "score")) == published
    assert Submission.objects.filter(pk__in=originals.values()).count() == 3

    # --- red team: the anonymous dataset holds nothing the anonymous site hides ------------------------------------
    visitor = browser.new_context(viewport=phone, accept_downloads=True).new_page()
    screens.open(visitor, f"{base}/lb/{BOARD}/", "lb/walk/ (anonymous, after the finals)")
    with visitor.expect_download() as download:
        visitor.click("#dataset-download")
    table = pq.read_table(download.value.path()).to_pylist()
    assert table, "the dataset is empty"
    for row in table:
        served = visitor.request.get(f"{base}/s/{row['submission_id']}/code")
        assert served.status == 200 and served.text() == row["code"], (
            f"a leak: the dataset holds submission {row['submission_id']}'s code, which the anonymous site "
            f"answers {served.status}")
    assert {row["submission_id"] for row in table} == set(originals.values())
    dumped = "\n".join(row["code"] for row in table)
    assert bob_secret not in dumped and carol_secret not in dumped
    for hidden in tests + list(copies.values()):
        assert visitor.request.get(f"{base}/s/{hidden.pk}/code").status in (403, 404), hidden.pk
        assert visitor.request.get(f"{base}/s/{hidden.pk}/").status == 404, hidden.pk

    assert len(screens.checked) >= 25
    assert not screens.problems, "\n".join(f"{where}:\n  " + "\n  ".join(found)
                                           for where, found in screens.problems.items())
