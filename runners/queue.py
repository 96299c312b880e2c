"""The one place that hands work to django-q2, always after the surrounding transaction commits."""

from functools import cache

from django.db import transaction
from django_q.brokers import Broker, get_broker
from django_q.tasks import async_task


@cache
def broker() -> Broker:
    """One broker (and so one Redis connection pool) per process, not one per task."""
    return get_broker()


def enqueue_on_commit(func: str, *args, group: str | None = None) -> None:
    transaction.on_commit(lambda: async_task(func, *args, group=group, broker=broker()))
