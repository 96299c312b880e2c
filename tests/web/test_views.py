"""Public pages: content, access rules, bad input and pinned query counts."""

import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.staticfiles import finders
from django.utils import timezone

from kernelbot.cli.directives import parse_directives, with_header
from leaderboards import actions, lifecycle
from leaderboards.board_rows import live_board
from leaderboards.models import Leaderboard, Profile, Submission, Visibility

from ..factories import UserFactory, ranked_result, submission
from ..leaderboards.test_lifecycle import dispatch

pytestmark = pytest.mark.django_db
GOOD = b"import torch\n\ndef custom_kernel(data):\n    a, b = data\n    return a + b\n"


def ranked_board(leaderboard, users: int) -> list:
    subs = []
    for i in range(users):
        sub = submission(leaderboard, user=UserFactory(username=f"racer{i}"))
        for run in sub.runs.all():
            result = ranked_result([1000.0 + 10 * i])
            result["ranked"][-1].update(ci_low=990.0, ci_high=1010.0, err=10.0)
            lifecycle.do_ingest_result(run.pk, dispatch(run), result)
        subs.append(sub)
    actions.do_recompute_ranks(leaderboard.pk, leaderboard.gpu_types.get().pk)
    return subs


def test_home_lists_open_boards_with_leader_and_entrants(client, leaderboard, django_assert_max_num_queries):
    ranked_board(leaderboard, 3)
    with django_assert_max_num_queries(4):
        page = client.get("/").content.decode()
    assert leaderboard.name in page and "racer0" in page and "1.000 µs" in page



def test_home_orders_open_boards_by_deadline_soonest_first(client, leaderboard):
    now = timezone.now()
    later = Leaderboard.objects.create(name="a-later", problem=leaderboard.problem, deadline=now + timedelta(days=30))
    soon = Leaderboard.objects.create(name="z-soon", problem=leaderboard.problem, deadline=now + timedelta(hours=2))
    Leaderboard.objects.filter(pk=leaderboard.pk).update(deadline=now + timedelta(days=7))
    page = client.get("/").content.decode()
    open_section = page[page.index("<h2>Open</h2>"):page.index("<h2>Past</h2>")]
    positions = [open_section.index(f">{lb.name}</a>") for lb in (soon, leaderboard, later)]
    assert positions == sorted(positions)


@pytest.mark.parametrize("users", [3, 60])
def test_leaderboard_page_ranks_description_files_and_fixed_queries(client, leaderboard, users,
                                                                    django_assert_max_num_queries):
    ranked_board(leaderboard, users)
    client.get(f"/lb/{leaderboard.name}/")  # warms the cached settings
    with django_assert_max_num_queries(8):  # the record chart is one, the measured spread another, on a cold process
        response = client.get(f"/lb/{leaderboard.name}/")
    page = response.content.decode()
    assert "<h1>Vector addition</h1>" in page and "racer0" in page and "990 ns – 1.010 µs" in page
    assert "reference.py" in page and "Python template" in page
    assert str(leaderboard.secret_seed) not in page
    assert ("page 1 of 2" in page) == (users > 50)


def test_leaderboard_page_shows_ratio_interval_and_statistical_ties(client, leaderboard):
    for i, (ratio, low, high) in enumerate([(0.50, 0.45, 0.55), (0.52, 0.47, 0.57), (0.90, 0.88, 0.92)]):
        for run in submission(leaderboard, user=UserFactory(username=f"racer{i}")).runs.all():
            result = ranked_result([1000.0])
            result["ranked"][-1].update(time=1000.0, ratio=ratio, ratio_low=low, ratio_high=high)
            lifecycle.do_ingest_result(run.pk, dispatch(run), result)
    actions.do_recompute_ranks(leaderboard.pk, leaderboard.gpu_types.get().pk)
    page = client.get(f"/lb/{leaderboard.name}/").content.decode()
    assert "0.500× (0.450–0.550)" in page and "0.900× (0.880–0.920)" in page
    rows = re.findall(r'<tr data-user="\d+"( class="tied")?', page)
    assert [bool(tied) for tied in rows] == [False, True, False]  # racer1 cannot be told from racer0
    assert "statistically" in page
    # each submission's page shows what ranks it, as the board does: the ratio, its interval, the rank and the ≈
    subs = list(Submission.objects.filter(leaderboard=leaderboard).order_by("pk"))
    tied = client.get(f"/s/{subs[1].pk}/").content.decode()
    assert re.search(r'id="standing">.*<strong>0\.520× \(0\.470–0\.570\)</strong>.* rank 2 <span class="tie-key"',
                     tied)
    clear = client.get(f"/s/{subs[2].pk}/").content.decode()
    assert "0.900× (0.880–0.920)" in clear and "rank 3" in clear and 'class="tie-key"' not in clear


