from django.urls import path

from . import views
from .access import views as access_views

urlpatterns = [
    path("", views.home, name="home"),
    path("submit/", views.submit, name="submit"),
    path("join/", access_views.join, name="invitation"),
    path("lb/<slug:name>/", views.leaderboard, name="leaderboard"),
    path("lb/<slug:name>/dataset.parquet", views.leaderboard_dataset, name="leaderboard_dataset"),
    path("lb/<slug:name>/<str:kind>/<str:key>", views.leaderboard_file, name="leaderboard_file"),
    path("s/<int:pk>/", views.submission, name="submission"),
    path("s/<int:pk>/code", views.submission_code, name="submission_code"),
    path("s/<int:pk>/runs/<int:run_id>/<str:stream>.txt", views.submission_log, name="submission_log"),
    path("u/<str:username>/", views.user_page, name="user"),
]
