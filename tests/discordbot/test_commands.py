"""Every command through the fake, its permissions and its error paths (no cluster: runs stay queued)."""

import io
import json
import zipfile

import pytest
from allauth.socialaccount.models import SocialAccount

from discordbot.models import StatusMessage
from leaderboards.access.actions import accepting_jobs, do_ban
from leaderboards.models import Leaderboard, Run, RunStatus, Submission
from runners.models import GpuType

from ..conftest import REPO
from ..factories import LeaderboardFactory
from ..fakes.discord import CHANNEL_ID, ORGANISER_ROLE_ID, Attachment

pytestmark = pytest.mark.django_db(transaction=True)
CORRECT = (REPO / "problems" / "demo" / "vectoradd_py" / "solutions" / "correct.py").read_bytes()
ALICE, BOB, ORG = 700_000_000_000_000_001, 700_000_000_000_000_002, 700_000_000_000_000_003


def reply(fake, interaction) -> tuple[str, bool]:
    """What the user is shown and whether only they see it: the answer, or for a deferred one ("thinking…") the
    text it became or the ephemeral follow-up that replaced it."""
    body = fake.answer(interaction)
    data = body.get("data") or {}
    if body.get("type") != 5:
        return data.get("content", ""), bool((data.get("flags") or 0) & 64)

    def shown():
        original = fake.original(interaction)
        return original if original is not None and original.content else next(iter(fake.followups(interaction)),
                                                                                  None)
    message = fake.wait_for(shown, 30, f"what the deferred answer to {interaction} became")
    return message.content, message.ephemeral


def refused(fake, interaction) -> str:
    text, ephemeral = reply(fake, interaction)
    assert ephemeral, text
    return text


def submit(fake, user=ALICE, mode="test", code=CORRECT, name="kernel.py", **options):
    return fake.command(f"leaderboard submit {mode}", user, script=Attachment(name, code), **options)


@pytest.mark.parametrize(("options", "expected"), [
    ({"leaderboard_name": "nope", "gpu": "CPU"}, "Unknown leaderboard 'nope'."),
    ({"gpu": "H100"}, "does not run on GPU 'H100'; available: CPU."),
    ({"name": "kernel.cu"}, "takes .py files"),
    ({"code": b""}, "'\u2068kernel.py\u2069' is empty."),
    ({"code": b"\xff\xfe" * 10, "gpu": "CPU"}, "is not UTF-8 text"),
    ({"code": b"x" * (1024 * 1024 + 1)}, "the limit is 1048576 bytes"),
    ({"gpu": "CPU", "leaderboard_name": None}, "Name a leaderboard"),
])
def test_bad_submissions_get_a_precise_ephemeral_message_and_change_nothing(bot, leaderboard, options, expected):
    options.setdefault("leaderboard_name", leaderboard.name)
    code, name = options.pop("code", CORRECT), options.pop("name", "kernel.py")
    text = refused(bot.fake, submit(bot.fake, code=code, name=name, **options))
    assert expected in text
    assert not Submission.objects.exists() and not Run.objects.exists()


def test_missing_attachment_closed_board_ban_paused_and_wrong_channel(bot, leaderboard):
    fake = bot.fake
    assert "Attach your kernel" in refused(fake, fake.command("leaderboard submit test", ALICE,
                                                              leaderboard_name=leaderboard.name))
    closed = LeaderboardFactory(problem=leaderboard.problem, gpu_types=list(leaderboard.gpu_types.all()),
                                deadline=leaderboard.deadline.replace(year=2000))
    assert "no longer accepts submissions" in refused(fake, submit(fake, leaderboard_name=closed.name, gpu="CPU"))
    assert "Submit in <#" in refused(fake, fake.command("leaderboard submit test", ALICE, channel_id=CHANNEL_ID + 99,
                                                        script=Attachment("k.py", CORRECT)))
    user = SocialAccount.objects.get(uid=str(ALICE)).user
    do_ban(user, None, "cheating")
    assert "banned from submitting to all leaderboards: cheating" in refused(
        fake, submit(fake, leaderboard_name=leaderboard.name, gpu="CPU"))
    assert "for organisers" in refused(fake, fake.command("admin stop", BOB, reason="x"))
    assert accepting_jobs().accepting
    text, ephemeral = reply(fake, fake.command("admin stop", ORG, roles=[ORGANISER_ROLE_ID], reason="maintenance"))
    assert "paused" in text and not ephemeral
    assert "paused by the organisers: maintenance" in refused(
        fake, submit(fake, BOB, leaderboard_name=leaderboard.name, gpu="CPU"))
    reply(fake, fake.command("admin start", ORG, roles=[ORGANISER_ROLE_ID]))
    assert not Submission.objects.exists()


