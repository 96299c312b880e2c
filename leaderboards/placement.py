"""Where a queued run goes: the pools that may take it, the least loaded first (`candidate_pools`, read by
`lifecycle.dispatch_run`). A pool's load for a GPU type is its runs of that type dispatched or running per device
of the type that can take one (a node agents' pool: enabled devices of enabled nodes in service with a live agent),
so two equal pools take a stream of runs in turn and a pool with free devices goes before a busy one. Two aggregate
queries whatever the pools' size: dispatch costs the same on eight devices as on eight thousand."""

from __future__ import annotations

from django.db.models import Count, F, Q

from runners.models import Gpu, GpuPool, GpuType, NodeService, RunnerBackendName, agents_live_since

from .models import Run, RunAttempt, RunStatus


def candidate_pools(run: Run) -> list[GpuPool]:
    """Enabled pools serving the run's GPU type that are not failing their health check: pools this run has not
    tried yet first (a retry goes elsewhere when there is elsewhere), then the least loaded (`pool_loads`), then the
    oldest. A node agents' pool without a live agent in service for the type comes last. A pinned run (a health
    check's) goes to its pool whatever that pool's state: the check is how a failing or disabled pool proves itself."""
    pools = list(GpuPool.objects.filter(pk=run.pool_id) if run.pool_id else GpuPool.objects.taking_runs(run.gpu_type))
    if len(pools) < 2:
        return pools
    tried = list(RunAttempt.objects.filter(run=run, pool__isnull=False).values_list("pool_id", flat=True))
    loads = pool_loads([pool.pk for pool in pools], run.gpu_type)
    return sorted(pools, key=lambda pool: (loads[pool.pk] is None, tried.count(pool.pk), loads[pool.pk] or 0, pool.pk))


def pool_loads(pool_ids: list[int], gpu_type: GpuType) -> dict[int, float | None]:
    """Each pool's load for `gpu_type` were it given one more run: (its runs of the type dispatched or running + 1)
    per device that can take one; None for a pool with no such device."""
    live = agents_live_since()
    takers = Q(node__pool__backend=RunnerBackendName.LOCAL, node__service=NodeService.IN_SERVICE,
               node__agent_seen_at__gte=live) | ~Q(node__pool__backend=RunnerBackendName.LOCAL)
    devices = dict(Gpu.objects.filter(takers, node__pool_id__in=pool_ids, node__enabled=True, enabled=True,
                                      gpu_type=gpu_type)
                   .values("node__pool_id").annotate(n=Count("pk")).values_list("node__pool_id", "n"))
    busy = dict(RunAttempt.objects.filter(pool_id__in=pool_ids, number=F("run__attempt"), run__gpu_type=gpu_type,
                                          run__status__in=[RunStatus.DISPATCHED, RunStatus.RUNNING])
                .values("pool_id").annotate(n=Count("pk")).values_list("pool_id", "n"))
    return {pk: (busy.get(pk, 0) + 1) / devices[pk] if devices.get(pk) else None for pk in pool_ids}


def agent_serves(pool: GpuPool, gpu_type: GpuType) -> bool:
    """A live node agent of `pool` has an enabled device of `gpu_type`."""
    return Gpu.objects.filter(node__pool=pool, node__enabled=True, enabled=True, gpu_type=gpu_type,
                              node__agent_seen_at__gte=agents_live_since()).exists()
