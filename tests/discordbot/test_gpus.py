"""/gpus in Discord over the reservations' actions, a reservation's notice as a DM and the daily usage table in the
guild's report channel, all through the loopback fake of Discord."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models import F

from discordbot import gpus as discord_gpus
from runners.reservations import actions as reservations
from runners.reservations import chat, tasks, usage
from runners.reservations.models import DeviceHold, Reservation, ReservationStatus

from ..reservations.conftest import gpu_pool
from .conftest import REPORT_CHANNEL_ID
from .test_commands import refused, reply

pytestmark = pytest.mark.django_db(transaction=True)
ALICE, BOB = 700_000_000_000_000_001, 700_000_000_000_000_002


def test_reserve_queue_cancel_list_notices_and_the_daily_table(bot, sync_queue, settings, monkeypatch):
    fake = bot.fake
    gpu_pool("lab", nodes=1, per_node=2)

    text, private = reply(fake, fake.command("gpus availability", ALICE))
    assert private and "**H100** · lab: 2/2 free, 0 queued" in text
    assert "4: never" in text and "never: a request gets devices of one node, and at most 2" in text

    text, _ = reply(fake, fake.command("gpus reserve", ALICE, gpu_type="h100", count=2, duration="1h", project="llm"))
    mine = Reservation.objects.get(user__socialaccount__uid=str(ALICE))
    assert mine.status == ReservationStatus.ACTIVE and f"#{mine.pk} 2× H100 on lab" in text and "active" in text
    text, _ = reply(fake, fake.command("gpus reserve", BOB, gpu_type="H100", count=1, duration="0.5h"))
    theirs = Reservation.objects.get(user__socialaccount__uid=str(BOB))
    assert theirs.status == ReservationStatus.PENDING and "planned start <t:" in text

    assert f"Reservation {mine.pk} not found" in refused(fake, fake.command("gpus extend", BOB,
                                                                             reservation_id=mine.pk, minutes=10))
    assert "Unknown GPU type 'B300'" in refused(fake, fake.command("gpus reserve", ALICE, gpu_type="B300", count=1,
                                                                   duration="10"))
    assert Reservation.objects.count() == 2  # refusals change nothing

    text, _ = reply(fake, fake.command("gpus cancel", ALICE, reservation_id=mine.pk))
    assert "ended" in text
    theirs.refresh_from_db()
    assert theirs.status == ReservationStatus.ACTIVE  # the queue moved up when the devices were freed
    text, _ = reply(fake, fake.command("gpus list", BOB))
    assert f"#{theirs.pk} 1× H100 on lab" in text and "ends <t:" in text
    assert "already ended" in refused(fake, fake.command("gpus cancel", ALICE, reservation_id=mine.pk))

    # notices and the daily post leave from whichever process raises them (a worker), through REST
    settings.DISCORD_TOKEN, settings.DISCORD_API_URL = "fake-token", fake.url
    monkeypatch.setattr(chat, "SENDERS", {})
    monkeypatch.setattr(reservations, "NOTIFIERS", [])
    discord_gpus.register()
    tasks.notify(theirs.pk, "Reservation ends in 5 minutes.")
    dms = [m for m in fake.messages.values() if fake.dm_channels.get(m.channel_id) == BOB]
    assert [m.content for m in dms] == ["Reservation ends in 5 minutes."]
    three_hours = timedelta(hours=3)  # into the report's window, the last 24 whole hours
    DeviceHold.objects.filter(reservation=mine).update(started=F("started") - three_hours,
                                                       ended=F("ended") - three_hours)
    usage.rebuild_rollup()  # the back-dating bypassed the roll-up, which a window of whole days reads (00:xx UTC)
    assert chat.post_daily_report(force=True) == ["discord-bot"]
    (table,) = fake.in_channel(REPORT_CHANNEL_ID)
    assert "GPU usage by project" in table.content and "llm" in table.content
    assert chat.post_daily_report(force=True) == []  # once a day


def test_fractional_durations_nodes_and_cancel_without_an_id(bot, sync_queue):
    fake = bot.fake
    gpu_pool("lab", nodes=2, per_node=2)
    assert "is not a duration" in refused(fake, fake.command("gpus reserve", ALICE, gpu_type="H100", count=1,
                                                             duration="soon"))
    assert "You hold no reservations." in reply(fake, fake.command("gpus cancel", ALICE))[0]
    text, _ = reply(fake, fake.command("gpus reserve", ALICE, gpu_type="H100", count=2, duration="0.25h", nodes=2))
    both = Reservation.objects.get(user__socialaccount__uid=str(ALICE))
    assert (both.minutes, both.node_count, both.status) == (15, 2, ReservationStatus.ACTIVE), text
    text, _ = reply(fake, fake.command("gpus cancel", ALICE))  # the only one: no id needed
    assert f"#{both.pk}" in text and "ended" in text
    for minutes in ("90m", "1h30m"):
        reply(fake, fake.command("gpus reserve", ALICE, gpu_type="H100", count=1, duration=minutes))
    ids = list(Reservation.objects.filter(status=ReservationStatus.ACTIVE).values_list("pk", flat=True))
    assert set(Reservation.objects.filter(pk__in=ids).values_list("minutes", flat=True)) == {90}
    choice = refused(fake, fake.command("gpus cancel", ALICE))  # two: which one?
    assert "You hold 2 reservations" in choice and all(f"#{pk}" in choice for pk in ids)
    assert Reservation.objects.filter(pk__in=ids, status=ReservationStatus.ACTIVE).count() == 2
