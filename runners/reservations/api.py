"""/api/v1/gpus/…: availability, reservations, usage, node samples. Thin over `actions` and `usage`."""

from __future__ import annotations

import hmac
from datetime import datetime

from django.conf import settings
from ninja import Router, Schema
from ninja.errors import HttpError
from ninja.security import HttpBearer
from pydantic import Field

from kernelbot.errors import ErrorOut
from kernelbot.inputs import Float, Int

from . import actions, usage
from .models import Reservation

router = Router(tags=["gpus"])  # mounted with the API token auth by kernelbot.api
ERRORS = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut}


class AvailabilityOut(Schema):
    gpu_type: str
    pool: str
    devices: int
    reservable: int
    free_now: int
    queued: int
    eta: dict[str, datetime | None] = Field(description="GPUs (1/2/4/8) → when such a request made now would start")
    largest: int = Field(description="The most GPUs one request can get here (reservable devices on one node)")
    never: str = Field(description="Why some ETA is null (never), in words; empty when none is")


class ReserveIn(Schema):
    gpu_type: str = Field(max_length=40)
    gpu_count: Int = Field(1, ge=-(2**31), le=2**31, description="GPUs on each node")
    minutes: Int = Field(ge=-(2**31), le=2**31)
    project: str = Field("", max_length=60)
    pool: str = Field("", max_length=60)
    nodes: Int = Field(1, ge=-(2**31), le=2**31, description="Nodes of one pool, all or nothing")


class ExtendIn(Schema):
    minutes: Int = Field(ge=-(2**31), le=2**31)


class EventOut(Schema):
    kind: str
    message: str
    created: datetime


class ReservationOut(Schema):
    id: int
    user: str
    project: str
    pool: str
    gpu_type: str
    gpu_count: int
    nodes: int
    minutes: int
    status: str
    created: datetime
    planned_start: datetime | None
    started_at: datetime | None
    ends_at: datetime | None
    finished_at: datetime | None
    hostname: str
    hostnames: list[str]
    gpus: list[int]
    access: dict
    failure: str
    events: list[EventOut]


def reservation_out(r: Reservation) -> dict:
    """The one serialiser of a reservation (its holder's or staff's eyes only: `actions.access_reservation`)."""
    events = getattr(r, "recorded_events", None) or r.events.all()
    return {"id": r.pk, "user": r.user.get_username(), "project": r.project, "pool": r.pool.name,
            "gpu_type": r.gpu_type.name, "gpu_count": r.gpu_count, "nodes": r.node_count, "minutes": r.minutes,
            "status": r.status,
            "created": r.created, "planned_start": r.planned_start, "started_at": r.started_at, "ends_at": r.ends_at,
            "finished_at": r.finished_at, "hostname": r.node.hostname if r.node else "", "hostnames": r.hostnames(),
            "gpus": [g.index for g in r.gpus()], "access": r.access if r.status == "active" else {},
            "failure": r.failure, "events": [{"kind": e.kind, "message": e.message, "created": e.created}
                                             for e in events]}


@router.get("/gpus/availability", response={200: list[AvailabilityOut], 401: ErrorOut})
def availability(request, minutes: int = 60):
    if not 1 <= minutes <= 10**6:
        raise HttpError(400, f"minutes must be between 1 and 1000000; got {minutes}.")
    return [{**a.__dict__, "eta": {str(k): v for k, v in a.eta.items()}} for a in actions.availability(minutes)]


@router.post("/gpus/reservations", response={201: ReservationOut, **ERRORS})
def reserve(request, body: ReserveIn):
    """Reserve GPUs. The answer does not wait for planning: the request is recorded `pending` with `planned_start`
    null, and a planning pass follows within milliseconds (seconds at most). Then it is `active` if devices were free,
    else it holds its promised start (`planned_start`), which never moves later. Poll
    `GET /gpus/reservations/{id}` (the CLI does)."""
    r = actions.do_reserve(request.auth, actions.ReserveRequest(**body.dict()), plan=False)
    return 201, reservation_out(r)


@router.get("/gpus/reservations", response={200: list[ReservationOut], 401: ErrorOut})
def list_reservations(request, all: bool = False):
    """Your reservations: open ones, or all with ?all=true (latest 100)."""
    qs = actions.visible_to(request.auth).filter(user=request.auth).prefetch_related("events")
    return [reservation_out(r) for r in (qs if all else qs.open())[:100]]


@router.get("/gpus/reservations/{reservation_id}", response={200: ReservationOut, **ERRORS})
def show(request, reservation_id: int):
    return reservation_out(actions.access_reservation(request.auth, reservation_id))


@router.post("/gpus/reservations/{reservation_id}/cancel", response={200: ReservationOut, **ERRORS})
def cancel(request, reservation_id: int):
    """Cancel a queued request, or end an active reservation now (its devices are freed)."""
    actions.do_cancel(request.auth, reservation_id)
    return reservation_out(actions.access_reservation(request.auth, reservation_id))


@router.post("/gpus/reservations/{reservation_id}/extend", response={200: ReservationOut, **ERRORS})
def extend(request, reservation_id: int, body: ExtendIn):
    actions.do_extend(request.auth, reservation_id, body.minutes)
    return reservation_out(actions.access_reservation(request.auth, reservation_id))


class UsageRowOut(Schema):
    key: str
    gpu_hours: float
    usage_percent: float | None
    nodes: int


class UsageOut(Schema):
    group: str
    start: datetime
    end: datetime
    rows: list[UsageRowOut]
    scope: str = Field(description="all: every holder's rows (organisers); mine: your own device time only")
    total_gpu_hours: float = Field(description="Everyone's GPU-hours in the window")


@router.get("/gpus/usage", response={200: UsageOut, 400: ErrorOut, 401: ErrorOut})
def usage_report(request, group: str = "project", pool: str = "", gpu_type: str = "", days: int = 1):
    """GPU-hours per project/leaderboard/user/pool/gpu_type/day from recorded device holds, with utilisation:
    organisers see every holder's, anyone else their own, and everyone's total."""
    return usage.report_for(request.auth, usage.Filters.parse(group=group, pool=pool, gpu_type=gpu_type, days=days))


class AgentAuth(HttpBearer):
    def authenticate(self, request, token: str):
        expected = settings.NODE_AGENT_TOKEN
        return bool(expected) and hmac.compare_digest(token, expected)


class SampleIn(Schema):
    index: Int = Field(ge=0, le=1024)
    utilization: Float = Field(ge=0, le=100)
    memory_used_mib: Int = Field(0, ge=0, le=2**31)


class SamplesIn(Schema):
    pool: str = Field(max_length=60)
    hostname: str = Field(max_length=120)
    samples: list[SampleIn] = Field(max_length=64)


@router.post("/gpus/samples", response={201: dict, 400: ErrorOut, 401: ErrorOut, 404: ErrorOut}, auth=AgentAuth())
def post_samples(request, body: SamplesIn):
    """The node agent's nvidia-smi readings (Bearer KERNELBOT_NODE_AGENT_TOKEN)."""
    return 201, {"stored": usage.record_samples(body.pool, body.hostname,
                                                [s.dict() for s in body.samples])}
