"""The issue's "done means", through the real CLI against a live server: a developer reserves two GPUs, is told the
wait, gets them when they free up, extends, is warned and loses them at expiry, while runs keep using the rest."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from leaderboards.access.actions import do_create_token
from runners.reservations import actions, allocator, tasks
from runners.reservations.actions import ReserveRequest
from runners.reservations.models import DeviceHold, Reservation
from tests import factories
from tests.conftest import REPO

from .conftest import gpu_pool

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]


def cli_env(url: str, token: str, tmp_path) -> dict:
    return {**os.environ, "KERNELBOT_URL": url, "KERNELBOT_TOKEN": token, "KERNELBOT_CONFIG": str(tmp_path / "c.json"),
            "COLUMNS": "250"}


def cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernelbot.cli.main", "gpus", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


def test_reserve_wait_extend_warn_expire_from_the_cli(live_server, postgres, tmp_path, sync_queue):
    pool = gpu_pool(nodes=2, per_node=2, competition_share=0.5)
    dev, busy = factories.UserFactory(username="dev"), factories.UserFactory(username="busy")
    env = cli_env(live_server.url, do_create_token(dev)[1], tmp_path)
    blocker = actions.do_reserve(busy, ReserveRequest("H100", 2, 45))
    out = cli(env, "availability")
    assert out.returncode == 0 and "lab" in out.stdout, out.stdout + out.stderr

    waiting = subprocess.Popen([sys.executable, "-m", "kernelbot.cli.main", "gpus", "reserve", "--gpus", "2", "--gpu",
                                "h100", "--duration", "1h", "--project", "llm"], cwd=REPO,
                               env={**env, "PYTHONUNBUFFERED": "1"},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for _ in range(200):  # recorded, then given its promise by the planning pass that follows (a task, inline here)
        if Reservation.objects.filter(user=dev, planned_start__isnull=False).exists():
            break
        time.sleep(0.05)
    mine = Reservation.objects.get(user=dev)
    assert mine.status == "pending" and mine.planned_start == blocker.ends_at
    queued = next((line for line in waiting.stdout if "Queued:" in line), "")  # the CLI saw it queued, before it ends
    # the competition keeps running on the half kept for it
    run = allocator.acquire_for_run(pool, pool.gpu_type, run_id=1, attempt=1, user_id=None, leaderboard="lb",
                                    seconds=60, lease_seconds=60)
    assert run is not None and run.gpu.node.hostname == "lab-node1"
    actions.do_cancel(busy, blocker.pk)
    tasks.tick()
    output, _ = waiting.communicate(timeout=30)
    assert waiting.returncode == 0, output
    assert f"Queued: reservation #{mine.pk}, expected start" in queued
    assert "active on lab-node0 GPUs 0,1" in output

    out = cli(env, "extend", str(mine.pk), "30m")
    assert out.returncode == 0 and "active" in out.stdout, out.stdout + out.stderr
    mine.refresh_from_db()
    assert mine.minutes == 90
    assert cli(env, "extend", str(mine.pk), "0").returncode == 1

    Reservation.objects.filter(pk=mine.pk).update(ends_at=timezone.now() + timedelta(minutes=4))
    assert tasks.tick()["warned"] == 1  # the 30 and the 5 minute thresholds, both crossed: one warning
    listed = cli(env, "list").stdout
    assert "ends in 4 min" in listed or "ends in 3 min" in listed, listed

    Reservation.objects.filter(pk=mine.pk).update(ends_at=timezone.now() - timedelta(seconds=1))
    assert tasks.tick()["expired"] == 1
    assert "expired" in cli(env, "list", "--all").stdout
    assert not DeviceHold.objects.held().filter(reservation=mine).exists()
    out = cli(env, "cancel", str(mine.pk))
    assert out.returncode == 1 and "is already expired. (HTTP 409)" in out.stdout


def test_quarter_hour_two_nodes_and_cancel_without_an_id_from_the_cli(live_server, postgres, tmp_path, sync_queue):
    gpu_pool(nodes=2, per_node=4)
    dev = factories.UserFactory(username="dev")
    env = cli_env(live_server.url, do_create_token(dev)[1], tmp_path)
    out = cli(env, "reserve", "--gpu", "h100", "--gpus", "1", "--duration", "0.25h", "--no-wait")
    assert out.returncode == 0, out.stdout + out.stderr
    quarter = Reservation.objects.get(user=dev)
    assert quarter.minutes == 15 and quarter.status == "active"
    assert cli(env, "reserve", "--gpu", "h100", "--duration", "1.5h", "--no-wait").returncode == 0
    bad = cli(env, "reserve", "--gpu", "h100", "--duration", "0.01h", "--no-wait")
    assert bad.returncode == 2 and "whole minutes" in bad.stdout + bad.stderr
    chosen = subprocess.run([sys.executable, "-m", "kernelbot.cli.main", "gpus", "cancel"], cwd=REPO, env=env,
                            input="1\n", capture_output=True, text=True, timeout=60)
    assert chosen.returncode == 0, chosen.stdout + chosen.stderr
    ninety = Reservation.objects.get(user=dev, minutes=90)
    assert f"1. #{ninety.pk} " in chosen.stdout and f"2. #{quarter.pk} " in chosen.stdout  # yours, newest first
    ninety.refresh_from_db()
    assert ninety.status == "ended" and f"#{ninety.pk}" in chosen.stdout.splitlines()[-1]
    quarter.refresh_from_db()
    assert quarter.status == "active"
    none = subprocess.run([sys.executable, "-m", "kernelbot.cli.main", "gpus", "cancel"], cwd=REPO, env=env,
                          input="\n", capture_output=True, text=True, timeout=60)
    assert none.returncode == 0 and Reservation.objects.filter(status="active").count() == 1
    out = cli(env, "reserve", "--gpu", "h100", "--gpus", "2", "--nodes", "2", "--duration", "30m", "--no-wait")
    assert out.returncode == 0 and "2× H100 × 2 nodes" in out.stdout, out.stdout + out.stderr
    pair = Reservation.objects.get(user=dev, node_count=2)
    assert pair.status == "active" and pair.hostnames() == ["lab-node0", "lab-node1"]
    assert "lab-node0,lab-node1" in out.stdout
