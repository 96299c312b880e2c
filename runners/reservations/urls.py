from django.urls import path

from . import views

urlpatterns = [
    path("", views.gpus_page, name="gpus"),
    path("reserve", views.reserve, name="gpus_reserve"),
    path("<int:reservation_id>/<str:verb>", views.change, name="gpus_change"),
    path("usage/", views.usage_page, name="gpus_usage"),
    path("usage.csv", views.usage_csv, name="gpus_usage_csv"),
    path("slack", views.slack_command, name="gpus_slack"),
]
