"""In a real browser (Debian's chromium driven by Playwright): a new user signs up, submits a correct demo
kernel from the Submit page and watches it run live, while a second, anonymous page on the leaderboard
sees their rank appear without reloading; a wrong kernel shows the checker's message.

Daphne and a django-q2 cluster run as separate processes on the embedded defaults (ORM broker,
per-process channel layers bridged by the LiveEvent outbox) against the PostgreSQL test database, so
every live update genuinely crosses processes."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from django.contrib.auth.hashers import make_password
from django.db import connection

from leaderboards import actions, lifecycle

from ..conftest import IN_CI, REPO, stop_groups
from ..factories import LeaderboardFactory, UserFactory, local_cpu_pool, problem_from, ranked_result, submission
from ..leaderboards.test_lifecycle import dispatch

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
SOLUTIONS = REPO / "problems" / "demo" / "vectoradd_py" / "solutions"
# Regenerate the README's pictures with KERNELBOT_SCREENSHOTS_DIR=docs/screenshots; a plain run leaves the tree clean.
SHOTS = Path(os.environ.get("KERNELBOT_SCREENSHOTS_DIR") or Path(tempfile.gettempdir()) / "kernelbot-screenshots")
CHROMIUM = os.environ.get("KERNELBOT_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def browser():
    if not os.path.exists(CHROMIUM):
        if IN_CI:
            pytest.fail(f"{CHROMIUM} is missing; .ci/run installs Debian's chromium")
        pytest.skip(f"{CHROMIUM} not installed")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield browser
        browser.close()


def platform_env(tmp_path: Path) -> dict[str, str]:
    """The platform's processes' environment: the test database, the embedded defaults otherwise (no Redis)."""
    db = connection.settings_dict
    return {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DJANGO_ALLOW_ASYNC_UNSAFE")} | {
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        "KERNELBOT_RUNS_DIR": str(tmp_path / "runs"), "Q_WORKERS": "2", "KERNELBOT_REL_CI": "0.05",
        "KERNELBOT_CASE_BUDGET_S": "0.5", "KERNELBOT_MAX_SAMPLES": "100", "KERNELBOT_LIVE_OUTBOX_POLL": "0.1"}


@pytest.fixture
def platform(postgres, tmp_path, demo_task, monkeypatch):
    """The demo leaderboard, then daphne + qcluster subprocesses on the test database."""
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API runs an event loop
    pool = local_cpu_pool()
    board = LeaderboardFactory(name="vectoradd", problem=problem_from(demo_task), gpu_types=[pool.cpu])
    env = platform_env(tmp_path)
    port = free_port()
    logs = tmp_path / "logs"
    logs.mkdir()
    children = [
        subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                          "kernelbot.asgi:application"], cwd=REPO, env=env, start_new_session=True,
                         stdout=(logs / "daphne.log").open("w"), stderr=subprocess.STDOUT),
        subprocess.Popen([sys.executable, "manage.py", "qcluster"], cwd=REPO, env=env, start_new_session=True,
                         stdout=(logs / "qcluster.log").open("w"), stderr=subprocess.STDOUT),
        subprocess.Popen([sys.executable, "-m", "runners.harness.node", "--platform", f"http://127.0.0.1:{port}",
                          "--pool", pool.name, "--hostname", "localhost", "--workdir", env["KERNELBOT_RUNS_DIR"],
                          "--poll", "0.2"], cwd=REPO, env=env, start_new_session=True,
                         stdout=(logs / "agent.log").open("w"), stderr=subprocess.STDOUT),
    ]
    Path(env["KERNELBOT_RUNS_DIR"]).mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.2)
    try:
        yield f"http://127.0.0.1:{port}", board
    finally:
        stop_groups(*children)
        connection.close()  # opened inside Playwright's event-loop context, which pytest-django's teardown never sees
        if os.environ.get("KERNELBOT_KEEP_LOGS"):
            shutil.copytree(logs, REPO / "var" / "browser-logs", dirs_exist_ok=True)


def shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


FASTER_RESULT = """
from leaderboards import actions
from leaderboards.models import Leaderboard
from tests.factories import UserFactory, ranked_result, submission
from tests.leaderboards.test_lifecycle import dispatch

for run in submission(Leaderboard.objects.get(name="{board}"), user=UserFactory(username="grace")).runs.all():
    result = ranked_result([1.0])
    result["ranked"][0].update(time=1.0, reference=1000.0, ratio=0.001, ratio_low=0.0009, ratio_high=0.0011)
    actions.do_ingest_result(run.pk, dispatch(run), result)
