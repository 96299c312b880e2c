"""django-q2 tasks that move runs to runners. Idempotent: a repeated or late delivery does nothing."""

import logging

from django.conf import settings
from django.db import transaction

from leaderboards import actions
from leaderboards.models import Run, RunStatus

from .backends.base import BackendUnavailable, backend_for
from .models import GpuPool

log = logging.getLogger(__name__)


def dispatch_run(run_id: int) -> None:
    with transaction.atomic():
        run = Run.objects.select_for_update().select_related("gpu_type").filter(pk=run_id).first()
        if run is None or run.status != RunStatus.QUEUED:
            return
        pool = GpuPool.objects.serving(run.gpu_type).order_by("pk").first()
        if pool is None:
            run.update_status(RunStatus.ERROR, error=f"no enabled GPU pool serves {run.gpu_type}")
            return
        try:
            backend = backend_for(pool)
        except BackendUnavailable as exc:  # configuration, not chance: retrying would not help
            run.update_status(RunStatus.ERROR, error=str(exc))
            return
        run.update_status(RunStatus.DISPATCHED, attempt=run.attempt + 1, runner=str(pool),
                          deadline_seconds=settings.RUN_HEARTBEAT_DEADLINE if backend.heartbeats else None)
        attempt = run.attempt
    try:
        backend.dispatch(run_id, attempt)
    except Exception as exc:
        log.exception("dispatch of run %s attempt %s failed", run_id, attempt)
        actions.do_report_failure(run_id, attempt, f"{type(exc).__name__}: {exc}")
