"""`GET /metrics`: what the fleet is doing, in Prometheus text (prometheus_client), for operators' scrapers.

Every figure is read from the database at scrape time (a custom collector, a registry per scrape), so any web
worker answers the same whatever served the requests before: queue depth per pool and GPU type, runs by status,
run phase durations (runs finished in the last WINDOW, by bucket), nodes by service state, devices' utilisation and
memory as their agents sampled them, reservations active and waiting, submissions stored and refused (counted into
the database by `leaderboards.actions.counts_refusals`). What is read from current rows and can go down (a
submission deleted, a run requeued, a run's finish leaving the window) is a gauge, never a counter, which
Prometheus would read as reset.

Closed unless `Authorization: Bearer $KERNELBOT_METRICS_TOKEN` or a staff session: 401 without either, 403 for a
wrong token or a signed-in non-staff user.
"""

from __future__ import annotations

import hmac
from datetime import timedelta

from django.conf import settings
from django.db.models import Count, DurationField, ExpressionWrapper, F, Q, Sum
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from leaderboards.models import REFUSED_TALLY, Run, RunAttempt, RunStatus, Submission, Tally
from runners.models import Node, NodeService, agents_live_since, node_state
from runners.reservations.models import Reservation, ReservationStatus

BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
PHASES = {"queued": ("queued_at", "dispatched_at"), "dispatched": ("dispatched_at", "started_at"),
          "running": ("started_at", "finished_at")}  # run phase → its start and end fields
WAITING = (RunStatus.QUEUED, RunStatus.DISPATCHED)
WINDOW = timedelta(hours=1)  # the phase figures cover runs finished this recently (a scan of the run table)


