"""The one place that hands work to django-q2, always after the surrounding transaction commits."""

from django.db import transaction
from django_q.tasks import async_task


def enqueue_on_commit(func: str, *args, group: str | None = None) -> None:
    transaction.on_commit(lambda: async_task(func, *args, group=group))