"""


@pytest.mark.slow(seconds=55)
def test_sign_up_submit_watch_live_and_see_the_rank_appear(browser, platform, tmp_path):
    base, board = platform
    spectator = browser.new_context(viewport={"width": 1200, "height": 900}).new_page()
    spectator.goto(f"{base}/lb/{board.name}/")
    spectator.wait_for_selector("#live-status.on", timeout=15_000)
    spectator.evaluate("window.kbNoReload = true")
    assert "No ranked submissions yet" in spectator.inner_text("#ranking")

    page = browser.new_context(viewport={"width": 1200, "height": 900}).new_page()
    page.goto(f"{base}/accounts/signup/")
    page.fill("input[name=username]", "ada")
    page.fill("input[name=password1]", "kernels-are-fun-42")
    page.fill("input[name=password2]", "kernels-are-fun-42")
    shot(page, "signup")
    page.click("form [type=submit]")
    page.wait_for_url(f"{base}/")
    page.click("text=Submit")
    page.select_option("select[name=leaderboard]", board.name)
    page.select_option("select[name=mode]", "leaderboard")
    page.set_input_files("input[name=file]", str(SOLUTIONS / "fast.py"))
    shot(page, "submit")
    page.click("#submit-form button[type=submit]")
    page.wait_for_url(f"{base}/s/*/")
    page.wait_for_selector("#live-status.on", timeout=15_000)
    page.evaluate("window.kbNoReload = true")
    # the badge moves on without a reload: dispatched/running arrive over the websocket
    page.wait_for_function("""() => [...document.querySelectorAll('[data-field=status]')]
        .some(b => /running|dispatched/i.test(b.textContent)) && window.kbNoReload""", timeout=60_000)
    shot(page, "submission-running")
    # the public run's results are swapped in as soon as it ends, the secret run's outcome when it does
    page.wait_for_selector("section.run h3:text-is('Ranked benchmarks')", timeout=180_000)
    page.wait_for_function("() => [...document.querySelectorAll('section.run')].every(s => s.dataset.status === "
                           "'succeeded')", timeout=180_000)
    shot(page, "submission-done")
    assert page.locator("section.run [data-field=status]").all_inner_texts() == ["Succeeded", "Succeeded"]

    spectator.wait_for_selector("#ranking tr[data-user] >> text=ada", timeout=60_000)
    assert spectator.evaluate("window.kbNoReload") is True  # it arrived live, no reload
    assert spectator.inner_text("#ranking tr[data-user] td.num").strip() == "1"
    shot(spectator, "leaderboard-live")

    # a faster result is appended to the record progression live (the delta carries that record alone): the list
    # and the chart then show what a reload shows
    subprocess.run([sys.executable, "manage.py", "shell", "-c", FASTER_RESULT.format(board=board.name)], cwd=REPO,
                   env=platform_env(tmp_path), check=True, timeout=120)  # as a runner's result reaches the platform
    spectator.wait_for_function("() => document.querySelector('#records summary').textContent === 'Records (2)'",
                                timeout=60_000)
    assert spectator.evaluate("window.kbNoReload") is True
    live_records = spectator.inner_html("#records")
    assert spectator.locator("#chart circle.record").count() == 2
    spectator.reload()
    assert spectator.inner_html("#records") == live_records

    page.goto(f"{base}/submit/?leaderboard={board.name}")
    page.select_option("select[name=mode]", "test")
    page.fill("textarea[name=code]", (SOLUTIONS / "wrong.py").read_text())
    page.click("#submit-form button[type=submit]")
    page.wait_for_selector("td.checker:not(:empty)", timeout=120_000)
    message = page.inner_text("td.checker:not(:empty)")
    assert message.strip(), "the checker's message is shown"
    shot(page, "wrong-kernel")


@pytest.mark.parametrize("width,height,device", [(390, 844, "phone"), (1280, 800, "desktop")])
def test_pages_never_scroll_sideways(browser, platform, width, height, device):
    base, board = platform
    author = UserFactory(username="a_rather_long_username_for_a_phone")
    author.set_password("kernels-are-fun-42")
    author.save()
    sub = submission(board, user=author)
    for run in sub.runs.all():  # twelve benchmark cases: a wide per-benchmark breakdown and submission tables
        lifecycle.do_ingest_result(run.pk, dispatch(run), ranked_result([77500.0 + 1000 * i for i in range(12)]))
    actions.do_recompute_ranks(board.pk, board.gpu_types.get().pk)

    page = browser.new_context(viewport={"width": width, "height": height}).new_page()
    page.goto(f"{base}/accounts/login/")
    page.fill("input[name=login]", author.username)
    page.fill("input[name=password]", "kernels-are-fun-42")
    page.click("form [type=submit]")
    page.wait_for_url(f"{base}/")
    for name, path in [("home", "/"), ("leaderboard", f"/lb/{board.name}/"), ("submission", f"/s/{sub.pk}/")]:
        page.goto(base + path)
        if name == "leaderboard":
            page.click("details.breakdown summary")  # open the per-benchmark breakdown, the widest table
            page.evaluate("document.querySelectorAll('.table-scroll').forEach(box => box.scrollLeft = 0)")
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        shot(page, f"{device}-{name}")
        assert overflow <= 0, f"{path} scrolls sideways by {overflow}px at {width}px wide"
    assert page.locator(".table-scroll table").count() >= 2  # the wide tables sit in their own scroll boxes


def test_admin_index_shows_the_groups_and_start_here(browser, platform):
    base, _ = platform
    UserFactory(username="organiser", is_staff=True, is_superuser=True, password=make_password("kernels-are-fun-42"))
    page = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
    page.goto(f"{base}/admin/login/?next=/admin/")
    page.fill("input[name=username]", "organiser")
    page.fill("input[name=password]", "kernels-are-fun-42")
    page.click("form [type=submit]")
    page.wait_for_selector(".start-here")
    shot(page, "admin-index")
    captions = page.locator("#content-main caption").all_inner_texts()
    assert [c.strip().lower() for c in captions] == ["competitions", "gpus and runners", "people and access",
                                                     "discord", "internals"]
    page.click(".start-here >> text=Check the GPU pools")
    page.wait_for_url(f"{base}/admin/runners/gpupool/")