def test_a_refused_ranked_submission_leaves_no_public_trace(bot, leaderboard):
    fake = bot.fake
    interaction = submit(fake, mode="ranked", leaderboard_name=leaderboard.name, gpu="H100")
    body = fake.answer(interaction)
    assert body["type"] == 5 and not (body.get("data") or {}).get("flags")  # acknowledged in public: ranked
    assert "does not run on GPU 'H100'" in refused(fake, interaction)
    assert fake.original(interaction) is None and [m.interaction_id for m in fake.deleted] == [interaction]
    assert not [m for m in fake.messages.values() if not m.ephemeral]
    assert not Submission.objects.exists()


def test_test_submission_is_private_directives_pick_the_board_and_one_account_per_discord_user(bot, leaderboard):
    fake = bot.fake
    code = f"#!POPCORN leaderboard {leaderboard.name}\n#!POPCORN gpu CPU\n".encode() + CORRECT
    text, ephemeral = reply(fake, submit(fake, code=code))
    assert ephemeral and "dispatched" in text  # a test run is its author's only, as on the site
    reply(fake, submit(fake, code=code + b"\n# 2\n"))
    assert Submission.objects.count() == 2 and SocialAccount.objects.filter(provider="discord").count() == 1
    fake.wait_for(lambda: StatusMessage.objects.count() == 2, 10, "both status messages")
    assert not StatusMessage.objects.filter(public=True).exists()


def test_autocomplete_list_show_task_template_and_status(bot, leaderboard):
    fake = bot.fake
    interaction = fake.command("leaderboard submit ranked", ALICE, autocomplete=True,
                               leaderboard_name=("focused", leaderboard.name[:4]))
    assert {c["value"] for c in fake.answer(interaction)["data"]["choices"]} == {leaderboard.name}
    interaction = fake.command("leaderboard submit ranked", ALICE, autocomplete=True, leaderboard_name=leaderboard.name,
                               gpu=("focused", "c"))
    assert [c["value"] for c in fake.answer(interaction)["data"]["choices"]] == ["CPU"]
    assert leaderboard.name in reply(fake, fake.command("leaderboard list", ALICE))[0]
    assert "No ranked submission yet" in reply(fake, fake.command("leaderboard show", ALICE,
                                                                    leaderboard_name=leaderboard.name))[0]
    assert "does not run on GPU 'H100'" in refused(fake, fake.command("leaderboard show", ALICE,
                                                                       leaderboard_name=leaderboard.name, gpu="H100"))
    assert "Page 3 does not exist" in refused(fake, fake.command("leaderboard show", ALICE,
                                                                  leaderboard_name=leaderboard.name, page=3))
    task = fake.command("leaderboard task", ALICE, leaderboard_name=leaderboard.name)
    assert leaderboard.name in reply(fake, task)[0]
    template = fake.command("leaderboard template", ALICE, leaderboard_name=leaderboard.name)
    reply(fake, template)
    assert fake.original(template).files and b"def custom_kernel" in fake.original(template).files[0][1]
    assert fake.original(template).files[0][1].startswith(
        f"#!POPCORN leaderboard {leaderboard.name}\n#!POPCORN gpu CPU\n".encode())

    reply(fake, submit(fake, mode="ranked", leaderboard_name=leaderboard.name, gpu="CPU"))
    submission = Submission.objects.get()
    assert "dispatched" in reply(fake, fake.command("submission status", ALICE, submission_id=submission.pk))[0]
    assert "Your submissions" in reply(fake, fake.command("leaderboard show-personal", ALICE,
                                                           leaderboard_name=leaderboard.name))[0]
    assert "not found" in refused(fake, fake.command("submission status", BOB, submission_id=submission.pk + 100))


def test_get_submission_is_for_its_author_and_organisers(bot, leaderboard):
    fake = bot.fake
    reply(fake, submit(fake, mode="ranked", leaderboard_name=leaderboard.name, gpu="CPU"))
    submission = Submission.objects.get()
    mine = fake.command("leaderboard get-submission", ALICE, submission_id=submission.pk)
    reply(fake, mine)
    assert fake.original(mine).files[0][1] == CORRECT
    assert "author and staff only" in refused(fake, fake.command("leaderboard get-submission", BOB,
                                                                 submission_id=submission.pk))
    organiser = fake.command("leaderboard get-submission", ORG, roles=[ORGANISER_ROLE_ID],
                             submission_id=submission.pk)
    reply(fake, organiser)
    assert fake.original(organiser).files[0][1] == CORRECT


