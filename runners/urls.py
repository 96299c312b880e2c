from django.urls import path

from . import webhooks

urlpatterns = [
    path("github/webhook/<int:pool_id>", webhooks.github_webhook, name="github-webhook"),
]
