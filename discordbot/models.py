"""What the organisers set in the admin (guilds, channels, organiser roles) and what the bot must remember across
restarts and processes (announcements claimed, live status messages)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

SNOWFLAKE_HELP = "Discord id (Developer Mode → right-click → Copy ID)."


class Guild(models.Model):
    """A Discord server the bot serves. Empty channels: submissions are taken in any channel; nothing is posted."""

    guild_id = models.BigIntegerField(unique=True, help_text=SNOWFLAKE_HELP)
    name = models.CharField(max_length=100, blank=True)
    enabled = models.BooleanField(default=True)
    submission_channel_id = models.BigIntegerField(
        null=True, blank=True, help_text="Only this channel takes /leaderboard submit; empty: any channel.")
    announcement_channel_id = models.BigIntegerField(
        null=True, blank=True, help_text="New leaderboards, final standings (and personal bests where kept); "
                                         "podium changes go to the submission channel, else here.")
    report_channel_id = models.BigIntegerField(
        null=True, blank=True, help_text="Live status moves here when a run outlives its 15-minute interaction; "
                                         "statistics are posted here.")
    participant_role_id = models.BigIntegerField(
        null=True, blank=True, help_text="Pinged when a new leaderboard opens.")
    personal_bests = models.BooleanField(
        default=False, help_text="Also post every personal best and first successful submission, not only podium "
                                 "changes (top 3, #1).")

    def __str__(self) -> str:
        return self.name or str(self.guild_id)


class OrganiserRole(models.Model):
    """Members holding this role may use the organiser commands, and see in Discord what staff see on the site."""

    guild = models.ForeignKey(Guild, on_delete=models.CASCADE, related_name="organiser_roles")
    role_id = models.BigIntegerField(help_text=SNOWFLAKE_HELP)
    name = models.CharField(max_length=100, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["guild", "role_id"], name="organiser_role_unique")]

    def __str__(self) -> str:
        return self.name or str(self.role_id)


class Announcement(models.Model):
    """One announced change. The row is claimed (unique `key`) before the message is posted, so several bot
    processes, or one that restarts, announce each change once; a claim whose post was never recorded is claimed
    again (compare-and-set on `claimed_at`) once it is stale, so a bot killed mid-post or a refused post loses
    nothing."""

    key = models.CharField(max_length=120, unique=True)
    guild = models.ForeignKey(Guild, on_delete=models.CASCADE, related_name="announcements")
    text = models.TextField()
    channel_id = models.BigIntegerField(null=True, blank=True, help_text="Where it is posted (a broken problem: "
                                        "the report channel); empty: the guild's announcement channel.")
    message_id = models.BigIntegerField(null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    claimed_at = models.DateTimeField(default=timezone.now)
    attempts = models.PositiveSmallIntegerField(default=1)

    def __str__(self) -> str:
        return self.key


class Podium(models.Model):
    """The top three of a board as last announced: compared with the board's top three, it says what changed; moved
    on by compare-and-set on `version`, so one process announces each change, once, across restarts."""

    leaderboard = models.ForeignKey("leaderboards.Leaderboard", on_delete=models.CASCADE, related_name="+")
    gpu_type = models.ForeignKey("runners.GpuType", on_delete=models.CASCADE, related_name="+")
    user_ids = models.JSONField(default=list)
    version = models.PositiveIntegerField(default=0)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["leaderboard", "gpu_type"], name="podium_unique")]

    def __str__(self) -> str:
        return f"podium of {self.leaderboard_id}/{self.gpu_type_id}"


class StatusMessage(models.Model):
    """The message showing a submission's live progress: first the interaction's response (edited through its
    token for 15 minutes), then an ordinary channel message. Lets a restarted bot go on editing it."""

    submission = models.OneToOneField("leaderboards.Submission", on_delete=models.CASCADE,
                                      related_name="discord_status")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    discord_user_id = models.BigIntegerField(help_text="Who submitted: the report goes to them.")
    public = models.BooleanField(help_text="A ranked submission's status is posted in the channel; others only to "
                                           "their author.")
    guild_id = models.BigIntegerField(null=True, blank=True)
    channel_id = models.BigIntegerField()
    application_id = models.BigIntegerField()
    interaction_token = models.CharField(max_length=500, blank=True)
    token_expires = models.DateTimeField(null=True, blank=True)
    original_id = models.BigIntegerField(help_text="The interaction's response message.")
    message_id = models.BigIntegerField(null=True, blank=True, help_text="The channel message, once it moved there.")
    finished = models.BooleanField(default=False)
    reported = models.BooleanField(default=False, help_text="Its author was sent the full report.")
    owner = models.CharField(max_length=100, blank=True, help_text="The bot process that edits it (host:pid:id).")
    lease_until = models.DateTimeField(null=True, blank=True, help_text="Another process may take it over after.")
    created = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"status of submission {self.submission_id}"
