"""Two deployments on one Redis server share nothing (issue 24): each one's task queue carries its deployment
prefix, as its channels and cache keys do, so one deployment's workers never run the other's tasks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import redis

from .conftest import REPO

# A process of the deployment: it enqueues through django-q2 as the platform does, says what it sent, waits until
# every deployment has sent, then takes every message of its queue as a worker would and reads it (each deployment
# signs its messages with its own salt).
DEPLOYMENT = """
import json, sys, django
django.setup()
from django.conf import settings
from django_q.signing import SignedPackage
from django_q.tasks import async_task
from runners.queue import broker

def say(value):
    print("OUT " + json.dumps(value), flush=True)

ids = [async_task("math.floor", n, broker=broker()) for n in range(int(sys.argv[1]))]
say({"ids": ids, "key": broker().list_key, "name": settings.Q_CLUSTER["name"],
     "channels": settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"],
     "cache": settings.CACHES["default"]["KEY_PREFIX"]})
sys.stdin.readline()
taken = []
while batch := broker().dequeue():
    for ack_id, payload in batch:
        taken.append(SignedPackage.loads(payload)["id"])
        broker().acknowledge(ack_id)
say(taken)
"""


class Deployment:
    def __init__(self, environ: dict[str, str], tasks: int):
        env = {k: v for k, v in os.environ.items() if k != "KERNELBOT_INSTANCE"} | {  # not the suite's instance
            "DJANGO_SETTINGS_MODULE": "kernelbot.settings", **environ}
        self.process = subprocess.Popen([sys.executable, "-c", DEPLOYMENT, str(tasks)], cwd=REPO, env=env, text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def said(self):
        while line := self.process.stdout.readline():
            if line.startswith("OUT "):
                return json.loads(line[4:])
        self.process.kill()
        pytest.fail(f"the deployment's process exited: {self.process.stderr.read()[-3000:]}")

    def go_on(self) -> None:
        self.process.stdin.write("\n")
        self.process.stdin.flush()


@pytest.mark.timeout(180)
def test_two_deployments_on_one_redis_each_see_only_their_own_tasks(redis_url):
    unique = f"{os.getpid()}x"
    # one Redis server and database, as the issue found them; by default the database name tells them apart, and a
    # named instance (KERNELBOT_INSTANCE) on the same database is apart too
    production = {"REDIS_URL": redis_url, "DATABASE_URL": f"postgres://db/production{unique}"}
    deployments = {"production": Deployment(production, 3),
                   "staging": Deployment({**production, "DATABASE_URL": f"postgres://db/staging{unique}"}, 2),
                   "named": Deployment({**production, "KERNELBOT_INSTANCE": f"eu{unique}"}, 1)}
    client = redis.Redis.from_url(redis_url)
    keys = []
    try:
        sent = {name: d.said() for name, d in deployments.items()}
        keys = [each["key"] for each in sent.values()]
        for each in sent.values():
            assert each["name"] == each["channels"] == each["cache"]  # one prefix for all it keeps in Redis
            assert each["key"] == f"django_q:{each['name']}:q"
        assert len(set(keys)) == 3 and [client.llen(key) for key in keys] == [3, 2, 1]
        for each in deployments.values():
            each.go_on()
        taken = {name: d.said() for name, d in deployments.items()}
        assert taken == {name: each["ids"] for name, each in sent.items()}  # its own tasks, all of them, only them
    finally:
        for each in deployments.values():
            each.process.kill()
            each.process.wait()
        if keys:
            client.delete(*keys)
