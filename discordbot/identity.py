"""A Discord user is a platform user: the same allauth Discord social account the site's Discord log-in uses, so one
person has one account, one history and one set of quotas on every front-end."""

from __future__ import annotations

import re

from allauth.socialaccount.models import SocialAccount
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction

from leaderboards.errors import AccessDenied
from leaderboards.models import Profile

PROVIDER = "discord"


def _free_username(wanted: str) -> str:
    User = get_user_model()
    base = re.sub(r"[^\w.@+-]", "", wanted)[:140] or "discord"
    name, n = base, 1
    while User.objects.filter(username__iexact=name).exists():
        n += 1
        name = f"{base}{n}"
    return name


def user_for_discord(discord_id: int, username: str, display_name: str = ""):
    """The platform user linked to this Discord id, created (with its social account) on first use. A deactivated
    account is refused."""
    uid = str(discord_id)
    account = SocialAccount.objects.select_related("user").filter(provider=PROVIDER, uid=uid).first()
    if account is None:
        try:
            with transaction.atomic():
                user = get_user_model().objects.create(username=_free_username(username))
                user.set_unusable_password()
                user.save(update_fields=["password"])
                Profile.objects.create(user=user, display_name=(display_name or username)[:80])
                account = SocialAccount.objects.create(user=user, provider=PROVIDER, uid=uid,
                                                       extra_data={"id": uid, "username": username,
                                                                   "global_name": display_name})
        except IntegrityError:  # a second command of the same new user won the race
            account = SocialAccount.objects.select_related("user").get(provider=PROVIDER, uid=uid)
    if not account.user.is_active:
        raise AccessDenied("Your kernelbot account is deactivated.", 403)
    return account.user
