"""Property tests over our OpenAPI document: no 5xx, every documented response matches its schema.
Bounded: a few examples per operation (~1 min in all)."""

from __future__ import annotations

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance

from leaderboards.access.actions import do_create_token

from ..factories import UserFactory, submission
from ..fakes.github_keys import FakeGithubKeys

schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", get_wsgi_application())
# the progress stream never ends for a queued submission; tests/api/test_live_server.py covers it
schema = schema.exclude(path_regex=r"/events$")


@pytest.fixture
def github(settings):
    """The GitHub key import reaches a loopback fake (a user with no keys: 404 there), never github.com."""
    fake = FakeGithubKeys()
    settings.GITHUB_WEB_URL = fake.url
    yield fake
    fake.close()


@pytest.fixture
def token(db, leaderboard, github):
    # as Django's test client does: requests must not close the test transaction's connection
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    user = UserFactory(username="fuzz")
    for _ in range(2):
        submission(leaderboard, user, mode="test")
    yield do_create_token(user)[1]
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@pytest.mark.django_db
def test_api(case, token):
    case.call_and_validate(headers={"Authorization": f"Bearer {token}"},
                           checks=[not_a_server_error, response_schema_conformance, content_type_conformance])
