"""The organiser's first hour and the competitor's views, in a real browser (Debian's chromium, Playwright) against
daphne and a real qcluster (the `platform` fixture of test_browser.py): an organiser adds a GPU type and a pool with
a device, imports a zip whose task reaches a shared file through ../, opens the new leaderboard, and later requeues
a run through its confirmation page; a competitor submits and watches at 1280 px while a spectator's live row must
equal the reloaded row, then the pages are checked at 390 px. No page may scroll sideways."""

from __future__ import annotations

import zipfile

import pytest
from django.contrib.auth.hashers import make_password

from leaderboards.models import Leaderboard, Run, RunStatus
from runners.models import Gpu, GpuPool

from ..factories import UserFactory
from .test_browser import SOLUTIONS, browser, platform, shot  # noqa: F401

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
DEMO = SOLUTIONS.parent.parent
PASSWORD = "kernels-are-fun-42"


def no_sideways_scroll(page, what: str) -> None:
    page.evaluate("document.querySelectorAll('.table-scroll').forEach(box => box.scrollLeft = 0)")
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"{what} scrolls sideways by {overflow}px at {page.viewport_size['width']}px wide"


def log_in(page, base: str, username: str, admin: bool = False) -> None:
    if admin:
        page.goto(f"{base}/admin/login/?next=/admin/")
        page.fill("input[name=username]", username)
    else:
        page.goto(f"{base}/accounts/login/")
        page.fill("input[name=login]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("form [type=submit]")
    page.wait_for_load_state()


def problem_zip(path) -> str:
    with zipfile.ZipFile(path, "w") as archive:
        for file in (DEMO / "vectoradd_py").rglob("*"):
            if file.is_file() and "solutions" not in file.parts:
                archive.write(file, f"demo/vectoradd_py/{file.relative_to(DEMO / 'vectoradd_py')}")
        archive.write(DEMO / "utils.py", "demo/utils.py")  # task.yml names ../utils.py
    return str(path)


def ranking_row(page, user: str) -> str:
    return page.eval_on_selector(f"#ranking tr[data-user]:has(a[href='/u/{user}/'])", "tr => tr.innerHTML")


def test_organiser_first_hour_and_competitor_views(browser, platform, tmp_path):  # noqa: F811
    base, _ = platform
    UserFactory(username="organiser", is_staff=True, is_superuser=True, password=make_password(PASSWORD))
    admin = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    log_in(admin, base, "organiser", admin=True)
    admin.wait_for_selector(".start-here")
    no_sideways_scroll(admin, "the admin index")

    # a GPU type, then a pool with its device on the pool's own page: this machine already serves the local pool,
    # and one machine serves one pool (two would hand a device two runs at once), so the pool refuses it and says
    # why; the organiser names the lab's own machine instead
    admin.goto(f"{base}/admin/runners/gputype/add/")
    admin.fill("input[name=name]", "L4")
    admin.click("input[name=_save]")
    admin.goto(f"{base}/admin/runners/gpupool/add/")
    admin.fill("input[name=name]", "lab")
    admin.fill("input[name='devices-0-hostname']", "localhost")
    admin.select_option("select[name='devices-0-gpu_type']", label="L4")
    admin.fill("input[name='devices-0-index']", "0")
    admin.click("input[name=_save]")
    refusal = admin.inner_text(".errorlist")
    assert "Refused:" in refusal and "localhost already belongs to pool local" in refusal, refusal
    assert not GpuPool.objects.filter(name="lab").exists()
    admin.fill("input[name='devices-0-hostname']", "lab-1")
    admin.select_option("select[name='devices-0-gpu_type']", label="CPU")
    admin.click("input[name=_save]")
    admin.wait_for_selector(".messagelist .success")
    pool = GpuPool.objects.get(name="lab")
    assert Gpu.objects.filter(node__pool=pool, node__hostname="lab-1", gpu_type__name="CPU", index=0).exists()
    admin.goto(f"{base}/admin/runners/gpupool/{pool.pk}/change/")
    admin.wait_for_selector("input[name='devices-0-hostname']")
    shot(admin, "admin-pool")

    # the zip import, its shared ../utils.py beside the problem's folder, lands on the new leaderboard
    admin.goto(f"{base}/admin/")
    admin.click(".start-here >> text=Import a problem")
    assert "../utils.py needs set/utils.py beside that folder" in admin.inner_text("#problem-upload")
    admin.set_input_files("input[name=archive]", problem_zip(tmp_path / "vectoradd.zip"))
    admin.fill("input[name=leaderboard]", "firsthour")
    admin.fill("input[name=deadline]", "2030-01-01 00:00")
    admin.fill("input[name=gpus]", "CPU")
    admin.click("#problem-upload input[type=submit]")
    admin.wait_for_selector(".messagelist .success >> text=Created leaderboard firsthour")
    board = Leaderboard.objects.get(name="firsthour")
    assert admin.url.endswith(f"/admin/leaderboards/leaderboard/{board.pk}/change/")
    assert admin.get_attribute(".messagelist a[href='/lb/firsthour/']", "href")
    admin.fill("textarea[name=description]", "Welcome to the **first hour**.")
    admin.click("input[name=_continue]")
    admin.wait_for_selector(".messagelist .success")

    # a competitor submits while a spectator watches the leaderboard live
    spectator = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    spectator.goto(f"{base}/lb/firsthour/")
    spectator.wait_for_selector("#live-status.on", timeout=15_000)
    spectator.evaluate("window.kbNoReload = true")
    UserFactory(username="ada", password=make_password(PASSWORD))
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    log_in(page, base, "ada")
    page.goto(f"{base}/submit/?leaderboard=firsthour")
    page.select_option("select[name=mode]", "leaderboard")
    page.set_input_files("input[name=file]", str(SOLUTIONS / "fast.py"))
    page.click("#submit-form button[type=submit]")
    page.wait_for_url(f"{base}/s/*/")
    page.wait_for_selector("#live-status.on", timeout=15_000)
    page.evaluate("window.kbNoReload = true")
    # the queued note goes once a run starts; each run's results appear as it finishes, without a reload
    page.wait_for_function("() => !document.querySelector('.flash.queued-note')", timeout=120_000)
    page.wait_for_selector("section.run h3:text-is('Ranked benchmarks')", timeout=240_000)
    page.wait_for_function("() => [...document.querySelectorAll('section.run')].every(s => s.dataset.status === "
                           "'succeeded') && !document.querySelector('#scores[hidden]')", timeout=240_000)
    assert page.evaluate("window.kbNoReload") is True
    live_stamps = page.locator(".timeline span").all_inner_texts()
    page.reload()
    assert page.locator(".timeline span").all_inner_texts() == live_stamps  # one time format, live or reloaded
    shot(page, "submission-final")
    no_sideways_scroll(page, "the submission page")

    spectator.wait_for_selector("#ranking tr[data-user] >> text=ada", timeout=60_000)
    assert spectator.evaluate("window.kbNoReload") is True  # it arrived live
    live = {"row": ranking_row(spectator, "ada"), "pager": spectator.inner_text("#pager"),
            "records": spectator.inner_text("#records summary")}
    spectator.reload()
    spectator.wait_for_selector("#ranking tr[data-user]")
    assert live == {"row": ranking_row(spectator, "ada"), "pager": spectator.inner_text("#pager"),
                    "records": spectator.inner_text("#records summary")}
    assert "1 entrant" in live["pager"] and live["records"] == "Records (1)"
    no_sideways_scroll(spectator, "the leaderboard")

    # the organiser requeues the public run from its page, through the confirmation
    run = Run.objects.get(submission__leaderboard=board, secret=False)
    for path in ("run/", "submission/", f"submission/{run.submission_id}/change/", "leaderboard/"):
        admin.goto(f"{base}/admin/leaderboards/{path}")
        no_sideways_scroll(admin, f"the admin's {path}")
    shot(admin, "admin-leaderboards")
    admin.goto(f"{base}/admin/leaderboards/run/{run.pk}/change/")
    assert "µs" in admin.inner_text(".field-score_text")
    shot(admin, "admin-run")
    no_sideways_scroll(admin, "the run's admin page")
    admin.click("a.kb-action >> text=Requeue")
    admin.wait_for_selector("text=Requeue run")
    shot(admin, "admin-requeue-confirm")
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED  # the question alone changes nothing
    admin.click("input[type=submit][value='Yes, requeue']")
    admin.wait_for_selector(".messagelist .success >> text=Requeued run")
    # the submission's page shows none of the earlier attempt's results, then the new attempt's when it ends
    page.goto(f"{base}/s/{run.submission_id}/")
    card = page.locator(f"section[data-run='{run.pk}']")
    if card.get_attribute("data-status") != "succeeded":
        assert "Benchmarks" not in card.inner_text() and "77" not in card.locator("h2").inner_text()
    page.wait_for_function(f"() => document.querySelector('section[data-run=\"{run.pk}\"]').dataset.status "
                           "=== 'succeeded'", timeout=240_000)
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED and run.attempt == 2

    # the competitor's pages on a phone
    phone = browser.new_context(viewport={"width": 390, "height": 844}).new_page()
    log_in(phone, base, "ada")
    for name, path in [("home", "/"), ("leaderboard", "/lb/firsthour/"), ("submission", f"/s/{run.submission_id}/")]:
        phone.goto(base + path)
        shot(phone, f"phone-{name}")
        no_sideways_scroll(phone, path)
