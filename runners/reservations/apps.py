from django.apps import AppConfig


class ReservationsConfig(AppConfig):
    name = "runners.reservations"
    label = "reservations"
    verbose_name = "GPU reservations"
    default_auto_field = "django.db.models.BigAutoField"
