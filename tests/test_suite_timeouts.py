"""The suite's own guarantees: every test finishes or fails within its pytest-timeout, whatever it runs."""

from __future__ import annotations

import signal

import pytest
from django_q.tasks import async_task

pytestmark = pytest.mark.django_db
seen: dict[str, object] = {}


def alarm() -> tuple[object, float]:
    return signal.getsignal(signal.SIGALRM), signal.getitimer(signal.ITIMER_REAL)[0]


def record_alarm() -> None:  # the task: what the alarm is while django-q's worker runs it
    seen["handler"], seen["left"] = alarm()


@pytest.mark.timeout(60, method="signal")
def test_a_sync_task_neither_replaces_nor_disarms_the_test_timeout():
    handler, left = alarm()
    assert callable(handler) and 0 < left <= 60  # pytest-timeout's alarm
    async_task(record_alarm, sync=True)  # runs here, through django-q's worker and its TimeoutHandler
    assert seen["handler"] is handler and 0 < seen["left"] <= 60  # not django-q's 1800 s during the task
    handler_after, left_after = alarm()
    assert handler_after is handler and 0 < left_after <= 60  # and still armed after it
