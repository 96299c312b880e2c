"""/admin export-hf: KernelBot's push of the submissions dataset to a Hugging Face dataset repository, against the
loopback fakes of Discord and of the Hub."""

from __future__ import annotations

import io

import pyarrow.parquet as pq
import pytest

from ..fakes.discord import ORGANISER_ROLE_ID
from ..leaderboards.test_dataset import closed, hub  # noqa: F401 - fixtures
from .test_commands import ALICE, ORG, refused, reply

pytestmark = pytest.mark.django_db(transaction=True)


def test_organisers_push_a_closed_boards_dataset_to_the_hub(bot, closed, hub, settings, monkeypatch):  # noqa: F811
    fake = bot.fake
    board, _ = closed
    settings.HF_ENDPOINT = hub.url
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    assert "for organisers" in refused(fake, fake.command("admin export-hf", ALICE, repository="org/data"))
    assert "not a Hugging Face repository id" in refused(
        fake, fake.command("admin export-hf", ORG, roles=[ORGANISER_ROLE_ID], repository="no-slash"))
    assert hub.commits == []
    text, private = reply(fake, fake.command("admin export-hf", ORG, roles=[ORGANISER_ROLE_ID],
                                             repository="gpu-mode/kernelbot-data", leaderboard_name=board.name))
    assert private and f"Pushed a private snapshot {board.name}.parquet ({board.name}) to {hub.url}" in text
    assert hub.private[("dataset", "gpu-mode/kernelbot-data")] is True
    pushed = pq.read_table(io.BytesIO(hub.repos[("dataset", "gpu-mode/kernelbot-data")][f"{board.name}.parquet"]))
    assert pushed.num_rows > 0 and "bob" not in pushed.column("user_name").to_pylist()  # bob opted out
    text, _ = reply(fake, fake.command("admin export-hf", ORG, roles=[ORGANISER_ROLE_ID], private=False,
                                       repository="gpu-mode/public-data", leaderboard_name=board.name))
    assert f"Pushed {board.name}.parquet ({board.name})" in text  # the public export, as it was
    assert hub.private[("dataset", "gpu-mode/public-data")] is False
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    assert "refused" in refused(fake, fake.command("admin export-hf", ORG, roles=[ORGANISER_ROLE_ID],
                                                    repository="gpu-mode/kernelbot-data"))
