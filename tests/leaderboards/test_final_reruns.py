"""The final standings' re-runs belong to the finals (issue 36, item 2): never listed or deletable as the
competitor's own on any front-end, marked as re-runs naming their original in the admin and on their page, and
deletable by nobody, staff included, until the standings are published."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from discordbot import service
from discordbot.identity import user_for_discord
from leaderboards import actions, finals, ranks
from leaderboards.access.actions import do_create_token
from leaderboards.errors import Refused
from leaderboards.models import Final, FinalStatus, Run, Submission

from ..factories import UserFactory, submission
from .test_lifecycle import finish

pytestmark = pytest.mark.django_db
ADMIN = {"Authorization": "Bearer s3cret-admin"}
FINALIST = 7101


@pytest.fixture
def rerun(leaderboard, cpu_pool, monkeypatch):
    """A closed board whose one entry (a Discord user's) is being re-verified: its first re-run is queued."""
    monkeypatch.setattr("leaderboards.tasks.dispatch_run", lambda run_id: None)
    owner = user_for_discord(FINALIST, "finalist")
    original = submission(leaderboard, owner, code="def custom_kernel(data):  # finalist\n    ...")
    finish(original, [1000.0])
    ranks.do_rank_result(original.runs.get(secret=True).pk)
    leaderboard.deadline, leaderboard.final_rounds = timezone.now() - timedelta(minutes=1), 1
    leaderboard.save(update_fields=["deadline", "final_rounds"])
    final = finals.do_start_final(leaderboard)
    finals.advance(final.pk, cpu_pool.cpu.pk)
    copy = Submission.objects.get(final_entry__final=final)
    assert copy.user == owner and copy.mode == "leaderboard" and copy.created > leaderboard.deadline
    return copy, original


def publish(copy: Submission) -> None:
    finish(copy, [900.0])
    finals.advance(copy.final_entry.final_id, copy.runs.get().gpu_type_id)
    assert Final.objects.get(pk=copy.final_entry.final_id).status == FinalStatus.PUBLISHED


def test_the_api_and_popcorn_neither_list_nor_delete_a_rerun_as_the_competitors_own(rerun, client):
    copy, original = rerun
    bearer = {"Authorization": f"Bearer {do_create_token(copy.user)[1]}"}
    cli = {"X-Popcorn-Cli-Id": do_create_token(copy.user)[1]}
    listed = client.get("/api/v1/submissions", headers=bearer).json()
    assert [r["id"] for r in listed["results"]] == [original.pk] and listed["count"] == 1
    assert [r["id"] for r in client.get("/popcorn/user/submissions", headers=cli).json()] == [original.pk]

    for answer in (client.delete(f"/api/v1/submissions/{copy.pk}", headers=bearer),
                   client.delete(f"/popcorn/user/submissions/{copy.pk}", headers=cli)):
        assert answer.status_code == 403, answer.content
        assert f"re-run of your submission {original.pk} for the final standings" in answer.json()["detail"]
    # nor may they pull their original out from under the re-verification (its re-runs would go with it)
    answer = client.delete(f"/api/v1/submissions/{original.pk}", headers=bearer)
    assert answer.status_code == 409 and "being re-verified for the final standings" in answer.json()["detail"]
    assert Submission.objects.filter(pk__in=[copy.pk, original.pk]).count() == 2
    assert copy.runs.get().status == "queued"  # not cancelled, not re-run

    publish(copy)
    assert client.delete(f"/api/v1/submissions/{copy.pk}", headers=bearer).status_code == 403  # never theirs
    assert Submission.objects.filter(pk=copy.pk).exists()


def test_nobody_deletes_a_rerun_through_the_service_layer_until_the_standings_are_published(rerun, client,
                                                                                           settings):
    copy, original = rerun
    refusals = []
    for submission_ in (copy, original):
        with pytest.raises(Refused) as refused:
            actions.do_delete_submission(submission_)
        refusals.append((refused.value.status, refused.value.message))
    assert refusals[0] == (409, f"Submission {copy.pk} is re-run 1 of submission {original.pk} for the final "
                                f"standings of '{copy.leaderboard.name}': it belongs to them and cannot be deleted "
                                "until they are published.")
    assert refusals[1][0] == 409 and f"Submission {original.pk} is being re-verified" in refusals[1][1]
    settings.ADMIN_TOKEN = "s3cret-admin"
    answer = client.delete(f"/popcorn/admin/submissions/{copy.pk}", headers=ADMIN)
    assert answer.status_code == 409 and f"re-run 1 of submission {original.pk}" in answer.json()["detail"]

    organiser = user_for_discord(7102, "organiser")
    organiser.is_staff = True
    organiser.save(update_fields=["is_staff"])
    asking = service.Member(7102, "organiser")
    for command in (service.describe_for_delete, service.delete_submission):
        with pytest.raises(service.BotError, match="cannot be deleted until they are published"):
            command(asking, copy.pk)
    assert Submission.objects.filter(pk=copy.pk).exists() and copy.runs.get().status == "queued"

    publish(copy)
    assert "Delete submission" in service.describe_for_delete(asking, copy.pk)
    assert client.delete(f"/popcorn/admin/submissions/{copy.pk}", headers=ADMIN).status_code == 200
    assert not Submission.objects.filter(pk=copy.pk).exists()


def test_discord_show_personal_lists_only_what_the_competitor_made(rerun):
    copy, original = rerun
    shown = service.show_personal(service.Member(FINALIST, "finalist"), copy.leaderboard.name)
    assert f"#{original.pk} " in shown and f"#{copy.pk} " not in shown


def test_the_user_page_lists_no_rerun_and_the_reruns_page_names_its_original(rerun, client):
    copy, original = rerun
    client.force_login(copy.user)
    listing = client.get(f"/u/{copy.user.username}/").content.decode()
    assert f"/s/{original.pk}/" in listing and f"/s/{copy.pk}/" not in listing
    page = client.get(f"/s/{copy.pk}/").content.decode()
    assert 'id="rerun-of"' in page and f'href="/s/{original.pk}/">submission #{original.pk}</a>' in page
    assert 'id="rerun-of"' not in client.get(f"/s/{original.pk}/").content.decode()
    client.force_login(UserFactory(username="stranger"))
    assert client.get(f"/s/{copy.pk}/").status_code == 404  # the original is the public one


def test_the_admin_marks_reruns_and_refuses_to_delete_them_until_published(rerun, admin_client):
    copy, original = rerun
    listing = admin_client.get("/admin/leaderboards/submission/").content.decode()
    assert f"re-run 1 of <a href=\"/admin/leaderboards/submission/{original.pk}/change/\">#{original.pk}</a>" \
        in listing
    assert listing.count("re-run 1 of") == 1
    only_reruns = admin_client.get("/admin/leaderboards/submission/?made_by=finals").content.decode()
    assert f"/admin/leaderboards/submission/{copy.pk}/change/" in only_reruns
    assert f"/admin/leaderboards/submission/{original.pk}/change/\">{original.pk}<" not in only_reruns
    change = admin_client.get(f"/admin/leaderboards/submission/{copy.pk}/change/").content.decode()
    assert f"final standings #{copy.final_entry.final_id}" in change

    one = admin_client.post(f"/admin/leaderboards/submission/{copy.pk}/delete/", {"post": "yes"}).content.decode()
    assert f"re-run 1 of submission {original.pk}" in one and "cannot be deleted until they are published" in one
    bulk = admin_client.post("/admin/leaderboards/submission/", {
        "action": "delete_selected", "_selected_action": [copy.pk, original.pk], "post": "yes"}).content.decode()
    assert "cannot be deleted until they are published" in bulk and "being re-verified" in bulk
    assert Submission.objects.filter(pk__in=[copy.pk, original.pk]).count() == 2

    publish(copy)
    response = admin_client.post(f"/admin/leaderboards/submission/{copy.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302 and not Submission.objects.filter(pk=copy.pk).exists()
    assert not Run.objects.filter(submission_id=copy.pk).exists()


def cli(monkeypatch, token: str, *args: str):
    """The `kernelbot` CLI against this test's site (through Django's test client), logged in with `token`."""
    import httpx
    from django.test import Client
    from typer.testing import CliRunner

    from kernelbot.cli import main

    def site(request: httpx.Request) -> httpx.Response:
        answer = Client().generic(request.method, request.url.raw_path.decode(), request.content,
                                  content_type=request.headers.get("content-type", ""),
                                  headers={"Authorization": request.headers["authorization"]})
        return httpx.Response(answer.status_code, headers=dict(answer.items()), content=answer.content)

    monkeypatch.setattr(main, "client", lambda *a, **k: httpx.Client(
        transport=httpx.MockTransport(site), base_url="http://testserver/api/v1",
        headers={"Authorization": f"Bearer {token}"}))
    return CliRunner().invoke(main.app, list(args), env={"COLUMNS": "250"})


def test_the_apis_and_the_cli_mark_a_rerun_as_a_rerun_of_its_original(rerun, client, admin_client, monkeypatch,
                                                                       settings):
    copy, original = rerun
    token = do_create_token(copy.user)[1]
    bearer, cli_id = {"Authorization": f"Bearer {token}"}, {"X-Popcorn-Cli-Id": token}
    marked = {"submission_id": original.pk, "round": 1, "final_id": copy.final_entry.final_id}
    assert client.get(f"/api/v1/submissions/{copy.pk}", headers=bearer).json()["rerun_of"] == marked
    assert client.get(f"/api/v1/submissions/{original.pk}", headers=bearer).json()["rerun_of"] is None
    assert client.get(f"/popcorn/user/submissions/{copy.pk}", headers=cli_id).json()["rerun_of"] == marked
    assert client.get(f"/popcorn/user/submissions/{original.pk}", headers=cli_id).json()["rerun_of"] is None
    settings.ADMIN_TOKEN = "s3cret-admin"
    assert client.get(f"/popcorn/admin/submissions/{copy.pk}", headers=ADMIN).json()["rerun_of"] == marked
    schema = client.get("/api/v1/openapi.json").json()["components"]["schemas"]
    assert "rerun_of" in schema["SubmissionOut"]["properties"] and "RerunOfOut" in schema

    shown = cli(monkeypatch, token, "submissions", "show", str(copy.pk))
    assert shown.exit_code == 0 and f"re-run 1 of #{original.pk} for the final standings" in shown.output, \
        shown.output
    shown = cli(monkeypatch, token, "submissions", "show", str(original.pk))
    assert shown.exit_code == 0 and "re-run" not in shown.output
    listed = cli(monkeypatch, token, "submissions", "list")
    assert listed.exit_code == 0 and f"\n│ {copy.pk} " not in listed.output and f"│ {original.pk} " in listed.output


def test_an_entry_of_published_standings_is_never_deleted(rerun, client, admin_client, monkeypatch, settings):
    """Published final standings are immutable: the submission an entry names stays on every front-end (staff
    included), so the published row keeps its entry; its author is told why."""
    copy, original = rerun
    publish(copy)
    final = Final.objects.get(pk=copy.final_entry.final_id)
    published = list(final.entries.values_list("pk", "submission_id", "rank", "score", "user_id"))
    token = do_create_token(original.user)[1]
    why = (f"Submission {original.pk} is an entry of the published final standings of '{original.leaderboard.name}': "
           "published standings stay as they were published, so it cannot be deleted.")

    for answer in (client.delete(f"/api/v1/submissions/{original.pk}", headers={"Authorization": f"Bearer {token}"}),
                   client.delete(f"/popcorn/user/submissions/{original.pk}", headers={"X-Popcorn-Cli-Id": token})):
        assert (answer.status_code, answer.json()["detail"]) == (409, why)
    deleted = cli(monkeypatch, token, "submissions", "delete", str(original.pk), "--yes")
    said = " ".join(deleted.output.split())  # the CLI wraps its message at the terminal's width
    assert deleted.exit_code == 1 and "cannot be deleted" in said and "Deleted" not in said
    settings.ADMIN_TOKEN = "s3cret-admin"
    assert client.delete(f"/popcorn/admin/submissions/{original.pk}", headers=ADMIN).status_code == 409
    one = admin_client.post(f"/admin/leaderboards/submission/{original.pk}/delete/", {"post": "yes"})
    assert "published standings stay as they were published" in one.content.decode().replace("&#x27;", "'")
    bulk = admin_client.post("/admin/leaderboards/submission/", {
        "action": "delete_selected", "_selected_action": [original.pk], "post": "yes"}).content.decode()
    assert "cannot be deleted" in bulk
    organiser = user_for_discord(7103, "organiser")
    organiser.is_staff = True
    organiser.save(update_fields=["is_staff"])
    with pytest.raises(service.BotError, match="published standings stay as they were published"):
        service.delete_submission(service.Member(7103, "organiser"), original.pk)

    assert Submission.objects.filter(pk=original.pk).exists()
    assert list(final.entries.values_list("pk", "submission_id", "rank", "score", "user_id")) == published
    standings = client.get(f"/api/v1/leaderboards/{original.leaderboard.name}/final").json()["published"]
    assert [e["submission_id"] for e in standings["entries"]] == [original.pk]


def test_a_cancelled_verifications_entry_may_be_deleted(rerun, client):
    """Only what was published is kept: standings cancelled before publication hold nothing back."""
    copy, original = rerun
    finals.do_cancel_final(Final.objects.get(pk=copy.final_entry.final_id))
    token = do_create_token(original.user)[1]
    answer = client.delete(f"/api/v1/submissions/{original.pk}", headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200, answer.content
    assert not Submission.objects.filter(pk=original.pk).exists()