def test_organiser_commands_cancel_requeue_rescore_stats_delete_and_import(bot, leaderboard):
    fake = bot.fake
    org = {"roles": [ORGANISER_ROLE_ID]}
    reply(fake, submit(fake, mode="ranked", leaderboard_name=leaderboard.name, gpu="CPU"))
    submission = Submission.objects.get()
    run = submission.runs.first()
    assert "for organisers" in refused(fake, fake.command("admin cancel", ALICE, run_id=run.pk))
    assert "is cancelled" in reply(fake, fake.command("admin cancel", ORG, run_id=run.pk, **org))[0]
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert "already finished" in refused(fake, fake.command("admin cancel", ORG, run_id=run.pk, **org))
    assert "queued again" in reply(fake, fake.command("admin requeue", ORG, run_id=run.pk, **org))[0]
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED
    assert "Run 999999 not found" in refused(fake, fake.command("admin requeue", ORG, run_id=999999, **org))
    assert "Rescored" in reply(fake, fake.command("admin rescore", ORG, leaderboard_name=leaderboard.name, **org))[0]
    stats = reply(fake, fake.command("admin stats", ORG, **org))[0]
    assert "1 submissions (leaderboard 1)" in stats and "Top users: \u2068member" in stats

    # KernelBot's /admin get-submission: the code and runs.json with the secret run too, for organisers only
    Run.objects.filter(submission=submission, secret=True).update(
        status=RunStatus.FAILED, passed=False, error="secret case 7 differs", stdout="secret-seed-output")
    assert "for organisers" in refused(fake, fake.command("admin get-submission", ALICE, submission_id=submission.pk))
    got = fake.command("admin get-submission", ORG, submission_id=submission.pk, **org)
    text, _ = reply(fake, got)
    assert text.startswith(f"# Submission {submission.pk}") and "secret on CPU: failed" in text
    files = dict(fake.original(got).files)
    assert files["kernel.py"] == CORRECT
    runs = json.loads(files["runs.json"])
    assert [r["secret"] for r in runs] == [False, True]
    assert runs[1]["error"] == "secret case 7 differs" and runs[1]["stdout"] == "secret-seed-output"

    ask = fake.command("admin delete-submission", ORG, submission=submission.pk, **org)
    assert "Delete submission" in reply(fake, ask)[0]
    message = fake.original(ask)
    assert "Only the organiser who asked" in refused(fake, fake.press(message, "kb-delete-confirm", BOB))
    assert Submission.objects.exists()
    fake.answer(fake.press(message, "kb-delete-confirm", ORG, **org))
    fake.wait_for(lambda: "is deleted" in message.content, 10, "the confirmation")
    assert not Submission.objects.exists()

    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as z:
        z.write(REPO / "problems" / "demo" / "utils.py", "utils.py")
        for path in (REPO / "problems" / "demo" / "vectoradd_py").rglob("*"):
            if path.is_file() and "solutions" not in path.parts:
                z.write(path, path.relative_to(REPO / "problems" / "demo"))
    imported = fake.command("admin import", ORG, archive=Attachment("vectoradd.zip", archive.getvalue()),
                            leaderboard_name="imported-board", gpus="CPU", deadline="2099-01-01", **org)
    fake.wait_for(lambda: fake.followups(imported), 20, "the import report")
    assert "created" in fake.followups(imported)[0].content
    assert Leaderboard.objects.filter(name="imported-board").exists()
    bad = fake.command("admin import", ORG, archive=Attachment("bad.zip", b"not a zip"), **org)
    fake.wait_for(lambda: fake.followups(bad), 20, "the refusal")
    assert "Import refused" in fake.followups(bad)[0].content


def test_a_submission_naming_no_gpu_takes_the_only_one_or_offers_a_choice(bot, leaderboard, cpu_pool):
    fake = bot.fake
    only = submit(fake, leaderboard_name=leaderboard.name)  # the board runs on CPU only
    assert "dispatched" in reply(fake, only)[0]
    assert Submission.objects.get().runs.get().gpu_type == cpu_pool.cpu

    two = LeaderboardFactory(problem=leaderboard.problem, gpu_types=[cpu_pool.cpu, GpuType.objects.create(
        name="H100")])
    interaction = submit(fake, leaderboard_name=two.name)
    fake.answer(interaction)
    menu = fake.wait_for(lambda: fake.followups(interaction), 10, "the GPU menu")[0]
    options = menu.components[0]["components"][0]
    assert [o["label"] for o in options["options"]] == ["CPU", "H100"] and menu.ephemeral
    fake.choose(menu, options["custom_id"], ALICE, ["CPU"])
    fake.wait_for(lambda: Submission.objects.filter(leaderboard=two).exists(), 10, "the submission")
    assert Submission.objects.get(leaderboard=two).runs.get().gpu_type == cpu_pool.cpu
    assert "Submitting on CPU" in menu.content


