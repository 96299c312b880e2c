from django.urls import path

from . import views

app_name = "access"
urlpatterns = [
    path("link-cli/", views.link_cli, name="link-cli"),
    path("", views.tokens, name="tokens"),
    path("publishing/", views.publishing, name="publishing"),
]
