"""Service layer for API access: tokens, CLI logins, who may submit where and how often, queue estimates.
`leaderboards.actions.check_submission` calls `check_may_submit`, so every front-end enforces the same rules."""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

from allauth.account.adapter import get_adapter
from allauth.core import ratelimit
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.core.exceptions import ImproperlyConfigured, PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Avg, Count, DurationField, ExpressionWrapper, F, Min
from django.utils import timezone

from leaderboards.errors import AccessDenied, SubmissionRejected
from leaderboards.models import ACTIVE_STATUSES, Leaderboard, Run, Submission, SubmissionMode
from runners.models import Gpu

from .adapter import longest
from .cache import cached, cached_many, forget, key, remember, token_key
from .models import (
    ApiToken,
    Ban,
    Invite,
    JobSwitch,
    Membership,
    PendingLogin,
    QuotaKind,
    SubmissionQuota,
    digest,
    new_secret,
)

log = logging.getLogger(__name__)

LAST_USED_RESOLUTION = timedelta(seconds=60)
MAX_DAYS = 3650  # longest token or invite lifetime
CLI_LOGINS_PER_MINUTE = 30  # anonymous CLI logins started per client address (REMOTE_ADDR)
CLI_LOGINS_PENDING = 10_000  # unlinked ones in all (each is pruned after a day)
MAX_INVITE_USES = 10**6
MAX_INVITES = 10_000  # codes one request creates (KernelBot's bound)
MAX_TOKEN_NAME = ApiToken._meta.get_field("name").max_length


# --- tokens ------------------------------------------------------------------------------------
def do_create_token(user, name: str = "cli", expires_days: int | None = None) -> tuple[ApiToken, str]:
    """A new token and its secret; the secret is not stored and cannot be shown again."""
    if "\x00" in name or not name.isprintable():
        raise AccessDenied("A token name cannot hold NUL bytes or control characters.", 400)
    if len(name) > MAX_TOKEN_NAME:
        raise AccessDenied(f"A token name is at most {MAX_TOKEN_NAME} characters; this one has {len(name)}.", 400)
    raw = new_secret()
    expires = timezone.now() + timedelta(days=min(max(expires_days, 1), MAX_DAYS)) if expires_days else None
    token = ApiToken.objects.create(user=user, name=name or "cli", digest=digest(raw), hint=raw[:10],
                                    expires=expires)
    return token, raw


def do_revoke_token(user, token_id: int) -> bool:
    tokens = ApiToken.objects.filter(user=user, pk=token_id, revoked__isnull=True)
    digests = list(tokens.values_list("digest", flat=True))
    revoked = tokens.update(revoked=timezone.now())
    forget(*map(token_key, digests))
    return bool(revoked)


def authenticate_token(raw: str | None):
    """The active user a token belongs to, or None. Records last use at most once a minute.
    Cached like the other settings (access/cache.py): reading it was a third of a submission's CPU."""
    if not raw:
        return None
    hashed = digest(raw.strip())
    # revocation and expiry are checked here rather than in SQL (see ApiToken.is_usable), so a cached token
    # that expires meanwhile is refused too
    token = cached(token_key(hashed),
                   lambda: ApiToken.objects.select_related("user__profile").filter(digest=hashed).first())
    now = timezone.now()
    if token is None or not token.is_usable(now) or not token.user.is_active:
        return None
    if token.last_used is None or now - token.last_used > LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used=now)
        token.last_used = now
        remember(token_key(hashed), token)  # the cache holds a copy: record the use there too
    return token.user


def check_password_login(request, username: str, password: str):
    """The active user a site password logs in, checked by the site's own login (allauth's adapter, see
    leaderboards.access.adapter) so its limits count the API's attempts and the site's together: ACCOUNT_RATE_LIMITS'
    `login` (attempts per address), `login_failed` (failures per address and per address and account) and
    `login_failed_account` (failures per account from anywhere). Past one, both refuse, the right password too:
    AccessDenied 429 with Retry-After (the longest window of the limit that refused); a wrong password or an inactive
    user 401."""
    if not ratelimit.consume(request, action="login"):
        retry = longest("login")
        raise AccessDenied(f"Too many logins from your address; try again in {retry // 60 or 1} min (the site's "
                           "login is refused as long).", 429, retry_after=retry)
    adapter = get_adapter(request)
    try:
        user = adapter.authenticate(request, username=username, password=password)
    except ValidationError:  # allauth's too_many_login_attempts, checked before the password
        account = adapter.refused_by == "login_failed_account"
        retry = longest(adapter.refused_by or "login_failed")
        what = "for this account (from all addresses)" if account else "for this account or from your address"
        raise AccessDenied(f"Too many failed logins {what}; try again in {retry // 60 or 1} min (the site's login "
                           "is refused as long).", 429, retry_after=retry) from None
    if user is None or not user.is_active:
        raise AccessDenied("Wrong username or password.", 401)
    return user


