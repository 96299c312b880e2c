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
