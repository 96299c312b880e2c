"""Words that mislead (issue 36, item 4): a link that fills in someone else's CLI id asks first, naming where and when
that CLI asked; the record chart plots what the board ranks on, so its lowest point is rank 1."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest

from leaderboards import ranks
from leaderboards.access.models import ApiToken, PendingLogin
from leaderboards.models import Board, BoardEntry, Record

from ..factories import UserFactory, submission
from ..leaderboards.test_problem_collections import migrator  # noqa: F401 - fixture
from ..leaderboards.test_ranks import with_ratio

pytestmark = pytest.mark.django_db
START = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_link_naming_a_cli_id_asks_before_linking_and_names_its_host_and_time(client):
    cli_id = client.post("/api/v1/auth/cli", REMOTE_ADDR="203.0.113.7").json()["cli_id"]
    asked = PendingLogin.objects.get()
    assert asked.address == "203.0.113.7"
    client.force_login(UserFactory(username="victim"))
    page = client.get(f"/tokens/link-cli/?state={cli_id}", REMOTE_ADDR="198.51.100.2").content.decode()
    assert 'id="confirm-link"' in page and 'id="cli-id"' not in page  # no ready form with the id in it
    assert re.search(r'The kernelbot CLI on\s+<strong id="cli-host">203\.0\.113\.7</strong> asked at', page)
    assert f'{asked.created.astimezone(UTC):%Y-%m-%d %H:%M} UTC' in page and "This browser is on 198.51.100.2" in page
    assert "If someone sent you this link, do not link it." in page
    assert "Yes, link this CLI to <bdi>victim</bdi>" in page
    assert not ApiToken.objects.exists()
    client.post("/tokens/link-cli/", {"cli_id": cli_id, "confirm": "yes"})
    assert ApiToken.objects.get().user.username == "victim"
    again = client.get(f"/tokens/link-cli/?state={cli_id}", follow=True).content.decode()  # linked already
    assert "unknown, expired or linked already: nothing is filled in" in again and 'value=""' in again
    assert 'id="confirm-link"' not in again


def test_the_record_chart_plots_what_the_board_ranks_on(client, leaderboard, cpu_pool):
    """Alice is faster in time, Bob against the reference: the board ranks Bob first, and so do the records."""
    alice, bob = UserFactory(username="alice"), UserFactory(username="bob")
    ranks.do_rank_result(with_ratio(submission(leaderboard, alice, code="a", created=START), 1000.0, 0.9))
    ranks.do_rank_result(with_ratio(submission(leaderboard, bob, code="b", created=START + timedelta(hours=1)),
                                    3000.0, 0.5))
    assert [e.user for e in BoardEntry.objects.for_board(leaderboard, cpu_pool.cpu)] == [bob, alice]
    page = client.get(f"/lb/{leaderboard.name}/").content.decode()
    chart = json.loads(re.search(r'<script id="chart-data" type="application/json">(.*?)</script>', page).group(1))
    assert chart["onRatio"] is True
    assert [(figure, chart["names"][str(user)]) for _, figure, user in chart["records"]] == [(0.9, "alice"),
                                                                                              (0.5, "bob")]
    assert min(chart["records"], key=lambda r: r[1])[2] == bob.pk  # the chart's lowest point is rank 1
    assert "0.500× the reference" in page and "0.900× the reference" in page
    assert ranks.do_recompute_ranks(leaderboard.pk, cpu_pool.cpu.pk) is False  # the rebuild agrees


@pytest.mark.django_db(transaction=True)
def test_the_migration_rebuilds_a_ratio_boards_records_on_the_ratio(leaderboard, cpu_pool, migrator):  # noqa: F811
    alice, bob = UserFactory(username="alice"), UserFactory(username="bob")
    ranks.do_rank_result(with_ratio(submission(leaderboard, alice, code="a", created=START), 1000.0, 0.9))
    ranks.do_rank_result(with_ratio(submission(leaderboard, bob, code="b", created=START + timedelta(hours=1)),
                                    3000.0, 0.5))
    wanted = sorted(Record.objects.values_list("user", "score", "board_best"))
    # as the records were kept before: on time, where bob's slower result was no record
    Record.objects.all().delete()
    Record.objects.create(leaderboard=leaderboard, gpu_type=cpu_pool.cpu, user=alice, board_best=True,
                          submission=alice.submissions.get(), score=1e-6, submitted_at=START)
    Record.objects.create(leaderboard=leaderboard, gpu_type=cpu_pool.cpu, user=bob, board_best=False,
                          submission=bob.submissions.get(), score=3e-6, submitted_at=START + timedelta(hours=1))
    assert Board.objects.get().ranks_on_ratio
    migrator([("leaderboards", "0018_problem_collection")])
    migrator([("leaderboards", "0019_record_on_rank_figure")])
    assert sorted(Record.objects.values_list("user", "score", "board_best")) == wanted == sorted(
        [(alice.pk, 0.9, True), (bob.pk, 0.5, True)])
