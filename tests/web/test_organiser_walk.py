"""In a real browser (issue 26): a first-time organiser re-imports a fixed problem onto a live board (unchanged,
then changed: refused without Force, previewed, confirmed), bans a user and takes them off the ranking, cancels a
competitor's runs, changes the ranking rule and rescores, and pauses and resumes submissions; a newcomer follows the
README: signs up, creates a token from the linked page, logs the CLI in with it and submits.

Uses test_browser.py's fixtures: daphne and a django-q2 cluster on the PostgreSQL test database."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from django.contrib.auth.hashers import make_password

from leaderboards import actions, lifecycle

from ..conftest import REPO
from ..factories import UserFactory, ranked_result, submission
from ..leaderboards.test_lifecycle import dispatch
from .test_browser import SOLUTIONS, browser, platform, platform_env, shot  # noqa: F401 - fixtures
from .test_first_hour import PASSWORD, log_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
DEMO = REPO / "problems" / "demo"


def demo_zip(tmp_path: Path, name: str, *, extra_benchmark: bool = False) -> Path:
    """The demo vectoradd problem as an organiser zips it (set/vectoradd_py + set/utils.py), optionally fixed."""
    root = tmp_path / name.removesuffix(".zip")
    shutil.copytree(DEMO / "vectoradd_py", root / "set" / "vectoradd_py")
    shutil.copy(DEMO / "utils.py", root / "set" / "utils.py")
    if extra_benchmark:
        task_yml = root / "set" / "vectoradd_py" / "task.yml"
        task_yml.write_text(task_yml.read_text().replace("benchmarks:", "benchmarks:\n  - {size: 77, seed: 1}", 1))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path in root.rglob("*"):
            if path.is_file():
                archive.write(path, str(path.relative_to(root)))
    target = tmp_path / name
    target.write_bytes(buffer.getvalue())
    return target


def ranked(board, username: str, means: list[float]):
    user = UserFactory(username=username, password=make_password(PASSWORD))
    for run in submission(board, user=user).runs.all():
        lifecycle.do_ingest_result(run.pk, dispatch(run), ranked_result(means))
    actions.do_recompute_ranks(board.pk, board.gpu_types.get().pk)
    return user


def confirm(page) -> None:
    """The admin's confirmation page: "Yes, …"."""
    page.click("form input[type=submit][value^='Yes']")
    page.wait_for_load_state()


def eventually(page, read, ok, timeout: float = 60) -> None:
    """Reloads `page` until `ok(read())`: what a worker does after commit takes a moment."""
    deadline = time.monotonic() + timeout
    while True:
        page.reload()
        value = read()
        if ok(value):
            return
        assert time.monotonic() < deadline, value
        time.sleep(0.5)


def messages(page) -> str:
    return " ".join(page.locator("ul.messagelist li").all_inner_texts())