class FleetCollector:
    def collect(self):
        yield self.queue_depth()
        runs = GaugeMetricFamily("kernelbot_runs", "Runs in each status now.", labels=["status"])
        counts = dict(Run.objects.values_list("status").annotate(n=Count("pk")).values_list("status", "n"))
        for status in RunStatus.values:
            runs.add_metric([status], counts.get(status, 0))
        yield runs
        yield from self.phases()
        yield from self.nodes()
        reservations = GaugeMetricFamily("kernelbot_reservations", "Reservations active and waiting (pending).",
                                         labels=["pool", "status"])
        for pool, status, n in (Reservation.objects.filter(status__in=[ReservationStatus.ACTIVE,
                                                                       ReservationStatus.PENDING])
                                .values_list("pool__name", "status").annotate(n=Count("pk"))):
            reservations.add_metric([pool, status], n)
        yield reservations
        yield GaugeMetricFamily("kernelbot_submissions_stored", "Submissions accepted and stored now (deleting "
                                "one lowers it).", value=Submission.objects.count())
        refused = CounterMetricFamily("kernelbot_submissions_refused", "Submissions refused, by HTTP status.",
                                      labels=["status"])
        for name, count in Tally.objects.filter(name__startswith=REFUSED_TALLY).values_list("name", "count"):
            refused.add_metric([name.removeprefix(REFUSED_TALLY)], count)
        yield refused

    @staticmethod
    def queue_depth() -> GaugeMetricFamily:
        """Runs waiting for a runner: queued (no pool chosen yet: pool "") or dispatched to a pool, not started."""
        depth = GaugeMetricFamily("kernelbot_queue_depth", "Runs waiting for a runner, per pool and GPU type.",
                                  labels=["pool", "gpu_type"])
        found: dict[tuple[str, str], int] = {}
        for gpu_type, n in (Run.objects.filter(status=RunStatus.QUEUED).values_list("gpu_type__name")
                            .annotate(n=Count("pk"))):
            found[("", gpu_type)] = n
        for pool, gpu_type, n in (RunAttempt.objects.filter(run__status=RunStatus.DISPATCHED, number=F("run__attempt"))
                                  .values_list("pool__name", "run__gpu_type__name").annotate(n=Count("pk"))):
            found[(pool or "", gpu_type)] = found.get((pool or "", gpu_type), 0) + n
        for labels, n in sorted(found.items()):
            depth.add_metric(list(labels), n)
        return depth

    @staticmethod
    def phases():
        """The phases of runs finished within WINDOW as gauges shaped like a histogram (`_bucket{le}`, `_count`,
        `_sum`: histogram_quantile reads them): recomputed from the rows at each scrape, they go down as runs
        leave the window or are requeued."""
        what = (f"runs finished in the last {WINDOW.total_seconds() / 3600:g} h by how long they spent in each "
                "phase: queued (to dispatch), dispatched (to start), running (to finish)")
        name = "kernelbot_recent_run_phase_seconds"
        buckets = GaugeMetricFamily(f"{name}_bucket", f"Of the {what}: those that took at most le seconds.",
                                    labels=["phase", "le"])
        counts = GaugeMetricFamily(f"{name}_count", f"The {what}: how many.", labels=["phase"])
        sums = GaugeMetricFamily(f"{name}_sum", f"The {what}: seconds in all.", labels=["phase"])
        since = timezone.now() - WINDOW
        for phase, (start, end) in PHASES.items():
            duration = ExpressionWrapper(F(end) - F(start), output_field=DurationField())
            runs = Run.objects.filter(**{f"{start}__isnull": False, "finished_at__gte": since,
                                         f"{end}__isnull": False}).annotate(d=duration)
            figures = runs.aggregate(count=Count("pk"), total=Sum("d"), **{
                f"le{i}": Count("pk", filter=Q(d__lte=timedelta(seconds=b))) for i, b in enumerate(BUCKETS)})
            total = figures["total"]
            seconds = total.total_seconds() if isinstance(total, timedelta) else (total or 0) / 1e6
            for i, b in enumerate(BUCKETS):
                buckets.add_metric([phase, str(float(b))], figures[f"le{i}"])
            buckets.add_metric([phase, "+Inf"], figures["count"])
            counts.add_metric([phase], figures["count"])
            sums.add_metric([phase], seconds)
        yield from (buckets, counts, sums)

    @staticmethod
    def nodes():
        live = agents_live_since()
        nodes = GaugeMetricFamily("kernelbot_nodes", "Enabled nodes of local pools by service state (no_agent: no "
                                  "agent heard of within KERNELBOT_AGENT_DEADLINE).", labels=["pool", "service"])
        found: dict[tuple[str, str], int] = {}
        rows = Node.objects.filter(enabled=True).values_list("pool__name", "service", "agent_seen_at", "hostname",
                                                             "samples")
        utilization = GaugeMetricFamily("kernelbot_gpu_utilization", "A device's utilisation (0..1) as its agent "
                                        "last sampled it.", labels=["pool", "node", "index"])
        used = GaugeMetricFamily("kernelbot_gpu_memory_used_bytes", "A device's memory in use, as sampled.",
                                 labels=["pool", "node", "index"])
        total = GaugeMetricFamily("kernelbot_gpu_memory_total_bytes", "A device's memory, as sampled.",
                                  labels=["pool", "node", "index"])
        for pool, service, seen, hostname, samples in rows:
            alive = seen is not None and seen >= live
            state = node_state(service, seen, live)
            found[(pool, state)] = found.get((pool, state), 0) + 1
            for sample in samples if alive else []:
                labels = [pool, hostname, str(sample["index"])]
                utilization.add_metric(labels, sample["utilization"])
                used.add_metric(labels, sample["memory_used"])
                total.add_metric(labels, sample["memory_total"])
        for (pool, state), n in sorted(found.items()):
            nodes.add_metric([pool, state], n)
        in_service = GaugeMetricFamily("kernelbot_nodes_in_service", "Enabled nodes in service with a live agent.",
                                       labels=["pool"])
        for pool in sorted({p for p, _ in found}):
            in_service.add_metric([pool], found.get((pool, NodeService.IN_SERVICE), 0))
        yield from (nodes, in_service, utilization, used, total)


def authorised(request: HttpRequest) -> int:
    """200, or the refusal's status: 401 with no credentials, 403 with wrong ones."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    expected = settings.METRICS_TOKEN
    if scheme.lower() == "bearer" and token.strip():
        return 200 if expected and hmac.compare_digest(token.strip().encode(), expected.encode()) else 403
    user = request.user
    if user.is_authenticated:
        return 200 if user.is_staff else 403
    return 401


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    status = authorised(request)
    if status != 200:
        response = HttpResponse("Bearer $KERNELBOT_METRICS_TOKEN or a staff session is required\n", status=status,
                                content_type="text/plain; charset=utf-8")
        if status == 401:
            response["WWW-Authenticate"] = "Bearer"
        return response
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
