from django.urls import path

from . import keys_views, views

urlpatterns = [
    path("", views.gpus_page, name="gpus"),
    path("reserve", views.reserve, name="gpus_reserve"),
    path("<int:reservation_id>/<str:verb>", views.change, name="gpus_change"),
    path("keys/", keys_views.keys_page, name="gpus_keys"),
    path("keys/<int:key_id>/remove", keys_views.change, {"verb": "remove"}, name="gpus_keys_remove"),
    path("keys/<str:verb>", keys_views.change, name="gpus_keys_change"),
    path("usage/", views.usage_page, name="gpus_usage"),
    path("usage.csv", views.usage_csv, name="gpus_usage_csv"),
    path("slack", views.slack_command, name="gpus_slack"),
]
