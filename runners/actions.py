"""Service layer for GPU inventory: what a node really has (device checks, registration) and which GPU types are
taking runs. The admin, `manage.py register_node` and the health check call these."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from .harness.probe import device_is, device_mismatch
from .models import (
    Gpu,
    GpuPool,
    GpuType,
    GpuVendor,
    Node,
    NodeService,
    PoolHealth,
    RunnerBackendName,
    agents_live_since,
)
from .pools import Contained, Containment, containment


class NodeRejected(Exception):
    """A claim about a node's devices that its probe contradicts; the message says what the node has."""


def probe_this_machine() -> dict:
    """The probe's report for the machine this process runs on, from the interpreter that runs the harness (so the
    torch it would use is the one asked)."""
    python = settings.HARNESS_PYTHON or sys.executable
    done = subprocess.run([python, "-m", "runners.harness.probe"], cwd=settings.BASE_DIR, capture_output=True,
                          text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise NodeRejected(f"the device probe ({python} -m runners.harness.probe) exited with code {done.returncode} "
                           f"on this machine {done.stderr.strip()[-500:]}".rstrip())
    return json.loads(done.stdout)


def claim_mismatch(gpu_type: GpuType, index: int, report: dict) -> str | None:
    return device_mismatch(gpu_type.name, gpu_type.vendor, index, report)


def agentless_nodes(pool: GpuPool) -> list[str]:
    """The enabled nodes of a local pool with enabled devices and no live agent (they get no run), by hostname."""
    return list(pool.nodes.filter(enabled=True, gpus__enabled=True).exclude(agent_seen_at__gte=agents_live_since())
                .order_by("hostname").values_list("hostname", flat=True).distinct())


def check_local_devices(pool: GpuPool, report: dict | None = None) -> dict[Gpu, str]:
    """Compare the device rows of a local pool's node that is this machine with this machine's probe; record what
    matched (device name, uuid, memory, checked time) and disable what did not. Rows of other nodes are theirs to
    confirm (their agents register what they find): one without a live agent is reported, not confirmed. Returns
    each row found wanting with why."""
    report = report if report is not None else probe_this_machine()
    devices = {d["index"]: d for d in report.get("devices", [])}
    problems: dict[Gpu, str] = {}
    now = timezone.now()
    here = report.get("hostname") or socket.gethostname()
    names = {here, socket.gethostname(), "localhost"}
    absent = set(agentless_nodes(pool))
    with transaction.atomic():
        rows = Gpu.objects.select_for_update(of=("self",)).select_related("gpu_type", "node")
        for gpu in rows.filter(node__pool=pool).exclude(node__hostname__in=names):
            if gpu.node.hostname in absent and gpu.enabled:
                problems[gpu] = f"no agent on {gpu.node.hostname}: its devices are unconfirmed and get no run"
        for gpu in rows.filter(node__pool=pool, node__hostname__in=names):
            if why := claim_mismatch(gpu.gpu_type, gpu.index, report) or (
                    gpu.gpu_type.is_cpu and gpu.index > 0 and f"{here} is one CPU device (#0), not #{gpu.index}"):
                problems[gpu] = why
                gpu.enabled = False
                gpu.save(update_fields=["enabled"])
                continue
            device = devices.get(gpu.index, {}) if not gpu.gpu_type.is_cpu else {}
            gpu.device_name = device.get("name") or (f"CPU: {report.get('cpu', '')}"[:120] if gpu.gpu_type.is_cpu
                                                      else "")
            gpu.uuid, gpu.memory_mib, gpu.checked_at = device.get("uuid", ""), device.get("memory_mib"), now
            gpu.save(update_fields=["device_name", "uuid", "memory_mib", "checked_at"])
    return problems


def do_record_node_sandbox(pool: GpuPool, report: dict) -> int:
    """Store this machine's probe `report`'s sandbox facts on the nodes of `pool`, a pool that runs on this machine;
    call it from the process that runs the harness (its KERNELBOT_SANDBOX, KERNELBOT_CGROUP and cgroup are what the
    runs get), so not from the web process. Returns the nodes updated."""
    if "sandbox" not in report:
        return 0
    return Node.objects.filter(pool=pool).update(sandbox=report["sandbox"], probed_at=timezone.now())


def node_containment(pool: GpuPool) -> list[Containment]:
    """Each enabled node's memory containment, from its last probe (`pools.containment`), by hostname."""
    return [containment(hostname, facts) for hostname, facts in
            pool.nodes.filter(enabled=True).order_by("hostname").values_list("hostname", "sandbox")]


def guess_gpu_type(device: dict) -> GpuType:
    """The one GPU type whose name is this device's model (the longest name wins: L40S before L40)."""
    found = [t for t in GpuType.objects.filter(vendor=device.get("vendor"))
             if device_is(t.name, t.vendor, device["name"], device.get("vendor", ""))]
    if not found:
        raise NodeRejected(f"no GPU type matches device #{device['index']} ({device['name']}); add one in the admin "
                           "(GPU types) or name it with --gpu-type")
    return max(found, key=lambda t: len(t.name))


@dataclass(frozen=True)
class Registration:
    node: Node
    created: list[Gpu]
    updated: list[Gpu]
    disabled: list[Gpu]
    back_in_service: bool = False  # an agent's registration put the node back in service


def do_check_node_sandbox(node: Node) -> bool:
    """A node of a local pool whose sandbox cannot satisfy its mode (KERNELBOT_SANDBOX=require without a memory cgroup,
    from its last probe) is out of service with the reason; one that can again, or whose agent is back, is in service
    again (a failed health check stays until a check passes). True when it is back in service."""
    found = containment(node.hostname, node.sandbox)
    if found.state == Contained.REFUSED:
        node.set_service(NodeService.SANDBOX, found.problem)
        return False
    if node.service in (NodeService.SANDBOX, NodeService.NO_AGENT):
        return node.set_service(NodeService.IN_SERVICE)
    return False


def out_of_service_nodes(pool: GpuPool) -> list[Node]:
    """The enabled nodes of a local pool with enabled devices that take no run (`service_detail`: why), by hostname."""
    return list(pool.nodes.filter(enabled=True, gpus__enabled=True).exclude(service=NodeService.IN_SERVICE)
                .distinct().order_by("hostname"))


def local_pool_health(pool: GpuPool) -> tuple[str, str]:
    """A node agents' pool's health from its nodes: failing only while none with an enabled device is in service;
    the detail names each node out of service and why."""
    why = "; ".join(f"{n.hostname} is out of service: {n.service_detail}" for n in out_of_service_nodes(pool))
    serving = pool.nodes.filter(enabled=True, gpus__enabled=True, service=NodeService.IN_SERVICE).exists()
    return (PoolHealth.OK if serving else PoolHealth.FAILING), why


def do_node_back_in_service(node: Node) -> None:
    """A node came back in service (its agent, its sandbox): a pool that failed for want of a node says so at once."""
    pool = GpuPool.objects.get(pk=node.pool_id)
    if pool.health == PoolHealth.FAILING:
        health, why = local_pool_health(pool)
        GpuPool.objects.filter(pk=pool.pk).update(health=health, health_detail=why)


def check_one_pool(pool: GpuPool, hostname: str, uuids: list[str] = ()) -> None:
    """One machine, and each of its devices, serves one local pool (two would hand one device two runs at once):
    refused when another local pool has the machine or one of the devices already (its agent, `register_node`, the
    admin's node form)."""
    if not pool.is_local:
        return
    local = RunnerBackendName.LOCAL
    others = Node.objects.filter(hostname=hostname, pool__backend=local).select_related("pool")
    if other := (others.exclude(pool=pool) if pool.pk else others).first():
        raise NodeRejected(f"{hostname} already belongs to pool {other.pool.name}: a machine serves one pool (delete "
                           f"its node there, or use pool {other.pool.name})")
    devices = Gpu.objects.filter(uuid__in=uuids, node__pool__backend=local).select_related("node__pool")
    if taken := (devices.exclude(node__pool=pool, node__hostname=hostname) if pool.pk else devices).first():
        raise NodeRejected(f"device {taken.uuid} is already {taken} in pool {taken.node.pool.name}")


def do_register_node(pool: GpuPool, report: dict, *, hostname: str = "",
                     gpu_type: GpuType | None = None) -> Registration:
    """Create or update a node's device rows from its probe `report`. `gpu_type`: what the organiser claims the
    devices are, refused when the probe says otherwise; else each device's type is recognised by name. A node
    without GPUs becomes one device of the CPU type. Devices the probe no longer finds are disabled."""
    hostname = hostname or report.get("hostname") or ""
    if not hostname:
        raise NodeRejected("the probe report names no hostname; pass one")
    check_one_pool(pool, hostname, [d["uuid"] for d in report.get("devices", []) if d.get("uuid")])
    devices = report.get("devices", [])
    if not devices:
        if gpu_type is not None and not gpu_type.is_cpu:
            raise NodeRejected(f"{claim_mismatch(gpu_type, 0, {**report, 'hostname': hostname})}")
        if gpu_type is None:
            gpu_type = GpuType.objects.filter(vendor=GpuVendor.CPU).order_by("pk").first()
            if gpu_type is None:
                raise NodeRejected(f"{hostname} has no GPU and there is no CPU GPU type to register it as; add one in "
                                   "the admin (GPU types, vendor CPU)")
        devices = [{"index": 0, "name": f"CPU: {report.get('cpu', '')}"[:120], "uuid": "", "memory_mib": None}]
        types = {0: gpu_type}
    elif gpu_type is not None:
        refused = [why for d in devices if (why := claim_mismatch(gpu_type, d["index"], {**report,
                                                                                        "hostname": hostname}))]
        if refused:
            raise NodeRejected("; ".join(refused))
        types = {d["index"]: gpu_type for d in devices}
    else:
        types = {d["index"]: guess_gpu_type(d) for d in devices}
    now = timezone.now()
    created, updated = [], []
    with transaction.atomic():
        node, _ = Node.objects.get_or_create(pool=pool, hostname=hostname)
        if "sandbox" in report:  # the node's own probe: its sandbox facts as the runner there would have them
            node.sandbox, node.probed_at = report["sandbox"], now
            node.save(update_fields=["sandbox", "probed_at"])
        for device in devices:
            gpu, new = Gpu.objects.update_or_create(node=node, index=device["index"], defaults={
                "gpu_type": types[device["index"]], "uuid": device.get("uuid", ""),
                "device_name": device.get("name", "")[:120], "memory_mib": device.get("memory_mib"),
                "checked_at": now})
            (created if new else updated).append(gpu)
        gone = list(node.gpus.exclude(index__in=[d["index"] for d in devices]).filter(enabled=True))
        Gpu.objects.filter(pk__in=[g.pk for g in gone]).update(enabled=False)
    return Registration(node, created, updated, gone)


def do_register_agent(pool: GpuPool, hostname: str, report: dict, agent: dict) -> Registration:
    """A node agent started on `hostname` for `pool` (a local pool): its probe `report` becomes the node's device
    rows (`do_register_node`: types recognised by name, rows it does not find disabled), and the node is live. One
    machine, and each of its devices, serves one pool: refused when another local pool already has them."""
    with transaction.atomic():
        registration = do_register_node(pool, {**report, "hostname": hostname}, hostname=hostname)
        Node.objects.filter(pk=registration.node.pk).update(agent=agent, agent_seen_at=timezone.now())
        node = Node.objects.get(pk=registration.node.pk)
        back = do_check_node_sandbox(node)
    return Registration(node, registration.created, registration.updated, registration.disabled, back)


def do_fail_pool(pool: GpuPool, reason: str) -> None:
    """The pool's service refused its configuration (a backend's BackendUnavailable, saying what to fix): the pool
    fails, with the reason, until a health check passes; its runs wait for it or go to another pool."""
    GpuPool.objects.filter(pk=pool.pk).update(health=PoolHealth.FAILING, health_detail=reason[:2000],
                                              last_checked_at=timezone.now())


def gpu_availability(gpu_type_ids) -> dict[int, str | None]:
    """For each GPU type id: None when a pool takes its runs, else why not, as a user should read it (which node
    failed and why is the organisers'): a pool not failing its health check takes them, a node agents' pool while one
    of its nodes with a device of the type is in service. One query."""
    rows = (Gpu.objects.filter(gpu_type_id__in=list(gpu_type_ids), enabled=True, node__enabled=True,
                               node__pool__enabled=True)
            .values_list("gpu_type_id", "node__pool__health", "node__pool__last_checked_at", "node__pool__backend",
                         "node__service")
            .order_by().distinct())  # no model ordering: its columns would make the DISTINCT one row per device
    pools: dict[int, list[tuple[bool, datetime | None]]] = defaultdict(list)
    for type_id, health, checked, backend, service in rows:
        in_service = backend != RunnerBackendName.LOCAL or service == NodeService.IN_SERVICE
        pools[type_id].append((health != PoolHealth.FAILING and in_service, checked))
    answer: dict[int, str | None] = {}
    for type_id in gpu_type_ids:
        found = pools.get(type_id)
        if not found:
            answer[type_id] = "no runner currently serves it"
        elif not any(serves for serves, _ in found):
            checked = max((c for _, c in found if c is not None), default=None)
            when = f" at {checked:%Y-%m-%d %H:%M} UTC" if checked else ""
            answer[type_id] = f"its runners failed their health check{when} and take no runs until they pass one"
        else:
            answer[type_id] = None
    return answer


def runner_health(staff: bool) -> dict:
    """What `/api/v1/health/runners` says: each GPU type's availability (None, or why it takes no runs, as a user reads
    it) and, for staff, every node out of service with its reason."""
    types = dict(GpuType.objects.values_list("pk", "name"))
    found = {types[pk]: why for pk, why in gpu_availability(types).items()}
    answer: dict = {"gpu_types": found}
    if staff:  # each node's state as the admin and /metrics read it (`Node.state`)
        live = agents_live_since()
        nodes = Node.objects.filter(enabled=True, pool__enabled=True, pool__backend=RunnerBackendName.LOCAL).exclude(
            service=NodeService.IN_SERVICE, agent_seen_at__gte=live).select_related("pool").order_by("pool__name",
                                                                                                     "hostname")
        answer["nodes_out_of_service"] = [{"pool": n.pool.name, "hostname": n.hostname, "service": n.state,
                                           "reason": n.state_detail} for n in nodes]
    return answer
