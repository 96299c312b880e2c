"""What the site says, said right (issue 36, item 5): the CLI a link names, a published final's own ranks, a closed
board asked for on the submit page, a problem name that would read as another, and when a pool began failing."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from leaderboards import finals, ranks
from leaderboards.access.models import ApiToken
from leaderboards.models import Leaderboard, Problem, Run
from runners.models import CheckOutcome, GpuType, PoolCheck, PoolHealth
from taskspec.loader import TaskFileError, load_task_from_zip

from ..factories import LeaderboardFactory, UserFactory, submission
from ..leaderboards.test_lifecycle import finish
from .test_admin_zip_import import demo_zip, errors, post

pytestmark = pytest.mark.django_db
RLO = "\u202e"


@pytest.mark.parametrize("start, named, token", [
    (lambda c: c.post("/api/v1/auth/cli").json()["cli_id"], "the kernelbot CLI", "kernelbot CLI"),
    (lambda c: json.loads(c.get("/popcorn/auth/init?provider=github").content)["state"], "popcorn-cli",
     "popcorn-cli (github)")])
def test_linking_a_cli_names_the_cli_that_asked(client, start, named, token):
    cli_id = start(client)
    client.force_login(UserFactory(username="linker"))
    page = client.post("/tokens/link-cli/", {"cli_id": cli_id, "confirm": "yes"}, follow=True).content.decode()
    assert f"Your CLI is linked: {named} can submit as you now." in page
    assert ApiToken.objects.get(user__username="linker").name == token
    assert ("popcorn" in page.split("Your CLI is linked")[1].split(".")[0]) == (named == "popcorn-cli")


def test_a_published_finals_admin_page_shows_its_published_ranks(leaderboard, cpu_pool, monkeypatch, admin_client):
    monkeypatch.setattr("leaderboards.tasks.dispatch_run", lambda run_id: None)
    for i in range(3):
        sub = submission(leaderboard, UserFactory(username=f"racer{i}"), code=f"k{i}")
        finish(sub, [1000.0 * (i + 1)])
        ranks.do_rank_result(sub.runs.get(secret=True).pk)
    leaderboard.deadline, leaderboard.final_rounds = timezone.now() - timedelta(minutes=1), 1
    leaderboard.save(update_fields=["deadline", "final_rounds"])

    def verify(times: dict[int, float]):
        final = finals.do_start_final(leaderboard, requested_by=UserFactory(is_staff=True), publish_when_done=False)
        gpu = cpu_pool.cpu.pk
        finals.advance(final.pk, gpu)
        while run := Run.objects.filter(submission__final_entry__final=final, status="queued").first():
            finish(run.submission, [times[run.submission.final_entry.position]])
            finals.advance(final.pk, gpu)
        return final

    first = finals.do_publish_final(verify({0: 3000.0, 1: 1000.0, 2: 2000.0}))  # the board's 2nd wins
    table = admin_client.get(f"/admin/leaderboards/final/{first.pk}/change/").content.decode()
    rows = re.findall(r"<tr><td>CPU</td><td><bdi>(racer\d)</bdi></td><td[^>]*>(\d)</td><td[^>]*>(\d)</td>"
                      r"<td[^>]*>(.)</td>", table)
    assert rows == [("racer1", "2", "1", "1"), ("racer2", "3", "2", "2"), ("racer0", "1", "3", "3")]
    second = verify({0: 1000.0, 1: 2000.0, 2: 3000.0})  # a later re-run, compared with the published one
    assert [(r["user"], r["rank"], r["published_rank"]) for r in finals.compare(second)] == \
        [("racer0", 1, 3), ("racer1", 2, 1), ("racer2", 3, 2)]


def test_the_submit_page_says_an_asked_for_board_is_closed_and_preselects_no_other(client, leaderboard):
    closed = LeaderboardFactory(name="last-year", problem=leaderboard.problem, gpu_types=leaderboard.gpu_types.all(),
                                deadline=timezone.now() - timedelta(days=1))
    soon = LeaderboardFactory(name="next-week", problem=leaderboard.problem, gpu_types=leaderboard.gpu_types.all(),
                              starts_at=timezone.now() + timedelta(days=7))
    client.force_login(UserFactory())

    def shown(asked: str) -> tuple[str, str | None]:
        page = client.get(f"/submit/?leaderboard={asked}").content.decode()
        refusal = re.search(r'id="board-refused">(.*?)</div>', page, re.S)
        select = re.search(r'<select name="leaderboard".*?</select>', page, re.S).group()
        chosen = re.search(r'<option value="([^"]*)" selected>', select)
        return (refusal.group(1) if refusal else ""), (chosen.group(1) if chosen else None)

    refusal, chosen = shown(closed.name)
    assert refusal.startswith(f"Leaderboard &#x27;{closed.name}&#x27; closed at ") and "no longer accepts" in refusal
    assert chosen in (None, "") and refusal.endswith("Choose an open leaderboard below.")
    assert "opens at" in shown(soon.name)[0] and shown(soon.name)[1] in (None, "")
    assert "Unknown leaderboard" in shown("nope")[0]
    assert shown(leaderboard.name) == ("", leaderboard.name)
    assert shown(leaderboard.name.upper()) == ("", leaderboard.name)  # names match case-insensitively
    assert shown("")[0] == ""


@pytest.mark.parametrize("char, named", [(RLO, "U+202E RIGHT-TO-LEFT OVERRIDE"), ("\u200b", "U+200B ZERO WIDTH SPACE"),
                                         ("\x1b", "U+001B a control character")])
def test_a_problem_name_that_would_read_as_another_is_refused_at_the_door(admin_client, char, named):
    folder = f"vec{char}dda_py"
    with pytest.raises(TaskFileError) as refused:
        load_task_from_zip(demo_zip(f"set/{folder}/").getvalue())
    message = str(refused.value)
    assert f"'vec\\u{ord(char):04x}dda_py' holds {named}: control and bidirectional formatting characters" in message
    assert "rename the folder with visible characters only" in message and char not in message

    GpuType.objects.get_or_create(name="CPU", defaults={"vendor": "cpu"})
    page = post(admin_client, demo_zip(f"set/{folder}/"), leaderboard="vec-dda", deadline="2030-01-01")
    assert page.status_code == 400 and any(named in e for e in errors(page.content.decode()))
    assert not Problem.objects.exists() and not Leaderboard.objects.filter(name="vec-dda").exists()


def test_a_failing_pools_admin_mark_says_when_the_failure_began(admin_client, cpu_pool):
    now = timezone.now().replace(second=0, microsecond=0)
    began, last = now - timedelta(hours=5), now - timedelta(minutes=10)
    for at, outcome in ((now - timedelta(hours=9), CheckOutcome.FAILING), (now - timedelta(hours=6), CheckOutcome.OK),
                        (began, CheckOutcome.FAILING), (now - timedelta(hours=2), CheckOutcome.FAILING),
                        (last, CheckOutcome.FAILING)):
        PoolCheck.objects.create(pool=cpu_pool, started_at=at - timedelta(minutes=1), finished_at=at, outcome=outcome)
    cpu_pool.health, cpu_pool.last_ok_at, cpu_pool.last_checked_at = PoolHealth.FAILING, now - timedelta(hours=6), last
    cpu_pool.save(update_fields=["health", "last_ok_at", "last_checked_at"])
    expected = f"✖ Failing since {began:%Y-%m-%d %H:%M} UTC"
    assert expected in admin_client.get("/admin/runners/gpupool/").content.decode()
    assert expected in admin_client.get(f"/admin/runners/gpupool/{cpu_pool.pk}/change/").content.decode()
    cpu_pool.last_ok_at = None  # never passed: failing since its first check
    cpu_pool.save(update_fields=["last_ok_at"])
    first = now - timedelta(hours=9)
    assert f"Failing since {first:%Y-%m-%d %H:%M} UTC" in admin_client.get("/admin/runners/gpupool/").content.decode()
    cpu_pool.health = PoolHealth.OK
    cpu_pool.save(update_fields=["health"])
    assert "since" not in re.search(r'<td class="field-health_mark">.*?</td>',
                                    admin_client.get("/admin/runners/gpupool/").content.decode(), re.S).group()
