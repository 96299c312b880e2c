from django.apps import AppConfig
from django.conf import settings
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete

from runners.signals import remote_news


class LeaderboardsConfig(AppConfig):
    name = "leaderboards"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from runners.reservations import usage

        from . import health, lifecycle, ranks
        from .access import cache
        from .models import ApiToken, Ban, JobSwitch, Leaderboard, Profile, SubmissionQuota

        # an edit drops exactly the cached reads it affects (access/cache.py)
        for model, receiver in ((Leaderboard, cache.leaderboard_changed), (ApiToken, cache.token_changed),
                                (SubmissionQuota, cache.quota_changed), (Ban, cache.ban_changed),
                                (JobSwitch, cache.switch_changed),
                                (Profile, cache.profile_changed)):
            post_save.connect(receiver, sender=model, dispatch_uid=f"cache-saved-{model.__name__}")
            post_delete.connect(receiver, sender=model, dispatch_uid=f"cache-deleted-{model.__name__}")
        post_save.connect(cache.user_changed, sender=settings.AUTH_USER_MODEL, dispatch_uid="cache-saved-user")
        m2m_changed.connect(cache.leaderboard_gpu_types_changed, sender=Leaderboard.gpu_types.through,
                            dispatch_uid="cache-board-gpus")
        # a deleted user's entries and records leave their boards as a deleted submission's do
        pre_delete.connect(ranks.user_deleting, sender=settings.AUTH_USER_MODEL, dispatch_uid="ranks-user-deleting")
        # a runner service's news about a job (GitHub's workflow_run webhook) polls its run at once
        remote_news.connect(lifecycle.remote_news_received, dispatch_uid="lifecycle-remote-news")
        # the pool health checks' device time is the platform's, not a person's or a competition's
        usage.INTERNAL_USERNAMES.add(health.CHECK_USER)