def pending_login_state(raw: str | None) -> str | None:
    """"pending" for an unlinked CLI id, "declined" for one its user declined to link, else None."""
    found = list(PendingLogin.objects.filter(digest=digest(raw.strip()), token__isnull=True)
                 .values_list("declined", flat=True)[:1]) if raw else []
    return ("declined" if found[0] else "pending") if found else None


def client_address(request) -> str:
    """The client's address as the site's login limits find it (allauth's adapter): the X-Forwarded-For entry
    `KERNELBOT_TRUSTED_PROXY_COUNT` proxies from the end when set, else REMOTE_ADDR; "" when it cannot be told (the
    forwarded header shorter than the proxies named: not through them)."""
    try:
        return get_adapter(request).get_client_ip(request)
    except (PermissionDenied, ImproperlyConfigured):
        return ""


def check_cli_login_rate(address: str) -> None:
    """Anyone may start a CLI login, and each writes a row: at most CLI_LOGINS_PER_MINUTE per client address (a
    fixed window in the cache) and CLI_LOGINS_PENDING unlinked ones in all, else 429 with Retry-After."""
    window = int(time.time() // 60)
    name = key("cli-logins", address, window)
    count = 0
    try:
        cache.add(name, 0, 120)
        count = cache.incr(name)
    except ValueError:  # the key expired between add and incr
        count = 1
    except Exception as exc:  # noqa: BLE001 - the cache away: the table's cap below still holds
        log.warning("cli login rate not counted (%r)", exc)
    retry = 60 - int(time.time()) % 60 + 1
    if count > CLI_LOGINS_PER_MINUTE:
        raise AccessDenied(f"Too many CLI logins from your address: at most {CLI_LOGINS_PER_MINUTE} a minute; retry "
                           f"in {retry} s.", 429, retry_after=retry)
    if PendingLogin.objects.filter(token__isnull=True).count() >= CLI_LOGINS_PENDING:
        raise AccessDenied("Too many CLI logins are waiting to be linked; retry in a minute.", 429, retry_after=60)


KERNELBOT_CLI = "kernelbot"  # the `provider` of the kernelbot CLI's pending logins, which go through no OAuth app


def cli_name(provider: str) -> str:
    """The CLI a pending login of `provider` came from, as the site names it."""
    return "the kernelbot CLI" if provider == KERNELBOT_CLI else "popcorn-cli"


def do_start_cli_login(provider: str | None, address: str = "") -> str:
    """A new pending id, which the CLI stores until a user binds it: popcorn-cli's `/auth/init` names its OAuth
    `provider` (discord or github), the kernelbot CLI's `POST /api/v1/auth/cli` none."""
    if provider is not None and provider not in ("discord", "github"):
        raise AccessDenied(f"Unknown provider '{provider}'; use discord or github.")
    check_cli_login_rate(address)
    PendingLogin.objects.filter(token__isnull=True, created__lt=timezone.now() - timedelta(days=1)).delete()
    raw = new_secret()
    PendingLogin.objects.create(digest=digest(raw), provider=provider or KERNELBOT_CLI, address=address[:64])
    return raw


def pending_cli_login(raw: str) -> PendingLogin | None:
    """The unlinked CLI login of a pending id, or None (unknown, expired, declined or linked already)."""
    raw = (raw or "").strip()
    return PendingLogin.objects.filter(digest=digest(raw), token__isnull=True, declined__isnull=True).first() \
        if raw else None


def check_cli_login(user, raw: str) -> PendingLogin | None:
    """The pending login a pasted id names, before the user confirms it (refused as binding it would be); None when
    it is linked to this user already."""
    pending = PendingLogin.objects.filter(digest=digest(raw.strip()), declined__isnull=True).first()
    if pending is None:
        raise AccessDenied(UNKNOWN_CLI_ID, 404)
    if pending.token_id and pending.token.user_id != user.pk:
        raise AccessDenied("This CLI id is already linked to another account.", 409)
    return None if pending.token_id else pending


def do_decline_cli_login(raw: str) -> bool:
    """The user declines to link a pending id: the CLI waiting on it is told (its `/me` answers 403) and stops."""
    return bool(PendingLogin.objects.filter(digest=digest(raw.strip()), token__isnull=True, declined__isnull=True)
                .update(declined=timezone.now()))


UNKNOWN_CLI_ID = "Unknown or expired CLI id; run `kernelbot login` (or `popcorn-cli register`) again."
DECLINED_CLI_ID = "This CLI login was declined in the browser: nothing was linked. Run `kernelbot login` (or " \
    "`popcorn-cli register`) again to link a CLI you started yourself."


def do_bind_cli_login(user, raw: str, replace: bool = False) -> ApiToken:
    """Make a pending id the user's token (the logged-in "link this CLI" page, or the OAuth callback). `replace`
    (popcorn-cli's `reregister`): the user's earlier CLI ids of the same provider are revoked."""
    with transaction.atomic():
        pending = PendingLogin.objects.select_for_update().filter(digest=digest(raw.strip()),
                                                                  declined__isnull=True).first()
        if pending is None:
            raise AccessDenied(UNKNOWN_CLI_ID, 404)
        if pending.token_id:
            if pending.token.user_id != user.pk:
                raise AccessDenied("This CLI id is already linked to another account.", 409)
            return pending.token
        name = "kernelbot CLI" if pending.provider == KERNELBOT_CLI else f"popcorn-cli ({pending.provider})"
        pending.token = ApiToken.objects.create(user=user, name=name, digest=pending.digest, hint=raw.strip()[:10])
        pending.save(update_fields=["token"])
        if replace:
            earlier = ApiToken.objects.filter(user=user, revoked__isnull=True,
                                              pendinglogin__provider=pending.provider).exclude(pk=pending.token_id)
            digests = list(earlier.values_list("digest", flat=True))
            earlier.update(revoked=timezone.now())
            transaction.on_commit(lambda: forget(*map(token_key, digests)))
        return pending.token


def admin_token_matches(presented: str | None) -> bool:
    expected = settings.ADMIN_TOKEN
    return bool(expected) and presented is not None and hmac.compare_digest(presented.encode(), expected.encode())


# --- who may submit how often (who may see where: authority.py) ---------------------------------------
def _switch() -> JobSwitch:
    return JobSwitch.objects.filter(pk=1).first() or JobSwitch(pk=1)


def _quotas(leaderboard_id: int) -> dict[str, tuple[int, int, bool]]:
    return {q.kind: (q.max_submissions, q.window_seconds, q.frozen)
            for q in SubmissionQuota.objects.filter(leaderboard_id=leaderboard_id)}


def do_set_kernelbot_rate_limit(leaderboard: Leaderboard, kind: str, per_hour: int) -> SubmissionQuota:
    """KernelBot's rate limit: `per_hour` submissions per hour, 0 = frozen (this platform's own 0 = unlimited is
    kept as it is: a frozen quota is its own flag)."""
    quota, _ = SubmissionQuota.objects.update_or_create(
        leaderboard=leaderboard, kind=kind,
        defaults={"max_submissions": per_hour, "window_seconds": 3600, "frozen": per_hour == 0})
    return quota  # its post_save receiver forgets the cached quotas


def accepting_jobs() -> JobSwitch:
    return cached(key("switch"), _switch)


def do_set_accepting_jobs(accepting: bool, reason: str = "") -> JobSwitch:
    switch, _ = JobSwitch.objects.update_or_create(pk=1, defaults={"accepting": accepting, "reason": reason})
    return switch  # its post_save receiver forgets the cached switch


def quota_kind(mode: str) -> str:
    return QuotaKind.RANKED if mode == SubmissionMode.LEADERBOARD else QuotaKind.TEST


def check_may_submit(user, leaderboard: Leaderboard, mode: str) -> None:
    """Jobs switch, bans and the per-user quota; raises SubmissionRejected (503, 403, 429). The three settings
    come from the cache in one round trip."""
    found = cached_many({key("switch"): _switch, key("quotas", leaderboard.pk): lambda: _quotas(leaderboard.pk),
                         key("bans", user.pk): lambda: list(Ban.objects.filter(user=user))})
    switch, quotas, bans = found[key("switch")], found[key("quotas", leaderboard.pk)], found[key("bans", user.pk)]
    if not switch.accepting:
        raise SubmissionRejected("Submissions are paused by the organisers"
                                 + (f": {switch.reason}" if switch.reason else "") + "; try again later.", 503)
    ban = next((b for b in bans if b.leaderboard_id in (leaderboard.pk, None)), None)
    if ban is not None:
        where = f"'{leaderboard.name}'" if ban.leaderboard_id else "all leaderboards"
        raise SubmissionRejected(f"You are banned from submitting to {where}"
                                 + (f": {ban.reason}" if ban.reason else "") + ".", 403)
    check_quota(user, leaderboard, mode, quotas)


def check_quota(user, leaderboard: Leaderboard, mode: str, quotas: dict | None = None) -> None:
    kind = quota_kind(mode)
    if quotas is None:
        quotas = cached(key("quotas", leaderboard.pk), lambda: _quotas(leaderboard.pk))
    limit, window, *frozen = quotas.get(kind) or settings.SUBMISSION_QUOTAS[kind]
    if frozen and frozen[0]:
        raise SubmissionRejected(f"{kind.capitalize()} submissions to '{leaderboard.name}' are frozen by the "
                                 "organisers.", 403)
    if not limit:
        return
    modes = [SubmissionMode.LEADERBOARD] if kind == QuotaKind.RANKED else \
        [m for m in SubmissionMode.values if m != SubmissionMode.LEADERBOARD]
    since = timezone.now() - timedelta(seconds=window)
    recent = Submission.objects.made_by(user).filter(leaderboard=leaderboard, mode__in=modes, created__gte=since) \
        .exclude(runs__problem_error=True)  # a run the problem's own code broke is not charged; nor a final re-run
    stats = recent.aggregate(n=Count("pk"), oldest=Min("created"))
    if stats["n"] >= limit:
        retry = max(1, int((stats["oldest"] + timedelta(seconds=window) - timezone.now()).total_seconds()) + 1)
        raise SubmissionRejected(
            f"Rate limit: at most {limit} {kind} submission(s) per {window // 60 or window} "
            f"{'minutes' if window >= 60 else 'seconds'} on '{leaderboard.name}'; retry in {retry} s.",
            429, retry_after=retry)


def lock_quota(user, leaderboard: Leaderboard, mode: str) -> None:
    """Inside the transaction that writes a submission: take the user's lock (a no-op write to their user row, which
    waits for any other transaction of theirs holding it, on PostgreSQL and SQLite alike) and count again, so
    submissions sent at once cannot all pass a quota that has room for fewer. Nothing is locked where no quota
    applies."""
    quotas = cached(key("quotas", leaderboard.pk), lambda: _quotas(leaderboard.pk))
    limit, *_ = quotas.get(quota_kind(mode)) or settings.SUBMISSION_QUOTAS[quota_kind(mode)]
    if limit:
        get_user_model().objects.filter(pk=user.pk).update(is_active=F("is_active"))
        check_quota(user, leaderboard, mode, quotas)


# --- invitations and bans -----------------------------------------------------------------------
def do_create_invite(leaderboard: Leaderboard, max_uses: int = 1, expires_days: int | None = None,
                     more: list[Leaderboard] = ()) -> Invite:
    """A code admitting to `leaderboard` and the `more` boards."""
    expires = timezone.now() + timedelta(days=min(max(expires_days, 1), MAX_DAYS)) if expires_days else None
    with transaction.atomic():
        invite = Invite.objects.create(leaderboard=leaderboard, max_uses=min(max(1, max_uses), MAX_INVITE_USES),
                                       expires=expires)
        if more := [b for b in more if b.pk != leaderboard.pk]:
            invite.more_leaderboards.set(more)
    return invite


def check_invite(code: str, *, lock: bool = False) -> Invite:
    """The invite `code` names while it still admits anyone; unknown and expired codes are refused, each saying so.
    Whether it is used up depends on who asks (its members pass): `do_join` decides that."""
    invites = Invite.objects.select_related("leaderboard")
    invite = (invites.select_for_update() if lock else invites).filter(code=code.strip()).first()
    if invite is None:
        raise AccessDenied("Unknown invite code: check it for typos, or ask the organisers for a new one.", 404)
    if invite.expires and invite.expires <= timezone.now():
        raise AccessDenied(f"This invite code expired on {invite.expires:%Y-%m-%d %H:%M} UTC; ask the organisers for "
                           "a new one.", 410)
    return invite


def invite_boards(invite: Invite) -> list[Leaderboard]:
    """The boards a code opens: its leaderboard and its further ones."""
    return [invite.leaderboard, *invite.more_leaderboards.all()]


def do_join(user, code: str) -> Membership:
    """Membership of every board `code` opens; one use of the code, none when the user holds them all already."""
    with transaction.atomic():
        invite = check_invite(code, lock=True)
        boards = invite_boards(invite)
        held = set(Membership.objects.filter(leaderboard__in=boards, user=user).values_list("leaderboard_id",
                                                                                             flat=True))
        if len(held) == len(boards):
            return Membership.objects.get(leaderboard=invite.leaderboard, user=user)
        if invite.uses >= invite.max_uses:
            raise AccessDenied("This invite code has been used up: it admitted as many people as it was made for. Ask "
                               "the organisers for a new one.", 410)
        Invite.objects.filter(pk=invite.pk).update(uses=F("uses") + 1)
        Membership.objects.bulk_create([Membership(leaderboard=b, user=user, invite=invite) for b in boards
                                        if b.pk not in held])
        return Membership.objects.get(leaderboard=invite.leaderboard, user=user)


def do_ban(user, leaderboard: Leaderboard | None, reason: str = "") -> Ban:
    ban, _ = Ban.objects.update_or_create(user=user, leaderboard=leaderboard, defaults={"reason": reason})
    return ban  # its post_save receiver forgets the user's cached bans


def do_unban(user, leaderboard: Leaderboard | None) -> int:
    removed = Ban.objects.filter(user=user, leaderboard=leaderboard).delete()[0]
    forget(key("bans", user.pk))
    return removed


# --- queue position and ETA ---------------------------------------------------------------------
@dataclass(frozen=True)
class QueueEstimate:
    runner: str
    gpu: str
    queued_jobs: int
    position: int
    eta_seconds: int


DEFAULT_RUN_SECONDS = 60.0


def _mean_run_seconds(gpu_type_id: int) -> float:
    recent = Run.objects.filter(gpu_type_id=gpu_type_id, started_at__isnull=False, finished_at__isnull=False) \
        .order_by("-finished_at").values_list("pk", flat=True)[:50]
    mean = Run.objects.filter(pk__in=list(recent)).aggregate(
        d=Avg(ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField())))["d"]
    return mean.total_seconds() if mean else DEFAULT_RUN_SECONDS


