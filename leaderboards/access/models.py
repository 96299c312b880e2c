"""Who may call the API and submit where: API tokens (a popcorn cli id is one), pending CLI logins,
submission quotas, invitations and memberships for closed leaderboards, bans, and the jobs switch."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

TOKEN_PREFIX = "kb_"


def digest(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def new_secret() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


class ApiTokenQuerySet(models.QuerySet):
    def usable(self) -> ApiTokenQuerySet:
        """In SQL what `ApiToken.is_usable` checks in Python."""
        return self.filter(revoked__isnull=True).filter(
            models.Q(expires__isnull=True) | models.Q(expires__gt=timezone.now()))


class ApiToken(models.Model):
    """A per-user secret for the API; only its sha256 is stored, the secret is shown once."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=80, default="cli")
    digest = models.CharField(max_length=64, unique=True)
    hint = models.CharField(max_length=12, help_text="First characters of the secret, to tell tokens apart.")
    created = models.DateTimeField(auto_now_add=True)
    expires = models.DateTimeField(null=True, blank=True)
    last_used = models.DateTimeField(null=True, blank=True)
    revoked = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        verbose_name = "API token"
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.name} ({self.hint}…) of {self.user}"

    def is_usable(self, now=None) -> bool:
        return self.revoked is None and (self.expires is None or self.expires > (now or timezone.now()))


class PendingLogin(models.Model):
    """A CLI login's pending id (popcorn-cli's `/auth/init`, the kernelbot CLI's `/api/v1/auth/cli`): becomes the
    user's token once a logged-in user binds it. `provider`: popcorn-cli's OAuth provider, or "kernelbot"."""

    digest = models.CharField(max_length=64, unique=True)
    provider = models.CharField(max_length=20)
    address = models.CharField(max_length=64, blank=True, help_text="Where the CLI asked from (its client address), "
                               "named on the link page so a user can tell their own CLI from someone else's.")
    created = models.DateTimeField(auto_now_add=True)
    token = models.OneToOneField(ApiToken, null=True, blank=True, on_delete=models.CASCADE)
    declined = models.DateTimeField(null=True, blank=True, help_text="When the user declined to link it: the CLI "
                                    "waiting on it is told so, and it is never linked.")

    def __str__(self) -> str:
        return f"{self.provider} login {self.digest[:8]}"


class QuotaKind(models.TextChoices):
    TEST = "test", "Test, benchmark and profile"
    RANKED = "ranked", "Ranked (leaderboard)"


class SubmissionQuota(models.Model):
    """At most `max_submissions` per user in any `window_seconds`; no row → the settings default."""

    leaderboard = models.ForeignKey("leaderboards.Leaderboard", on_delete=models.CASCADE, related_name="quotas")
    kind = models.CharField(max_length=8, choices=QuotaKind.choices)
    max_submissions = models.PositiveIntegerField(help_text="0 means unlimited.")
    window_seconds = models.PositiveIntegerField(default=3600)
    frozen = models.BooleanField(default=False, help_text="No submissions of this kind at all (KernelBot's rate "
                                                          "limit of 0); the numbers above are then ignored.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["leaderboard", "kind"], name="quota_unique")]

    def __str__(self) -> str:
        return f"{self.leaderboard} {self.kind}: " + ("frozen" if self.frozen else
                                                      f"{self.max_submissions}/{self.window_seconds}s")


def new_invite_code() -> str:
    return secrets.token_urlsafe(9)


class Invite(models.Model):
    code = models.CharField(max_length=32, unique=True, default=new_invite_code)
    leaderboard = models.ForeignKey("leaderboards.Leaderboard", on_delete=models.CASCADE, related_name="invites")
    more_leaderboards = models.ManyToManyField("leaderboards.Leaderboard", blank=True, related_name="+",
                                               help_text="Further boards the code admits to (KernelBot's invites "
                                                         "cover several).")
    max_uses = models.PositiveIntegerField(default=1)
    uses = models.PositiveIntegerField(default=0)
    expires = models.DateTimeField(null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.code} → {self.leaderboard}"


class Membership(models.Model):
    """A user admitted to a closed leaderboard."""

    leaderboard = models.ForeignKey("leaderboards.Leaderboard", on_delete=models.CASCADE, related_name="members")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    invite = models.ForeignKey(Invite, null=True, blank=True, on_delete=models.SET_NULL)
    joined = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["leaderboard", "user"], name="membership_unique")]

    def __str__(self) -> str:
        return f"{self.user} in {self.leaderboard}"


class Ban(models.Model):
    """A user barred from submitting to one leaderboard, or to all when `leaderboard` is empty."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="bans")
    leaderboard = models.ForeignKey("leaderboards.Leaderboard", null=True, blank=True, on_delete=models.CASCADE,
                                    related_name="bans")
    reason = models.CharField(max_length=200, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.user} banned from {self.leaderboard or 'everything'}"


class JobSwitch(models.Model):
    """Singleton row (pk=1): whether new submissions are accepted at all (popcorn `admin start|stop`)."""

    accepting = models.BooleanField(default=True)
    reason = models.CharField(max_length=200, blank=True)
    changed = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = verbose_name_plural = "jobs switch"

    def __str__(self) -> str:
        return "accepting jobs" if self.accepting else f"jobs stopped: {self.reason}"

    def save(self, *args, **kwargs) -> None:
        self.pk = 1  # one switch: a second row would be read by nothing
        super().save(*args, **kwargs)


class KnownClient(models.Model):
    """Where an account logged in before: an address (an IPv6 address's /64) or a browser (the site's device cookie),
    as a keyed digest only (leaderboards.access.adapter). Failed logins from elsewhere never refuse the right password
    from one of these."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="known_clients")
    digest = models.CharField(max_length=64)
    last_login = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "digest"], name="one_known_client_per_digest")]

    def __str__(self) -> str:
        return f"{self.user}'s client {self.digest[:8]}"
