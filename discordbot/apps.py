from django.apps import AppConfig


class DiscordbotConfig(AppConfig):
    name = "discordbot"
    default_auto_field = "django.db.models.BigAutoField"
