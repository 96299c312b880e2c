"""Each database refusal is named for what it is: a NUL byte, a number out of range, an over-long text."""

from __future__ import annotations

import pytest
from django.db import DataError, connection, transaction

from kernelbot.api_errors import NUL_BYTES, refusal
from leaderboards.models import Code, Submission

pytestmark = pytest.mark.django_db


def refused_by_the_database(query) -> str:
    with pytest.raises(DataError) as caught, transaction.atomic():
        query()
    message, status, _ = refusal(caught.value)
    assert status == 400
    return message


def test_database_refusals_get_their_own_messages(postgres):
    assert refused_by_the_database(lambda: Code.objects.create(sha256="x", text="a\x00b")) == NUL_BYTES
    assert "too large" in refused_by_the_database(
        lambda: list(Submission.objects.raw("SELECT id FROM leaderboards_submission OFFSET %s", [10**20])))
    assert "longer than its field allows" in refused_by_the_database(
        lambda: Code.objects.create(sha256="x" * 65, text=""))
    assert connection.vendor == "postgresql"


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("put", "/api/v1/submissions", {"GET", "POST"}),  # django-ninja's route: "Method not allowed" as text
    ("delete", "/api/v1/health", {"GET"}),
    ("get", "/popcorn/submission/vectoradd/CPU/test", {"POST"}),
    ("get", "/api/runner/v1/nodes/poll", {"POST"}),  # a plain Django view (require_POST): an empty body
])
def test_a_method_a_route_does_not_take_is_a_405_in_the_apis_error_format(client, method, path, allowed):
    """issue 35: /api/v1 answered a wrong method with text/html "Method not allowed"; every route of the APIs answers
    {"detail": ...} naming the methods it takes, and keeps the Allow header."""
    answer = getattr(client, method)(path)
    assert answer.status_code == 405 and answer["Content-Type"] == "application/json", answer.content
    assert {m.strip() for m in answer["Allow"].split(",")} == allowed
    detail = answer.json()["detail"]
    assert method.upper() in detail and all(m in detail for m in allowed)


def test_a_page_keeps_djangos_own_405(client):
    from ..factories import UserFactory

    client.force_login(UserFactory())
    answer = client.get("/tokens/publishing/")  # a page's form target (POST only): not the APIs, no JSON forced
    assert answer.status_code == 405 and not answer["Content-Type"].startswith("application/json")