def test_an_organiser_fixes_and_runs_a_live_board(browser, platform, tmp_path):  # noqa: F811
    base, board = platform
    grace = ranked(board, "grace", [1000.0, 4000.0])
    ranked(board, "honest", [2000.0, 5000.0])
    UserFactory(username="organiser", is_staff=True, is_superuser=True, password=make_password(PASSWORD))
    admin = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    log_in(admin, base, "organiser", admin=True)

    # 1. re-import the same problem: nothing changes, no preview
    admin.goto(f"{base}/admin/leaderboards/problem/upload/")
    admin.set_input_files("input[name=archive]", str(demo_zip(tmp_path, "vectoradd.zip")))
    admin.fill("input[name=leaderboard]", board.name)
    admin.click("#problem-upload input[type=submit]")
    admin.wait_for_url(re.compile(r".*/admin/leaderboards/leaderboard/\d+/change/"))
    assert f"Unchanged leaderboard {board.name}" in messages(admin)

    # 2. the fixed problem, GPU field empty: refused without Force, with what to tick
    fixed = demo_zip(tmp_path, "vectoradd-fixed.zip", extra_benchmark=True)
    admin.goto(f"{base}/admin/leaderboards/problem/upload/")
    admin.set_input_files("input[name=archive]", str(fixed))
    admin.fill("input[name=leaderboard]", board.name)
    admin.click("#problem-upload input[type=submit]")
    refusal = admin.inner_text("#problem-upload .errorlist.nonfield")
    assert "tick “Force” below" in refusal and "--force" not in refusal
    # ticked: a preview first, then the import with the kept zip
    admin.set_input_files("input[name=archive]", str(fixed))
    admin.check("input[name=force]")
    admin.click("#problem-upload input[type=submit]")
    admin.wait_for_selector("#import-preview li")
    assert admin.locator("#import-preview li").all_inner_texts() == [  # the GPU types and the rule stay
        f"{board.name}: problem vectoradd_py v1 → vectoradd_py v2"]
    shot(admin, "organiser-import-preview")
    admin.click("#confirm-import")
    admin.wait_for_url(re.compile(r".*/admin/leaderboards/leaderboard/\d+/change/"))
    assert "changed: problem vectoradd_py v1 → vectoradd_py v2" in messages(admin)
    board.refresh_from_db()
    assert [g.name for g in board.gpu_types.all()] == ["CPU"] and board.ranking_by == "last"
    spectator = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    assert spectator.goto(f"{base}/lb/{board.name}/").status == 200
    assert spectator.locator("nav.tabs a").all_inner_texts() == ["CPU"]

    # 3. ban grace from everything: the board's page names her, one button takes her off the ranking
    admin.goto(f"{base}/admin/leaderboards/ban/add/")
    assert "— every leaderboard —" in admin.inner_text("select[name=leaderboard]")
    assert "Empty: banned from every leaderboard" in admin.inner_text("#ban_form")
    admin.fill("input#id_user", str(grace.pk))
    admin.click("input[name=_save]")
    admin.goto(f"{base}/admin/leaderboards/leaderboard/{board.pk}/change/")
    assert "grace (#1 on CPU, banned)" in messages(admin)
    admin.click("a.kb-action >> text=Remove banned users from the rankings")
    confirm(admin)
    eventually(spectator, lambda: spectator.locator("#ranking tr[data-user]").all_inner_texts(),
               lambda rows: len(rows) == 1 and "honest" in rows[0])

    # 4. cancel a competitor's queued runs: they read "Cancelled by an organiser", not a failure
    ada = UserFactory(username="ada", password=make_password(PASSWORD))
    queued = submission(board, user=ada)  # runs stay queued: nothing dispatches a factory's runs
    admin.goto(f"{base}/admin/leaderboards/run/?q=ada")
    admin.check("#action-toggle")
    admin.select_option("select[name=action]", "cancel")
    admin.click("button[name=index]")
    confirm(admin)
    assert "Cancelled 2 runs." in messages(admin)
    competitor = browser.new_context(viewport={"width": 390, "height": 844}).new_page()
    log_in(competitor, base, "ada")
    competitor.goto(f"{base}/s/{queued.pk}/")
    competitor.wait_for_selector("[data-field=cancelled]")
    notes = competitor.locator("[data-field=cancelled]").all_inner_texts()
    assert len(notes) == 2 and all(n.startswith("Cancelled by an organiser") for n in notes)
    assert competitor.locator(".v-fail, .flash.error").count() == 0
    shot(competitor, "competitor-cancelled")

    # 5. change the ranking rule: the rescore is offered at once
    admin.goto(f"{base}/admin/leaderboards/leaderboard/{board.pk}/change/")
    admin.select_option("select[name=ranking_by]", "mean")
    admin.click("input[name=_save]")
    admin.wait_for_url(f"{base}/admin/leaderboards/leaderboard/{board.pk}/do/rescore/")
    assert "its scores still follow the old rule until you rescore" in messages(admin)
    confirm(admin)
    assert "scores changed" in messages(admin)
    eventually(spectator, lambda: spectator.inner_text("#rank-basis") + spectator.inner_text("#ranking"),
               lambda text: "ranked by arithmetic mean" in text and "3.500 µs" in text)  # honest's mean of 2, 5 µs

    # 6. pause and resume from the start page's link, with buttons
    admin.goto(f"{base}/admin/")
    admin.click(".start-here >> text=Pause or resume all new jobs")
    admin.wait_for_url(f"{base}/admin/leaderboards/jobswitch/1/change/")
    admin.click("a.kb-action >> text=Pause submissions")
    confirm(admin)
    competitor.goto(f"{base}/submit/?leaderboard={board.name}")
    competitor.select_option("select[name=mode]", "test")
    competitor.fill("textarea[name=code]", (SOLUTIONS / "fast.py").read_text())
    competitor.click("#submit-form button[type=submit]")
    competitor.wait_for_selector("text=Nothing was submitted")
    page_text = competitor.inner_text("body")
    assert page_text.count("Submissions are paused by the organisers") == 1 and "Nothing was submitted" in page_text
    admin.click("a.kb-action >> text=Resume submissions")
    confirm(admin)
    assert "accepted again" in messages(admin)
    competitor.reload()
    assert "paused" not in competitor.inner_text("body")


@pytest.mark.timeout(600)
def test_a_newcomer_follows_the_readme_from_sign_up_to_a_cli_submission(browser, platform, tmp_path):  # noqa: F811
    base, board = platform
    page = browser.new_context(viewport={"width": 390, "height": 844}).new_page()
    page.goto(f"{base}/accounts/signup/")
    page.fill("input[name=username]", "newcomer")
    page.fill("input[name=password1]", PASSWORD)
    page.fill("input[name=password2]", PASSWORD)
    page.click("form [type=submit]")
    page.wait_for_url(f"{base}/")
    page.click("header.top >> text=API tokens")
    page.wait_for_url(f"{base}/tokens/")
    page.click("#create-token button[type=submit]")
    token = page.inner_text("#new-token pre").strip()
    page.wait_for_load_state()  # measured before the stylesheet applied, the token's <pre> is as wide as its line
    assert page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0
    shot(page, "newcomer-token")

    cli = [str(Path(os.environ.get("VIRTUAL_ENV") or REPO / ".venv") / "bin" / "kernelbot")]
    if not Path(cli[0]).exists():
        cli = [str(Path(sys.executable).parent / "kernelbot")]
    env = {**platform_env(tmp_path), "KERNELBOT_CONFIG": str(tmp_path / "kernelbot.json"), "COLUMNS": "200"}
    login = subprocess.run([*cli, "login", "--url", base, "--token", token], env=env, capture_output=True,
                           text=True, timeout=60)
    assert login.returncode == 0 and "as newcomer" in login.stdout, login.stdout + login.stderr
    submitted = subprocess.run([*cli, "submit", str(SOLUTIONS / "fast.py"), "--leaderboard", board.name, "--gpu",
                                "CPU", "--mode", "leaderboard"], env=env, capture_output=True, text=True, timeout=400)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    assert "succeeded" in submitted.stdout and "score" in submitted.stdout
    page.goto(f"{base}/lb/{board.name}/")
    page.wait_for_selector("#ranking tr[data-user] >> text=newcomer", timeout=60_000)
