"""/api/v1/gpus routes, the web pages, usage reports (CSV, chat posts to loopback webhooks, Slack's signed command)
and the node agent with a stand-in nvidia-smi."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlencode

import pytest
from django.utils import timezone

from leaderboards.access.actions import do_create_token
from runners.models import Gpu
from runners.reservations import actions, agent, allocator, chat, tasks, usage
from runners.reservations.models import DeviceHold, HoldKind, NodeSample, Reservation, UsagePost
from tests import factories

from .conftest import gpu_pool

pytestmark = pytest.mark.django_db


def auth(user) -> dict:
    return {"Authorization": f"Bearer {do_create_token(user)[1]}"}


def post(client, path, body, user):
    return client.post(f"/api/v1{path}", json.dumps(body), content_type="application/json", headers=auth(user))


def test_api_reserve_queue_show_extend_cancel(client, user, other, monkeypatch):
    gpu_pool(nodes=1, per_node=4)
    asked = []
    monkeypatch.setattr(actions, "enqueue", lambda func, *args: asked.append((func, args)))
    monkeypatch.setattr(actions.transaction, "on_commit", lambda f: f())  # the test's transaction never commits
    r = post(client, "/gpus/reservations", {"gpu_type": "h100", "gpu_count": 4, "minutes": 60, "project": "p"}, user)
    # the answer is the recorded request; the planning pass it asked for follows
    assert r.status_code == 201 and r.json()["status"] == "pending" and r.json()["planned_start"] is None
    assert r.json()["events"][0]["kind"] == "queued" and len(asked) == 1
    mine = r.json()["id"]
    assert tasks.plan_asked(*asked.pop()[1]) == 1
    shown = client.get(f"/api/v1/gpus/reservations/{mine}", headers=auth(user)).json()
    assert shown["status"] == "active" and shown["gpus"] == [0, 1, 2, 3]
    q = post(client, "/gpus/reservations", {"gpu_type": "H100", "gpu_count": 2, "minutes": 30}, other)
    q2 = post(client, "/gpus/reservations", {"gpu_type": "H100", "gpu_count": 1, "minutes": 30}, other)
    assert len(asked) == 1  # one pass asked for both: it has not begun
    assert tasks.plan_asked(*asked.pop()[1]) == 0
    for queued in (q, q2):
        shown = client.get(f"/api/v1/gpus/reservations/{queued.json()['id']}", headers=auth(other)).json()
        assert shown["status"] == "pending" and shown["planned_start"]
    post(client, f"/gpus/reservations/{q2.json()['id']}/cancel", {}, other)
    avail = client.get("/api/v1/gpus/availability", headers=auth(other)).json()
    assert avail[0]["free_now"] == 0 and avail[0]["queued"] == 1 and avail[0]["eta"]["8"] is None
    assert client.get(f"/api/v1/gpus/reservations/{mine}", headers=auth(other)).status_code == 404
    assert post(client, f"/gpus/reservations/{mine}/extend", {"minutes": 30}, other).status_code == 404
    refused = post(client, f"/gpus/reservations/{mine}/extend", {"minutes": 30}, user)
    assert refused.status_code == 409 and "would delay 1 queued" in refused.json()["detail"]
    assert post(client, f"/gpus/reservations/{mine}/cancel", {}, user).json()["status"] == "ended"
    again = post(client, f"/gpus/reservations/{mine}/cancel", {}, user)
    assert again.status_code == 409 and again.json()["detail"] == f"Reservation {mine} is already ended."
    listed = client.get("/api/v1/gpus/reservations?all=true", headers=auth(user)).json()
    assert [x["id"] for x in listed] == [mine] and listed[0]["events"][0]["kind"] == "queued"


@pytest.mark.parametrize(("body", "status", "detail"), [
    ({"gpu_type": "B200", "gpu_count": 1, "minutes": 60}, 400, "Unknown GPU type 'B200'"),
    ({"gpu_type": "H100", "gpu_count": 9, "minutes": 60}, 400, "do not fit on one node"),
    ({"gpu_type": "H100", "gpu_count": 1, "minutes": 0}, 400, "at least 1 minute"),
    ({"gpu_type": "H100", "gpu_count": -1, "minutes": 10}, 400, "at least 1"),
    ({"gpu_type": "H100", "gpu_count": 1, "minutes": 100000}, 400, "longer than the longest"),
    ({"gpu_type": "H100", "minutes": "soon"}, 422, "minutes"),
])
def test_api_bad_input_is_a_precise_4xx(client, user, body, status, detail):
    gpu_pool()
    r = post(client, "/gpus/reservations", body, user)
    assert r.status_code == status and detail in r.json()["detail"]
    assert not Reservation.objects.exists()


def test_web_page_shows_eta_before_confirming(client, user, other):
    gpu_pool(nodes=1, per_node=2, access_note="ssh {hostname}")
    client.force_login(other)
    client.post("/gpus/reserve", {"gpu_type": "H100", "gpu_count": 2, "minutes": 60})
    client.force_login(user)
    page = client.get("/gpus/", {"gpu_type": "h100", "gpu_count": 1, "minutes": 30}).content.decode()
    ends = Reservation.objects.get(user=other).ends_at
    assert 'id="eta"' in page and f"{ends:%Y-%m-%d %H:%M} UTC" in page
    assert not Reservation.objects.filter(user=user).exists()
    assert client.post("/gpus/reserve", {"gpu_type": "h100", "gpu_count": 1, "minutes": 30}).status_code == 302
    assert Reservation.objects.get(user=user).status == "pending"
    bad = client.post("/gpus/reserve", {"gpu_type": "nope", "gpu_count": 1, "minutes": 30})
    assert bad.status_code == 400 and "Unknown GPU type" in bad.content.decode()
    theirs = Reservation.objects.get(user=other).pk
    assert client.post(f"/gpus/{theirs}/cancel").status_code == 404
    client.force_login(other)
    assert "ssh lab-node0" in client.get("/gpus/").content.decode()


def hold(gpu, kind, project, hours_ago, hours, user=None, leaderboard=""):
    """A hold that ended, through the allocator's one way to end holds (which also counts it into the roll-up)."""
    start = timezone.now() - timedelta(hours=hours_ago)
    made = DeviceHold.objects.create(gpu=gpu, node=gpu.node, pool=gpu.node.pool, gpu_type=gpu.gpu_type, kind=kind,
                                     project=project, leaderboard=leaderboard, user=user, started=start,
                                     ends=start + timedelta(hours=hours))
    assert allocator.end_hold(made, start + timedelta(hours=hours))
    return made


