"""Mounted at /popcorn/ in kernelbot/urls.py: POPCORN_API_URL=https://<host>/popcorn."""

from django.urls import path

from .api import api, not_found
from .stream import stream_submit

urlpatterns = [
    path("", not_found),  # the mount root, /popcorn/: before ninja's own root view, which answers an HTML 404
    *api.urls[0],  # KernelBot's /admin/ban/{user_id} among them, before the three-segment route below
    # after the fixed routes: three free segments would otherwise shadow e.g. user/submissions/<id>
    path("<str:leaderboard>/<str:gpu>/<str:mode>", stream_submit, name="popcorn-stream"),
    path("<path:rest>", not_found),  # popcorn's JSON 404 for every other path
]
