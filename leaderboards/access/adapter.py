"""The site's account adapter: failed logins are limited so that they protect an account without letting a stranger
lock its owner out. The site's login, the API's password login (kernelbot/popcorn token exchange) and so the CLI
linking page (behind the site's login) all authenticate through it.

Known clients (OWASP's device cookies, and addresses): every successful login records its client address (an IPv6
address's /64) for the account, and the site's login also a device cookie; a login attempt from one of these within
KNOWN_DAYS is not counted against, nor refused by, the per-account cap, so failures from strangers, however many
addresses they spread over, never lock the owner out where they logged in before. Only the per-address limits apply
there, which count that address's own failures."""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

from allauth.account.adapter import DefaultAccountAdapter
from allauth.core.internal.ratelimit import consume, get_ip, get_rates
from django.core.exceptions import ImproperlyConfigured, PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.crypto import salted_hmac

from .models import KnownClient

DEVICE_COOKIE = "kb_device"
KNOWN_DAYS = 180
KNOWN_PER_USER = 20  # the newest kept per account


def address_digest(request: HttpRequest) -> str | None:
    """The keyed digest of the request's client address as the limits count it (an IPv6 address's /64: one
    household or host rotates within it); None where it cannot be told (behind fewer proxies than
    KERNELBOT_TRUSTED_PROXY_COUNT)."""
    try:
        return _digest(f"address:{get_ip(request)}")
    except (PermissionDenied, ImproperlyConfigured):
        return None


def device_digest(device: str) -> str:
    return _digest(f"device:{device[:64]}")


def _digest(value: str) -> str:
    return salted_hmac("kernelbot.known-client", value, algorithm="sha256").hexdigest()


def is_known_client(request: HttpRequest, login: str) -> bool:
    """Whether `login`'s account logged in from the request's address or browser (its device cookie) in KNOWN_DAYS."""
    device = request.COOKIES.get(DEVICE_COOKIE)
    digests = [d for d in (address_digest(request), device and device_digest(device)) if d]
    return bool(login and digests) and KnownClient.objects.filter(
        user__username__iexact=login, digest__in=digests,
        last_login__gte=timezone.now() - timedelta(days=KNOWN_DAYS)).exists()


def remember_client(request: HttpRequest, user, device: str = "") -> None:
    """Record the request's address (and `device`, a new device cookie's value) as where the user logged in; the
    account keeps its KNOWN_PER_USER newest."""
    now = timezone.now()
    for digest in (address_digest(request), device and device_digest(device)):
        if digest:
            KnownClient.objects.update_or_create(user=user, digest=digest, defaults={"last_login": now})
    keep = KnownClient.objects.filter(user=user).order_by("-last_login").values_list("pk", flat=True)[:KNOWN_PER_USER]
    KnownClient.objects.filter(user=user).exclude(pk__in=list(keep)).delete()


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
        self._account_usage = None
        if is_known_client(request, credentials.get("username", "")):
            return  # where the owner logged in before: only that address's own failures count
        self._account_usage = consume(request, app="allauth.account", action="login_failed_account",
                                      key=self.account_key(request, **credentials))
        if not self._account_usage:
            self._rollback_login_failed_rl_usage()  # a refused attempt counts nowhere
            self.refused_by = "login_failed_account"
            raise self.validation_error("too_many_login_attempts")

    def authenticate(self, request: HttpRequest, **credentials: Any):
        user = super().authenticate(request, **credentials)
        if user is not None and user.is_active:
            remember_client(request, user)
        return user

    def post_login(self, request: HttpRequest, user, **kwargs: Any) -> HttpResponse:
        """Every site login (password or GitHub) makes the browser a known client of the account: a device cookie."""
        response = super().post_login(request, user, **kwargs)
        device = request.COOKIES.get(DEVICE_COOKIE, "")
        if not KnownClient.objects.filter(user=user, digest=device_digest(device)).exists():
            device = secrets.token_urlsafe(32)  # a browser new to this account (or none): a cookie of its own
        remember_client(request, user, device)
        response.set_cookie(DEVICE_COOKIE, device, max_age=KNOWN_DAYS * 86400, secure=request.is_secure(),
                            httponly=True, samesite="Lax")
        return response

    def _rollback_login_failed_rl_usage(self) -> None:
        super()._rollback_login_failed_rl_usage()
        if usage := getattr(self, "_account_usage", None):
            usage.rollback()


def longest(action: str) -> int:
    """The seconds until `action`'s limits let an attempt through again at the latest."""
    return int(max((rate.duration for rate in get_rates(app="allauth.account", action=action)), default=60))
