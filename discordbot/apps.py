from django.apps import AppConfig


class DiscordbotConfig(AppConfig):
    name = "discordbot"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import gpus  # noqa: PLC0415 - models are loaded only now

        gpus.register()  # reservations' notices and the daily usage post reach Discord from any process
