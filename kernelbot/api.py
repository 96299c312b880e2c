"""The NinjaAPI; each app mounts its router here."""

from django.db import connection
from ninja import NinjaAPI

api = NinjaAPI(title="kernelbot", version="1", urls_namespace="api")


@api.get("/health", tags=["meta"])
def health(request) -> dict:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return {"status": "ok"}
