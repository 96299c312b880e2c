"""The daily usage post: yesterday's table by project to a Discord webhook and a Slack incoming webhook, once per day
and channel (a `UsagePost` row), at `KERNELBOT_USAGE_REPORT_HOUR` UTC. Scheduled hourly; a repeat does nothing."""

from __future__ import annotations

import logging
from collections.abc import Callable

import httpx
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from . import usage
from .models import UsagePost

log = logging.getLogger(__name__)
# Extra channels (name → send(text)); the Discord bot registers its report channel here when it runs.
SENDERS: dict[str, Callable[[str], None]] = {}


def discord_webhook(text: str) -> None:
    response = httpx.post(settings.USAGE_DISCORD_WEBHOOK, params={"wait": "true"}, timeout=30,
                          json={"content": f"```\n{text[:1900]}\n```", "allowed_mentions": {"parse": []}})
    response.raise_for_status()


def slack_webhook(text: str) -> None:
    response = httpx.post(settings.USAGE_SLACK_WEBHOOK, timeout=30, json={
        "text": text, "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": f"```{text[:2900]}```"}}]})
    response.raise_for_status()
    if response.text.strip() != "ok":
        raise httpx.HTTPError(f"Slack answered {response.text[:100]!r}")


def channels() -> dict[str, Callable[[str], None]]:
    found = dict(SENDERS)
    if settings.USAGE_DISCORD_WEBHOOK:
        found["discord-webhook"] = discord_webhook
    if settings.USAGE_SLACK_WEBHOOK:
        found["slack-webhook"] = slack_webhook
    return found


def post_daily_report(force: bool = False) -> list[str]:
    """Post the last 24 hours' table to every configured channel not yet posted to today; the channels posted."""
    now = timezone.now()
    if not force and now.hour < settings.USAGE_REPORT_HOUR:
        return []
    table = usage.report(usage.Filters.parse(group="project", days=1, end=now.replace(minute=0, second=0,
                                                                                      microsecond=0)))
    text = usage.to_text(table, f"GPU usage by project, {now:%Y-%m-%d}")
    posted = []
    for name, send in channels().items():
        try:
            with transaction.atomic():
                UsagePost.objects.create(day=now.date(), channel=name)
                send(text)  # a failure rolls the row back, so the next hourly run tries again
        except IntegrityError:
            continue
        except Exception:
            log.exception("daily usage post to %s failed", name)
            continue
        posted.append(name)
    return posted
