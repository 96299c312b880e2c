"""The NinjaAPI; each app mounts its router here."""

from django.db import connection
from ninja import NinjaAPI

from leaderboards.access.api import optional_token_auth, token_auth
from leaderboards.access.api import router as access_router
from leaderboards.api import router as leaderboards_router
from runners.actions import runner_health
from runners.reservations.api import router as reservations_router
from runners.reservations.keys_api import router as keys_router

from .api_errors import install_error_handlers

api = NinjaAPI(title="kernelbot", version="1", urls_namespace="api")
install_error_handlers(api)
api.add_router("/", leaderboards_router)
api.add_router("/", access_router)
api.add_router("/", reservations_router, auth=token_auth)  # the same API tokens
api.add_router("/", keys_router, auth=token_auth)


@api.get("/health", tags=["meta"])
def health(request) -> dict:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return {"status": "ok"}


@api.get("/health/runners", tags=["meta"], auth=optional_token_auth)
def health_runners(request) -> dict:
    """Each GPU type's availability; staff (a browser session or an API token) also get the nodes out of service
    and why."""
    return runner_health(staff=request.auth.is_staff)