def test_task_files_and_templates_download_but_nothing_else(client, leaderboard):
    template = client.get(f"/lb/{leaderboard.name}/template/Python")
    assert template.status_code == 200 and b"def custom_kernel" in template.content
    # KernelBot's header: submitted unchanged, the template names its board (and its one GPU type)
    assert template.content.startswith(f"#!POPCORN leaderboard {leaderboard.name}\n#!POPCORN gpu CPU\n".encode())
    assert parse_directives(template.content.decode()) == {"leaderboard": leaderboard.name, "gpu": "CPU"}
    assert client.get(f"/lb/{leaderboard.name}/file/reference.py").status_code == 200
    for bad in ("file/secret_seed", "template/Rust", "other/reference.py"):
        assert client.get(f"/lb/{leaderboard.name}/{bad}").status_code == 404


def test_markdown_is_sanitised(client, leaderboard):
    evil = "<script>alert(1)</script> [x](javascript:alert(1))"
    Leaderboard.objects.filter(pk=leaderboard.pk).update(description=evil)
    page = client.get(f"/lb/{leaderboard.name}/").content.decode()
    assert "<script>alert" not in page and 'href="javascript' not in page


def test_ranking_rows_escape_names_and_cases_on_the_page_and_in_live_rows(client, leaderboard):
    evil = '<img src=x onerror="alert(1)">'
    user = UserFactory(username="mallory")
    Profile.objects.create(user=user, display_name=evil)
    for run in submission(leaderboard, user=user).runs.all():
        result = ranked_result([1000.0])
        result["ranked"][-1]["spec"] = evil
        lifecycle.do_ingest_result(run.pk, dispatch(run), result)
    actions.do_recompute_ranks(leaderboard.pk, leaderboard.gpu_types.get().pk)
    page = client.get(f"/lb/{leaderboard.name}/").content.decode()
    live = live_board(leaderboard.pk, leaderboard.gpu_types.get().pk, "CPU", {user.pk: 1})["rows"][str(user.pk)]
    for html in (page, live):
        assert "<img" not in html and html.count("&lt;img src=x onerror=&quot;alert(1)&quot;&gt;") == 2  # name, case
    assert live in page  # the row a reload shows


def test_closed_leaderboard_is_hidden_from_the_public(client, leaderboard):
    Leaderboard.objects.filter(pk=leaderboard.pk).update(visibility=Visibility.CLOSED)
    assert client.get(f"/lb/{leaderboard.name}/").status_code == 404


def test_submit_page_redirects_to_the_submission(client, leaderboard):
    client.force_login(UserFactory())
    response = client.post("/submit/", {"leaderboard": leaderboard.name, "gpu": "CPU", "mode": "test",
                                        "code": GOOD.decode()})
    sub = Submission.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/s/{sub.pk}/"
    page = client.get(response["Location"]).content.decode()
    assert "Queued" in page and "def custom_kernel" in page and f"/ws/submission/{sub.pk}/" in page


def test_submit_needs_login(client, leaderboard):
    assert client.get("/submit/")["Location"].startswith("/accounts/login/")


@pytest.mark.parametrize(("change", "status", "message"), [
    ({"file": ("big.py", b"x" * (2 << 20))}, 413, "is 2097152 bytes; the limit is 1048576"),
    ({"file": ("latin.py", b"caf\xe9 = 1\n")}, 400, "not UTF-8"),
    ({"gpu": "H100"}, 400, "does not run on GPU"),
    ({"leaderboard": "nope"}, 404, "Unknown leaderboard"),
    ({"code": ""}, 400, "Upload a file or paste your code"),
])
def test_submit_rejects_bad_input_with_a_clear_message(client, leaderboard, change, status, message):
    from django.core.files.uploadedfile import SimpleUploadedFile

    client.force_login(UserFactory())
    data = {"leaderboard": leaderboard.name, "gpu": "CPU", "mode": "test", "code": GOOD.decode()}
    if "file" in change:
        data["code"], data["file"] = "", SimpleUploadedFile(*change.pop("file"))
    response = client.post("/submit/", {**data, **change})
    assert response.status_code == status and message in response.content.decode()
    assert not Submission.objects.exists()


