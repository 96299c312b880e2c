"""The site's account adapter: failed logins are limited so that they protect an account without letting a stranger
lock its owner out. The site's login, the API's password login (kernelbot/popcorn token exchange) and so the CLI
linking page (behind the site's login) all authenticate through it."""

from __future__ import annotations

from typing import Any

from allauth.account.adapter import DefaultAccountAdapter
from allauth.core.internal.ratelimit import consume, get_ip, get_rates
from django.core.exceptions import ValidationError


class AccountAdapter(DefaultAccountAdapter):
    """ACCOUNT_RATE_LIMITS' `login_failed` counts per client address and per (address, account): the owner's right
    password from another address still gets in however often strangers fail elsewhere (allauth's default counts per
    account from anywhere: 5 wrong passwords from one address locked the owner out everywhere for 5 minutes).
    `login_failed_account` caps the failures for one account from all addresses together, in a longer window
    (a guessing spread over many addresses). `refused_by`: the limit that refused the last attempt."""

    refused_by = ""

    def _get_login_attempts_cache_key(self, request, **credentials: Any) -> str:
        return f"{self.account_key(request, **credentials)}@{get_ip(request)}"

    def account_key(self, request, **credentials: Any) -> str:
        return super()._get_login_attempts_cache_key(request, **credentials)

    def pre_authenticate(self, request, **credentials: Any) -> None:
        try:
            super().pre_authenticate(request, **credentials)
        except ValidationError:
            self.refused_by = "login_failed"
            raise
        self._account_usage = consume(request, app="allauth.account", action="login_failed_account",
                                      key=self.account_key(request, **credentials))
        if not self._account_usage:
            self._rollback_login_failed_rl_usage()  # a refused attempt counts nowhere
            self.refused_by = "login_failed_account"
            raise self.validation_error("too_many_login_attempts")

    def _rollback_login_failed_rl_usage(self) -> None:
        super()._rollback_login_failed_rl_usage()
        if usage := getattr(self, "_account_usage", None):
            usage.rollback()


def longest(action: str) -> int:
    """The seconds until `action`'s limits let an attempt through again at the latest."""
    return int(max((rate.duration for rate in get_rates(app="allauth.account", action=action)), default=60))
