from django.contrib import admin
from django.urls import path

from leaderboards import views

from .api import api

urlpatterns = [
    path("", views.home, name="home"),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
]
