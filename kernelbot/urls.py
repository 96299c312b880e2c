from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from leaderboards.popcorn.api import not_found as popcorn_not_found

from . import metrics
from .api import api

urlpatterns = [
    path("", include("leaderboards.urls")),
    path("accounts/", include("allauth.urls")),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    path("api/runner/v1/", include("leaderboards.runner_api")),
    path("api/runner/v1/", include("runners.urls")),  # service webhooks (GitHub); no route overlaps the runner API
    path("metrics", metrics.metrics, name="metrics"),
    path("api/docs", RedirectView.as_view(url="/api/v1/docs", permanent=False)),
    path("gpus/", include("runners.reservations.urls")),
    path("favicon.ico", RedirectView.as_view(url=static("kb/favicon.svg"), permanent=True)),
    path("popcorn", popcorn_not_found),  # POPCORN_API_URL itself: JSON, not APPEND_SLASH's redirect
    path("popcorn/", include("leaderboards.popcorn.urls")),
    path("tokens/", include("leaderboards.access.urls")),
]