def queue_estimate(submission: Submission, runs: Iterable[Run] | None = None) -> QueueEstimate | None:
    """Where the submission's first unfinished run stands in its GPU type's queue, and a rough ETA.
    `runs`: the submission's runs with their GPU types, when the caller holds them already."""
    if runs is None:
        runs = submission.runs.filter(status__in=ACTIVE_STATUSES).select_related("gpu_type")
    mine = sorted((run for run in runs if run.status in ACTIVE_STATUSES), key=lambda run: run.pk)
    if not mine:
        return None
    first = mine[0]
    ahead = first.queued_ahead
    if ahead is None:
        ahead = Run.objects.filter(gpu_type_id=first.gpu_type_id, status__in=ACTIVE_STATUSES, pk__lt=first.pk).count()
    devices, seconds = eta_inputs(first.gpu_type_id)
    eta = (ahead // devices + len(mine)) * seconds
    return QueueEstimate(runner=first.runner or "queue", gpu=first.gpu_type.name, queued_jobs=ahead + len(mine),
                         position=ahead + 1, eta_seconds=round(eta))


def eta_inputs(gpu_type_id: int) -> tuple[int, float]:
    """(devices serving the GPU type, mean seconds of its recent runs), cached 30 s in one round trip."""
    found = cached_many({key("devices", gpu_type_id): lambda: max(1, Gpu.objects.filter(
        gpu_type_id=gpu_type_id, enabled=True, node__enabled=True, node__pool__enabled=True).count()),
        key("run-seconds", gpu_type_id): lambda: _mean_run_seconds(gpu_type_id)}, timeout=30)
    return found[key("devices", gpu_type_id)], found[key("run-seconds", gpu_type_id)]