def test_past_deadline_and_closed_board_are_refused(client, leaderboard):
    client.force_login(UserFactory())
    Leaderboard.objects.filter(pk=leaderboard.pk).update(deadline=timezone.now() - timedelta(hours=1))
    response = client.post("/submit/", {"leaderboard": leaderboard.name, "gpu": "CPU", "mode": "test",
                                        "code": GOOD.decode()})
    assert response.status_code == 403 and "no longer accepts submissions" in response.content.decode()
    leaderboard.deadline, leaderboard.visibility = timezone.now() + timedelta(hours=1), Visibility.CLOSED
    leaderboard.save()  # as the admin does: saving drops the per-process board cache the first post filled
    response = client.post("/submit/", {"leaderboard": leaderboard.name, "gpu": "CPU", "mode": "test",
                                        "code": GOOD.decode()})
    assert response.status_code == 404 and "Unknown leaderboard" in response.content.decode()


def test_other_users_submissions_hide_code_and_private_modes(client, leaderboard):
    ranked = ranked_board(leaderboard, 1)[0]
    private = submission(leaderboard, mode="test", code="secret sauce")
    client.force_login(UserFactory(username="stranger"))
    assert client.get(f"/s/{private.pk}/").status_code == 404
    page = client.get(f"/s/{ranked.pk}/").content.decode()
    assert "visible to its author and staff" in page and "custom_kernel" not in page
    assert client.get(f"/s/{ranked.pk}/code").status_code == 403
    assert client.get("/s/999999/").status_code == 404
    secret_run = ranked.runs.get(secret=True)
    assert client.get(f"/s/{ranked.pk}/runs/{secret_run.pk}/stdout.txt").status_code == 404


def test_code_becomes_public_after_deadline_only_where_allowed(client, leaderboard):
    sub = ranked_board(leaderboard, 1)[0]
    client.force_login(UserFactory(username="stranger"))
    Leaderboard.objects.filter(pk=leaderboard.pk).update(deadline=timezone.now() - timedelta(days=1))
    assert client.get(f"/s/{sub.pk}/code").status_code == 403
    Leaderboard.objects.filter(pk=leaderboard.pk).update(code_public_after_deadline=True)
    assert client.get(f"/s/{sub.pk}/code").status_code == 200


def test_secret_runs_show_pass_or_fail_only(client, leaderboard):
    sub = ranked_board(leaderboard, 1)[0]
    client.force_login(sub.user)
    page = client.get(f"/s/{sub.pk}/").content.decode()
    assert page.count("Runs with secret inputs show pass or fail and the run's time only") == 1
    assert page.count("Ranked benchmarks") == 1


def test_user_page_shows_ranks_and_history(client, leaderboard, django_assert_max_num_queries):
    sub = ranked_board(leaderboard, 2)[1]
    with django_assert_max_num_queries(7):
        page = client.get(f"/u/{sub.user.username}/").content.decode()
    assert leaderboard.name in page and "history-data" in page and f"/s/{sub.pk}/" in page
    assert '<td class="num">2</td>' in page  # the slower of two: its rank, read from the board's order


def test_every_page_has_a_favicon_and_favicon_ico_answers(client):
    page = client.get("/").content.decode()
    assert '<link rel="icon" href="/static/kb/favicon.svg" type="image/svg+xml">' in page
    redirect = client.get("/favicon.ico")
    assert redirect.status_code == 301 and redirect["Location"] == "/static/kb/favicon.svg"
    icon = finders.find("kb/favicon.svg")  # what whitenoise serves at that address
    assert icon and Path(icon).read_text().startswith("<svg")


def test_template_header_replaces_directives_and_uses_the_languages_comment():
    cuda = "//!POPCORN leaderboard old\n// a note\n__global__ void k() {}\n//!POPCORN gpu kept-in-code\n"
    assert with_header(cuda, "submission.cu", "grayscale", ["A100", "H100"]) == (
        "//!POPCORN leaderboard grayscale\n// a note\n__global__ void k() {}\n//!POPCORN gpu kept-in-code\n")
    assert with_header("def f(): ...\n", "submission.py", "vectoradd", ["H100"]) == (
        "#!POPCORN leaderboard vectoradd\n#!POPCORN gpu H100\ndef f(): ...\n")