def sample(gpu, at, utilization):
    """A node agent's reading at `at`, with the device's holder then, as `usage.record_samples` stores it."""
    holder = usage.holder_fields(usage.holders_at([gpu.pk], at).get(gpu.pk))
    return NodeSample.objects.create(gpu=gpu, node=gpu.node, at=at, utilization=utilization, **holder)


@pytest.fixture
def recorded(user):
    pool = gpu_pool(nodes=2, per_node=2)
    g = list(Gpu.objects.filter(node__pool=pool).order_by("node__hostname", "index"))
    hold(g[0], HoldKind.RESERVATION, "llm", 10, 4, user)
    hold(g[1], HoldKind.RESERVATION, "llm", 10, 4, user)
    hold(g[2], HoldKind.RUN, "vectoradd", 5, 0.5, leaderboard="vectoradd")
    hold(g[3], HoldKind.RESERVATION, "old", 50, 1, user)  # outside a 1-day window
    for gpu, util in ((g[0], 80), (g[1], 40)):
        sample(gpu, timezone.now() - timedelta(hours=8), util)
    sample(g[2], timezone.now() - timedelta(hours=1), 99)
    return pool


def test_usage_table_api_and_csv(client, user, recorded):
    organiser = factories.UserFactory(username="org", is_staff=True)
    table = client.get("/api/v1/gpus/usage", headers=auth(organiser)).json()
    assert [(r["key"], r["gpu_hours"], r["usage_percent"], r["nodes"]) for r in table["rows"]] == [
        ("llm", 8.0, 60.0, 1), ("vectoradd", 0.5, None, 1)]
    assert (table["scope"], table["total_gpu_hours"]) == ("all", 8.5)
    by_user = client.get("/api/v1/gpus/usage?group=user&days=3", headers=auth(organiser)).json()["rows"]
    assert by_user == [{"key": "dev", "gpu_hours": 9.0, "usage_percent": 60.0, "nodes": 2},
                       {"key": "(none)", "gpu_hours": 0.5, "usage_percent": None, "nodes": 1}]
    filtered = client.get("/api/v1/gpus/usage?gpu_type=h100&pool=LAB&group=leaderboard",
                          headers=auth(organiser)).json()
    assert {r["key"] for r in filtered["rows"]} == {"(none)", "vectoradd"}
    assert client.get("/api/v1/gpus/usage?group=team", headers=auth(user)).status_code == 400
    assert client.get("/api/v1/gpus/usage?days=0", headers=auth(user)).status_code == 400
    # anyone else: their own device time, and everyone's total
    other = factories.UserFactory(username="someone")
    mine = client.get("/api/v1/gpus/usage?group=user&days=3", headers=auth(user)).json()
    assert mine["scope"] == "mine" and [r["key"] for r in mine["rows"]] == ["dev"] and mine["total_gpu_hours"] == 9.5
    assert client.get("/api/v1/gpus/usage?group=user", headers=auth(other)).json()["rows"] == []
    # the pages: a login first
    assert client.get("/gpus/usage.csv").status_code == 302 and client.get("/gpus/usage/").status_code == 302
    client.force_login(organiser)
    csv = client.get("/gpus/usage.csv").content.decode().splitlines()
    assert csv[0] == "project,gpu_hours,gpu_usage_percent,nodes_used" and csv[1] == "llm,8.0,60.0,1"
    assert csv[-1] == "(all users),8.5,,"
    page = client.get("/gpus/usage/", {"group": "project"}).content.decode()
    assert "llm" in page and "vectoradd" in page and "<svg" in page
    assert client.get("/gpus/usage/", {"pool": "nowhere"}).status_code == 400
    client.force_login(other)
    csv = client.get("/gpus/usage.csv?group=user").content.decode().splitlines()
    assert csv[1:] == ["(all users),8.5,,"]
    page = client.get("/gpus/usage/", {"group": "project"}).content.decode()
    assert "llm" not in page and "Your own device time" in page


