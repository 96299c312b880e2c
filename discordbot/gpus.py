"""Shared GPUs in Discord: the `/gpus` commands as thin functions over `runners.reservations.actions`, and the bot's
share of what reservations announce: warnings before expiry as DMs and the daily usage table in each guild's report
channel. Those two are raised in whichever process notices them (a worker), so they go out through Discord's REST
API with the bot's token and need no running bot; `DiscordbotConfig.ready` registers them."""

from __future__ import annotations

import logging
from datetime import datetime

import httpx
from allauth.socialaccount.models import SocialAccount
from django.conf import settings

from kernelbot.durations import parse_minutes
from leaderboards.errors import AccessDenied, Refused
from runners.reservations import actions as reservations
from runners.reservations import chat
from runners.reservations.models import OPEN, Reservation, ReservationStatus

from . import render
from .identity import PROVIDER
from .models import Guild
from .service import BotError, Member, actor_for

log = logging.getLogger(__name__)


def when(moment: datetime) -> str:
    return f"<t:{int(moment.timestamp())}:R>"  # Discord shows it in the reader's time zone


def describe(r: Reservation) -> str:
    nodes = f" × {r.node_count} nodes" if r.node_count > 1 else ""
    line = (f"#{r.pk} {r.gpu_count}× {r.gpu_type.name}{nodes} on {r.pool.name} for {r.minutes} min "
            f"({render.isolate(r.project)}): "
            f"{r.status}")
    if r.status == ReservationStatus.ACTIVE:
        line += f" on {', '.join(r.hostnames()) or '?'}, ends {when(r.ends_at)}"
        if r.access.get("command") or r.access.get("note"):
            line += f"\n  access: {r.access.get('command') or r.access.get('note')}"
    elif r.status == ReservationStatus.PENDING and r.planned_start:
        line += f", planned start {when(r.planned_start)}"
    return line


def _refusals(fn):
    def wrapped(member: Member, *args):
        try:
            return fn(actor_for(member).user, *args)
        except (Refused, AccessDenied) as exc:
            raise BotError(str(exc)) from exc
    return wrapped


@_refusals
def availability(user) -> str:
    rows = reservations.availability()
    if not rows:
        return "No pool lends GPUs for reservations."
    lines = ["GPU type · pool: free now / reservable, queued; a request of 1/2/4/8 GPUs would start"]
    for a in rows:
        etas = ", ".join(f"{n}: {when(t) if t else 'never'}" for n, t in a.eta.items())
        lines.append(f"**{a.gpu_type}** · {a.pool}: {a.free_now}/{a.reservable} free, {a.queued} queued; {etas}")
        if a.never:
            lines.append(f"  never: {a.never}")
    return "\n".join(lines)


@_refusals
def reserve(user, gpu_type: str, gpus: int, duration: str, project: str, nodes: int = 1) -> str:
    try:
        minutes = parse_minutes(duration)
    except ValueError as exc:
        raise BotError(str(exc)) from exc
    r = reservations.do_reserve(user, reservations.ReserveRequest(gpu_type, gpus, minutes, project, nodes=nodes))
    r = reservations.visible_to(user).get(pk=r.pk)
    return f"Reserved: {describe(r)}"


def _open(user) -> list[Reservation]:
    return list(reservations.visible_to(user).filter(user=user, status__in=OPEN).order_by("created"))


@_refusals
def mine(user) -> str:
    return "\n".join(describe(r) for r in _open(user)) or "You hold no reservations."


@_refusals
def cancel(user, reservation_id: int | None = None) -> str:
    """Without an id: the user's one open reservation, or which of theirs to name."""
    if reservation_id is None:
        open_ones = _open(user)
        if not open_ones:
            return "You hold no reservations."
        if len(open_ones) > 1:
            listed = "\n".join(describe(r) for r in open_ones)
            raise BotError(f"You hold {len(open_ones)} reservations; name one with `/gpus cancel "
                           f"reservation_id:<id>`:\n{listed}")
        reservation_id = open_ones[0].pk
    return f"Done: {describe(reservations.do_cancel(user, reservation_id))}"


@_refusals
def extend(user, reservation_id: int, minutes: int) -> str:
    return f"Extended: {describe(reservations.do_extend(user, reservation_id, minutes))}"


# --- sent from any process, through REST -----------------------------------------------------------------------

def _rest(method: str, path: str, payload: dict) -> dict:
    base = (settings.DISCORD_API_URL or "https://discord.com").rstrip("/")
    response = httpx.request(method, f"{base}/api/v10/{path}", json=payload, timeout=30,
                             headers={"Authorization": f"Bot {settings.DISCORD_TOKEN}"})
    response.raise_for_status()
    return response.json()


def post_to_report_channels(text: str) -> None:
    """The daily usage table in every enabled guild's report channel."""
    for channel_id in Guild.objects.filter(enabled=True, report_channel_id__isnull=False).values_list(
            "report_channel_id", flat=True):
        _rest("POST", f"channels/{channel_id}/messages",
              {"content": f"```\n{render.contained(text[:1900])}\n```", "allowed_mentions": {"parse": []}})


def direct_message(user, text: str) -> None:
    """A reservation's notice to its holder, when they use Discord."""
    uid = SocialAccount.objects.filter(user=user, provider=PROVIDER).values_list("uid", flat=True).first()
    if uid is None:
        return
    channel = _rest("POST", "users/@me/channels", {"recipient_id": uid})
    _rest("POST", f"channels/{channel['id']}/messages", {"content": render.clip(text),
                                                         "allowed_mentions": {"parse": []}})


def register() -> None:
    if not settings.DISCORD_TOKEN:
        return
    chat.SENDERS["discord-bot"] = post_to_report_channels
    if direct_message not in reservations.NOTIFIERS:
        reservations.NOTIFIERS.append(direct_message)
