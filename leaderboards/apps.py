from django.apps import AppConfig
from django.conf import settings
from django.db.models.signals import m2m_changed, post_delete, post_save


class LeaderboardsConfig(AppConfig):
    name = "leaderboards"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from .access.actions import clear_cache
        from .models import ApiToken, Leaderboard

        # what submissions keep per process (access.actions.cached) is dropped when it changes here
        for model in (Leaderboard, ApiToken, settings.AUTH_USER_MODEL):
            post_save.connect(clear_cache, sender=model, dispatch_uid=f"cache-saved-{model}")
            post_delete.connect(clear_cache, sender=model, dispatch_uid=f"cache-deleted-{model}")
        m2m_changed.connect(clear_cache, sender=Leaderboard.gpu_types.through, dispatch_uid="cache-board-gpus")
