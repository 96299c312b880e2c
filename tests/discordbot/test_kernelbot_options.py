"""KernelBot's habits work here (issue 36): every command both bots have takes upstream's option names, and the
commands upstream has that were missing (resync, set-forum-ids, verify-task) answer through the Discord fake."""

from __future__ import annotations

import shutil

import pytest

from discordbot.verify import VERIFY_BOARD
from leaderboards.models import Leaderboard, Submission

from ..conftest import REPO
from ..factories import submission
from ..fakes.discord import ORGANISER_ROLE_ID, Attachment
from ..leaderboards.test_dataset import closed, hub  # noqa: F401 - fixtures
from .test_commands import ALICE, CORRECT, ORG, refused, reply

pytestmark = pytest.mark.django_db(transaction=True)
ORGANISER = {"roles": [ORGANISER_ROLE_ID]}
# Each command both bots have, with its options as KernelBot (gpu-mode/kernelbot src/kernelbot/cogs) spells them.
UPSTREAM = {
    "leaderboard submit test": {"script", "leaderboard_name", "gpu"},
    "leaderboard submit benchmark": {"script", "leaderboard_name", "gpu"},
    "leaderboard submit profile": {"script", "leaderboard_name", "gpu"},
    "leaderboard submit ranked": {"script", "leaderboard_name", "gpu"},
    "leaderboard list": set(), "leaderboard show": {"leaderboard_name"},
    "leaderboard show-personal": {"leaderboard_name"}, "leaderboard task": {"leaderboard_name"},
    "leaderboard template": {"leaderboard_name", "lang"}, "leaderboard get-submission": {"submission_id"},
    "admin delete-leaderboard": {"leaderboard_name", "force"}, "admin delete-submission": {"submission"},
    "admin start": set(), "admin stop": set(),
    "admin update-problems": {"repository_name", "problem_set", "branch", "force", "closed"},
    "admin get-submission": {"submission_id"},
    "admin show-stats": {"last_day_only", "leaderboard_name"}, "admin resync": set(),
    "admin get-user-names": set(), "admin update-user-names": {"attachment"}, "admin set-forum-ids": set(),
    "admin ban": {"user_id"}, "admin unban": {"user_id"},
    "admin export-hf": {"leaderboard_name", "filename", "private"},
    "verify-task": {"task", "mode"}, "verifyruns": set(), "ping": set(),
}


def synced(fake) -> dict[str, dict[str, dict]]:
    """The commands the bot synced to the guild: qualified name → its options by name."""
    found = {}

    def walk(prefix: str, options: list[dict]) -> None:
        for option in options:
            name = f"{prefix} {option['name']}".strip()
            if option.get("type") in (1, 2) or not prefix:
                subs = option.get("options") or []
                if option.get("type") == 2 or any(o.get("type") in (1, 2) for o in subs):
                    walk(name, subs)
                else:
                    found[name] = {o["name"]: o for o in subs}

    walk("", fake.commands)
    return found


def test_every_command_kernelbot_has_takes_its_option_names(bot):
    commands = synced(bot.fake)
    commands["verifyruns"] = commands.pop("admin verifyruns")  # upstream's is top-level; ours is an organiser's
    for name, options in UPSTREAM.items():
        assert name in commands, name
        assert options <= set(commands[name]), (name, sorted(commands[name]))
        assert not {"leaderboard", "gpus", "repository"} & set(commands[name]) or name == "admin export-hf", name
    assert commands["leaderboard template"]["lang"].get("autocomplete")
    assert [c["value"] for c in commands["verify-task"]["mode"]["choices"]] == [
        "test", "benchmark", "leaderboard", "all"]


def test_template_offers_the_boards_languages(bot, leaderboard):
    fake = bot.fake
    ask = fake.command("leaderboard template", ALICE, autocomplete=True, leaderboard_name=leaderboard.name,
                       lang=("focused", "py"))
    assert [c["value"] for c in fake.answer(ask)["data"]["choices"]] == ["Python"]
    template = fake.command("leaderboard template", ALICE, leaderboard_name=leaderboard.name, lang="Python")
    reply(fake, template)
    assert b"def custom_kernel" in fake.original(template).files[0][1]


def test_show_personal_pages_through_every_submission_with_a_count(bot, leaderboard):
    fake = bot.fake
    fake.answer(fake.command("leaderboard submit test", ALICE, script=Attachment("k.py", CORRECT),
                             leaderboard_name=leaderboard.name, gpu="CPU"))  # makes ALICE's account
    user = fake.wait_for(lambda: Submission.objects.first(), 10, "the submission").user
    for i in range(44):
        Submission.objects.filter(pk=submission(leaderboard, user, mode="test").pk).update(file_name=f"k{i:02}.py")
    first, _ = reply(fake, fake.command("leaderboard show-personal", ALICE, leaderboard_name=leaderboard.name))
    assert "45 in all; 1–20 (newest first), page 1 of 3" in first and first.count("\n#") == 20
    assert f"`/leaderboard show-personal leaderboard_name:{leaderboard.name} page:2`" in first
    assert "`\u2068k43.py\u2069`" in first and "`\u2068k24.py\u2069`" in first and "k23.py" not in first
    last, _ = reply(fake, fake.command("leaderboard show-personal", ALICE, leaderboard_name=leaderboard.name, page=3))
    assert "41–45" in last and last.count("\n#") == 5 and "`\u2068k.py\u2069`" in last and "page:4" not in last
    assert "fill 3 page(s)" in refused(fake, fake.command("leaderboard show-personal", ALICE,
                                                           leaderboard_name=leaderboard.name, page=4))


