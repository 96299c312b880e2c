from django.apps import AppConfig


class RunnersConfig(AppConfig):
    name = "runners"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from kernelbot import forking

        from . import supervisor

        forking.register()
        supervisor.connect_worker_heartbeats()
