from django.urls import path, re_path

from . import consumers

websocket_urlpatterns = [
    path("ws/leaderboard/<int:leaderboard_id>/<int:gpu_type_id>/", consumers.LeaderboardConsumer.as_asgi()),
    path("ws/submission/<int:submission_id>/", consumers.SubmissionConsumer.as_asgi()),
    re_path(r"", consumers.NoSuchStream.as_asgi()),
]