def test_kernelbot_organiser_commands_ban_delete_leaderboard_names_stats_ping(bot, leaderboard):
    fake = bot.fake
    org = {"roles": [ORGANISER_ROLE_ID]}
    assert "pong" in reply(fake, fake.command("ping", BOB))[0]
    assert "dispatched" in reply(fake, submit(fake, leaderboard_name=leaderboard.name, gpu="CPU"))[0]
    assert "for organisers" in refused(fake, fake.command("admin ban", BOB, user_id=str(ALICE)))
    assert "may no longer submit to any leaderboard" in reply(fake, fake.command("admin ban", ORG, user_id=str(ALICE),
                                                                               reason="spam", **org))[0]
    assert "banned from submitting" in reply(fake, submit(fake, leaderboard_name=leaderboard.name, gpu="CPU"))[0]
    assert "may submit to every leaderboard again" in reply(fake, fake.command("admin unban", ORG,
                                                                               user_id=str(ALICE), **org))[0]
    assert "is not banned" in refused(fake, fake.command("admin unban", ORG, user_id=str(ALICE), **org))
    assert "not a Discord user id" in refused(fake, fake.command("admin ban", ORG, user_id="alice", **org))

    names = fake.command("admin get-user-names", ORG, **org)
    reply(fake, names)
    assert json.loads(fake.original(names).files[0][1]) == {str(ALICE): "member1"}
    update = fake.command("admin update-user-names", ORG, attachment=Attachment(
        "names.json", json.dumps({str(ALICE): "Ada"}).encode()), **org)
    assert "Updated 1 name(s)" in reply(fake, update)[0]
    assert SocialAccount.objects.get(uid=str(ALICE)).user.profile.display_name == "Ada"
    assert "not JSON" in refused(fake, fake.command("admin update-user-names", ORG,
                                                    attachment=Attachment("n.json", b"{"), **org))

    stats = reply(fake, fake.command("admin show-stats", ORG, last_day_only=True,
                                     leaderboard_name=leaderboard.name, **org))[0]
    assert stats.startswith(f"'{leaderboard.name}': **Last 1 day(s)**: 1 submissions")
    assert "has 1 submission(s); pass force:True" in refused(fake, fake.command(
        "admin delete-leaderboard", ORG, leaderboard_name=leaderboard.name, **org))
    ask = fake.command("admin delete-leaderboard", ORG, leaderboard_name=leaderboard.name, force=True, **org)
    assert "and its 1 submission(s)?" in reply(fake, ask)[0]
    fake.press(fake.original(ask), "kb-delete-confirm", ORG, [ORGANISER_ROLE_ID])
    fake.wait_for(lambda: "is deleted with 1 submission(s)" in fake.original(ask).content, 10, "the deletion")
    assert not Leaderboard.objects.filter(pk=leaderboard.pk).exists()


def test_update_problems_imports_a_repositorys_problem_set(bot, leaderboard, problems_repository):
    fake = bot.fake
    org = {"roles": [ORGANISER_ROLE_ID]}
    done = reply(fake, fake.command("admin update-problems", ORG, repository_name="owner/problems", problem_set="demo",
                                    **org))[0]
    assert done.startswith("From owner/problems@main:") and "vectoradd" in done
    assert set(Leaderboard.objects.values_list("name", flat=True)) >= {"vectoradd", "softmax", "prefixsum", "matmul"}
    assert "no problem set 'nope' in owner/problems@main; available: demo" in refused(fake, fake.command(
        "admin update-problems", ORG, repository_name="owner/problems", problem_set="nope", **org))
    assert "answered 404" in refused(fake, fake.command("admin update-problems", ORG, repository_name="owner/problems",
                                                        branch="dev", **org))
    assert "not a branch name" in refused(fake, fake.command("admin update-problems", ORG,
                                                             repository_name="owner/problems", branch="a/b", **org))
    assert "for organisers" in refused(fake, fake.command("admin update-problems", ALICE))