def test_export_hf_takes_a_file_name_and_privacy_and_a_configured_repository(
        bot, closed, hub, settings, monkeypatch):  # noqa: F811
    fake = bot.fake
    board, _ = closed
    settings.HF_ENDPOINT, settings.HF_PRIVATE_DATASET, settings.HF_PUBLIC_DATASET = hub.url, "", "gpu-mode/public"
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    assert "set HF_PRIVATE_DATASET" in refused(fake, fake.command("admin export-hf", ORG, leaderboard_name=board.name,
                                                                   **ORGANISER))
    text, _ = reply(fake, fake.command("admin export-hf", ORG, leaderboard_name=board.name, filename="final",
                                       private=False, **ORGANISER))
    assert f"Pushed final.parquet ({board.name}) to {hub.url}" in text
    assert set(hub.repos[("dataset", "gpu-mode/public")]) == {"final.parquet"}
    assert hub.private[("dataset", "gpu-mode/public")] is False
    reply(fake, fake.command("admin export-hf", ORG, leaderboard_name=board.name, repository="gpu-mode/private",
                             **ORGANISER))
    assert hub.private[("dataset", "gpu-mode/private")] is True
    assert set(hub.repos[("dataset", "gpu-mode/private")]) == {f"{board.name}.parquet"}


def test_resync_syncs_this_guilds_commands_again_and_set_forum_ids_says_why_there_is_nothing(bot):
    fake = bot.fake
    assert "for organisers" in refused(fake, fake.command("admin resync", ALICE))
    fake.commands = []
    text, ephemeral = reply(fake, fake.command("admin resync", ORG, **ORGANISER))
    assert ephemeral and text.startswith("Resynced commands:") and "- /leaderboard" in text and "- /verify-task" in text
    assert set(synced(fake)) >= set(UPSTREAM) - {"verifyruns"}
    text, _ = reply(fake, fake.command("admin set-forum-ids", ORG, **ORGANISER))
    assert text.startswith("Nothing to set") and "report channel" in text


def test_verify_task_refuses_what_does_not_load_or_import(bot, settings, tmp_path):
    fake = bot.fake
    settings.PROBLEMS_DIR = tmp_path
    shutil.copytree(REPO / "problems" / "demo", tmp_path / "demo")
    assert "for organisers" in refused(fake, fake.command("verify-task", ALICE, task="demo/vectoradd_py"))
    assert "not a task directory" in refused(fake, fake.command("verify-task", ORG, task="../x", **ORGANISER))
    (tmp_path / "demo" / "vectoradd_py" / "task.yml").write_text("lang: py\n")
    text = refused(fake, fake.command("verify-task", ORG, task="demo/vectoradd_py", **ORGANISER))
    assert text.startswith("❌ demo/vectoradd_py does not load:") and "description" in text
    (tmp_path / "demo" / "softmax_py" / "reference.py").write_text("def generate_input(**kw): ...\n")
    text = refused(fake, fake.command("verify-task", ORG, task="demo/softmax_py", gpu="CPU", **ORGANISER))
    assert text.startswith("❌ demo/softmax_py would not import:") and "ref_kernel" in text
    choices = fake.answer(fake.command("verify-task", ORG, autocomplete=True, task=("focused", "mat"), **ORGANISER))
    assert [c["value"] for c in choices["data"]["choices"]] == ["demo/matmul_py"]
    assert not Submission.objects.exists()


@pytest.mark.slow
def test_verify_task_runs_the_solutions_and_reports_which_behaved(bot, cluster, settings, monkeypatch):
    monkeypatch.setattr("discordbot.bot.VERIFY_POLL_SECONDS", 0.2)
    fake = bot.fake
    interaction = fake.command("verify-task", ORG, task="demo/vectoradd_py", mode="test", gpu="CPU", **ORGANISER)
    text, ephemeral = reply(fake, interaction)
    assert ephemeral and text.startswith("✅ demo/vectoradd_py loads and would import") and "4 submission(s)" in text
    assert Leaderboard.objects.get(name=VERIFY_BOARD).internal
    report = fake.wait_for(lambda: [m for m in fake.followups(interaction) if m.content.startswith("Report:")], 240,
                           "the report")
    assert report[0].content.splitlines()[1:] == [
        "✅ solutions/correct.py test: passed, as expected", "✅ solutions/fast.py test: passed, as expected",
        "✅ solutions/slow.py test: passed, as expected", "✅ solutions/wrong.py test: failed, as expected"]
