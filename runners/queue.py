"""The one place that hands work to django-q2, always after the surrounding transaction commits."""

import logging
from functools import cache

from django.db import transaction
from django_q.brokers import Broker, get_broker
from django_q.tasks import async_task
from redis.exceptions import RedisError


@cache
def broker() -> Broker:
    """One broker (and so one Redis connection pool) per process, not one per task."""
    return get_broker()


log = logging.getLogger(__name__)


def enqueue_on_commit(func: str, *args, group: str | None = None) -> None:
    transaction.on_commit(lambda: enqueue(func, *args, group=group))


def enqueue(func: str, *args, group: str | None = None) -> bool:
    """Hand a task to the broker; whether it took it. The broker being away (Redis restarting, a network cut) fails
    nothing that was committed: the reaper dispatches a queued run whose message was lost and sends again a run's
    `on_finish` task (ranking its result) not done in time (`lifecycle.do_reap_overdue_runs`)."""
    try:
        async_task(func, *args, group=group, broker=broker())
    except (RedisError, OSError) as exc:
        log.warning("could not enqueue %s%r (%r); the reaper picks the work up", func, args, exc)
        return False
    return True