class Recorder(BaseHTTPRequestHandler):
    bodies: list = []

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).bodies.append((self.path, json.loads(body)))
        answer = b"ok" if "slack" in self.path else json.dumps({"id": "1"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain" if "slack" in self.path else "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


@pytest.fixture
def webhooks():
    Recorder.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", Recorder.bodies
    server.shutdown()


def test_daily_post_to_discord_and_slack_once(settings, recorded, webhooks):
    base, bodies = webhooks
    settings.USAGE_DISCORD_WEBHOOK = f"{base}/discord/hook"
    settings.USAGE_SLACK_WEBHOOK = f"{base}/slack/hook"
    settings.USAGE_REPORT_HOUR = 0
    assert sorted(chat.post_daily_report()) == ["discord-webhook", "slack-webhook"]
    assert chat.post_daily_report() == []
    assert UsagePost.objects.count() == 2
    (dpath, discord), (spath, slack) = sorted(bodies, key=lambda b: b[0])
    assert dpath == "/discord/hook?wait=true" and spath == "/slack/hook"
    table = usage.to_text(usage.report(usage.Filters.parse(group="project")), "x").splitlines()[2]
    assert table.split()[:1] == ["llm"] and "llm" in discord["content"] and "60.0" in discord["content"]
    assert "llm" in slack["text"] and slack["blocks"][0]["text"]["type"] == "mrkdwn"


def slack_signed(settings, text: str, secret: str | None = None, age: int = 0) -> tuple[str, dict]:
    settings.SLACK_SIGNING_SECRET = "s3cret"
    body = urlencode({"command": "/gpu-usage", "text": text})
    stamp = str(int(time.time()) - age)
    sig = "v0=" + hmac.new((secret or "s3cret").encode(), f"v0:{stamp}:{body}".encode(), hashlib.sha256).hexdigest()
    return body, {"X-Slack-Signature": sig, "X-Slack-Request-Timestamp": stamp}


def slack_request(client, settings, text: str, secret: str | None = None, age: int = 0):
    body, headers = slack_signed(settings, text, secret, age)
    return client.post("/gpus/slack", body, content_type="application/x-www-form-urlencoded", headers=headers)


def test_slack_slash_command_verifies_signatures(client, settings, recorded):
    ok = slack_request(client, settings, "project cluster=lab partition=H100 days=1")
    assert ok.status_code == 200 and "llm" in ok.json()["text"] and ok.json()["response_type"] == "in_channel"
    assert slack_request(client, settings, "project", secret="wrong").status_code == 401
    assert slack_request(client, settings, "project", age=600).status_code == 401
    body, headers = slack_signed(settings, "project days=2", age=100)
    first = client.post("/gpus/slack", body, content_type="application/x-www-form-urlencoded", headers=headers)
    again = client.post("/gpus/slack", body, content_type="application/x-www-form-urlencoded", headers=headers)
    assert (first.status_code, again.status_code) == (200, 401)  # a replay inside the window
    assert "Unknown pool" in slack_request(client, settings, "cluster=nowhere").json()["text"]


def test_node_agent_posts_stand_in_nvidia_smi_readings(live_server, settings, tmp_path):
    pool = gpu_pool(nodes=1, per_node=2)
    settings.NODE_AGENT_TOKEN = "agent-token"
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, 75, 1024'\necho '1, [N/A], 0'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    assert agent.read(str(smi)) == [{"index": 0, "utilization": 75.0, "memory_used_mib": 1024}]
    os.environ["KERNELBOT_NODE_AGENT_TOKEN"] = "agent-token"
    try:
        assert agent.main(["--url", live_server.url, "--pool", pool.name, "--hostname", "lab-node0",
                           "--nvidia-smi", str(smi), "--once"]) == 0
        os.environ["KERNELBOT_NODE_AGENT_TOKEN"] = "wrong"
        assert agent.main(["--url", live_server.url, "--pool", pool.name, "--hostname", "lab-node0",
                           "--nvidia-smi", str(smi), "--once"]) == 1
    finally:
        del os.environ["KERNELBOT_NODE_AGENT_TOKEN"]
    sample = NodeSample.objects.get()
    assert (sample.gpu.index, sample.utilization, sample.memory_used_mib) == (0, 75.0, 1024)


def test_gpus_page_says_how_to_lend_a_pool_and_why_never(client, user):
    organiser = factories.UserFactory(username="org", is_staff=True)
    client.force_login(organiser)
    page = client.get("/gpus/").content.decode()
    assert "No pool lends GPUs." in page and "/admin/reservations/poolpolicy/add/" in page
    client.force_login(user)
    assert "poolpolicy/add" not in client.get("/gpus/").content.decode()
    gpu_pool(nodes=2, per_node=4, competition_share=0.25)  # 2 of 8 kept: one node lends 4, the other 2
    page = client.get("/gpus/").content.decode()
    assert "never*" in page
    assert "at most 4 can be reserved on one node (25% of 8 kept for competitions: 2)" in page
    [row] = client.get("/api/v1/gpus/availability", headers=auth(user)).json()
    assert row["eta"]["8"] is None and row["largest"] == 4 and "at most 4" in row["never"]
    gpu_pool(name="all-kept", nodes=1, per_node=1, competition_share=0.25)
    assert "none of its devices can be reserved" in client.get("/gpus/").content.decode()


def test_web_form_takes_a_quarter_hour_over_two_nodes(client, user):
    gpu_pool(nodes=2, per_node=2, access_note="ssh {hostnames}")
    client.force_login(user)
    page = client.get("/gpus/", {"gpu_type": "h100", "gpu_count": 2, "nodes": 2, "minutes": "0.25h"}).content.decode()
    assert "2× H100 on each of 2 nodes on lab for 15 min would start" in page
    assert client.post("/gpus/reserve", {"gpu_type": "h100", "gpu_count": 2, "nodes": 2,
                                         "minutes": "0.25h"}).status_code == 302
    mine = Reservation.objects.get(user=user)
    assert (mine.minutes, mine.node_count, mine.status) == (15, 2, "active")
    page = client.get("/gpus/").content.decode()
    assert "lab-node0, lab-node1" in page and "ssh lab-node0,lab-node1" in page
    bad = client.post("/gpus/reserve", {"gpu_type": "h100", "gpu_count": 1, "minutes": "0.01h"})
    assert bad.status_code == 400 and "whole minutes" in bad.content.decode()
    assert client.post(f"/gpus/{mine.pk}/extend", {"minutes": "1h30m"}).status_code == 302
    mine.refresh_from_db()
    assert mine.minutes == 105
    assert client.post(f"/gpus/{mine.pk}/extend", {"minutes": "soon"}).status_code == 400


NINES = "9" * 400


@pytest.mark.parametrize(("field", "value", "words"), [
    ("minutes", NINES + "h", "too long a duration: at most 2147483648 minutes"),
    ("minutes", NINES, "too long a duration"),
    ("minutes", str(2**31), "longer than the longest allowed reservation"),
    ("gpu_count", NINES, "whole numbers of at most 2147483648"),
    ("nodes", "-" + NINES, "whole numbers of at most 2147483648"),
])
def test_huge_numbers_on_the_site_are_a_precise_400(client, user, field, value, words):
    """A duration of 400 nines was an OverflowError (a 500) in the preview, the reserve form and the extension."""
    gpu_pool(nodes=1, per_node=2)
    client.force_login(user)
    form = {"gpu_type": "h100", "gpu_count": 1, "minutes": 30, field: value}
    assert words in client.get("/gpus/", form).content.decode().replace("&#x27;", "'")
    refused = client.post("/gpus/reserve", form)
    said = [line for line in refused.content.decode().replace("&#x27;", "'").splitlines() if words in line]
    assert refused.status_code == 400 and said and NINES not in said[0]  # (the form keeps what was typed)
    assert not Reservation.objects.exists()


@pytest.mark.parametrize(("value", "status", "words"), [
    (NINES + "h", 400, "too long a duration"), (NINES, 400, "too long a duration"),
    (str(2**31), 409, "past pool lab's maximum"),
])
def test_a_huge_extension_is_a_precise_4xx(client, user, value, status, words):
    gpu_pool(nodes=1, per_node=2)
    client.force_login(user)
    assert client.post("/gpus/reserve", {"gpu_type": "h100", "gpu_count": 1, "minutes": 30}).status_code == 302
    mine = Reservation.objects.get(user=user)
    refused = client.post(f"/gpus/{mine.pk}/extend", {"minutes": value})
    assert refused.status_code == status and words in refused.content.decode().replace("&#x27;", "'")
    mine.refresh_from_db()
    assert mine.minutes == 30


def test_the_cli_names_a_huge_duration_instead_of_a_traceback(tmp_path):
    from typer.testing import CliRunner

    from kernelbot.cli.main import app

    result = CliRunner().invoke(app, ["gpus", "reserve", "--gpu", "h100", "--duration", NINES + "h", "--no-wait"],
                                env={"KERNELBOT_URL": "http://127.0.0.1:9", "KERNELBOT_TOKEN": "t",
                                     "KERNELBOT_CONFIG": str(tmp_path / "c.json")})
    assert result.exit_code == 2 and "too long a duration" in result.output, result.output
    assert not isinstance(result.exception, OverflowError) and "Traceback" not in result.output
