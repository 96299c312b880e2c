from django.apps import AppConfig


class PopcornConfig(AppConfig):
    name = "popcorn"
    verbose_name = "popcorn-cli wire compatibility"
