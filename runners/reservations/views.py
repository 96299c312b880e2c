"""Pages: /gpus/ (availability, pool timelines, my reservations, the reserve form with its ETA before confirming),
/gpus/usage/ (table, chart, CSV) and Slack's signed slash command. Thin over `actions` and `usage`."""

from __future__ import annotations

import hashlib
import hmac
import time
from datetime import timedelta

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import IntegrityError, transaction
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from kernelbot.durations import parse_minutes
from kernelbot.errors import Refused
from kernelbot.inputs import check_storable

from . import actions, allocator, planner, usage
from .models import DeviceHold, PoolPolicy, Reservation, SlackCommand

TIMELINE_HOURS = 12
LARGEST = 2**31  # the API's bound on its integers


def timelines() -> list[dict]:
    """Per reservable pool: each device's holds and planned starts over the next hours, as percentages of a bar."""
    now = timezone.now()
    span = timedelta(hours=TIMELINE_HOURS).total_seconds()
    pools = []
    for policy in PoolPolicy.objects.filter(reservable=True).select_related("pool"):
        holds = {h.gpu_id: h for h in DeviceHold.objects.held().filter(pool=policy.pool)}
        planned = {g: r for r in Reservation.objects.filter(pool=policy.pool, status="pending")
                   for g in r.planned_gpus}
        rows = []
        for node in policy.pool.nodes.filter(enabled=True).prefetch_related("gpus__gpu_type"):
            for g in node.gpus.all():
                bars = []
                if g.pk in holds:
                    h = holds[g.pk]
                    bars.append({"left": 0, "width": min(100, max(1, (h.ends - now).total_seconds() / span * 100)),
                                 "kind": h.kind, "label": h.project})
                if g.pk in planned:
                    r = planned[g.pk]
                    left = max(0, (r.planned_start - now).total_seconds() / span * 100)
                    if left < 100:
                        bars.append({"left": left, "width": min(100 - left, r.minutes * 60 / span * 100),
                                     "kind": "planned", "label": f"#{r.pk} {r.project}"})
                rows.append({"name": f"{node.hostname} #{g.index} {g.gpu_type}", "bars": bars})
        pools.append({"name": policy.pool.name, "rows": rows})
    return pools


def gpus_page(request: HttpRequest) -> HttpResponse:
    context = {"availability": actions.availability(), "timelines": timelines(), "hours": TIMELINE_HOURS,
               "mine": [], "preview": None, "form": request.GET}
    if request.user.is_authenticated:
        context["mine"] = list(actions.visible_to(request.user).filter(user=request.user)
                               .prefetch_related("events")[:20])
        if request.GET.get("gpu_type"):
            context["preview"] = preview(request)
    return render(request, "reservations/gpus.html", context)


def form_minutes(data, default: str = "60") -> int:
    """A duration as typed (`90`, `90m`, `1h30m`, `0.25h`), in whole minutes; a 400 naming it otherwise."""
    try:
        return parse_minutes(check_storable("minutes", data.get("minutes", "") or default))
    except ValueError as exc:
        raise Refused(f"{exc}.", 400) from None


def form_request(data) -> actions.ReserveRequest:
    texts = {name: check_storable(name, data.get(name, "")) for name in ("gpu_type", "project", "pool")}
    try:
        count, nodes = int(data.get("gpu_count", 1)), int(data.get("nodes", 1) or 1)
    except ValueError:
        raise Refused("GPUs and nodes must be whole numbers.", 400) from None
    if max(abs(count), abs(nodes)) > LARGEST:  # a number no one can mean: not echoed back in full
        raise Refused(f"GPUs and nodes must be whole numbers of at most {LARGEST}.", 400)
    return actions.ReserveRequest(gpu_count=count, nodes=nodes, minutes=form_minutes(data), **texts)


def preview(request: HttpRequest) -> dict:
    """Where the request would start if confirmed now: the planner's answer for it at the end of the queue."""
    try:
        req = form_request(request.GET)
        pool, gpu_type = actions.check_reserve(request.user, req)
    except Refused as exc:
        return {"error": exc.message}
    probe = planner.Request("probe", req.gpu_count, req.minutes * 60, nodes=req.nodes)
    placed = allocator.plan_queue(pool, gpu_type, timezone.now(), [probe])[0]["probe"]
    start = timezone.datetime.fromtimestamp(placed.start, tz=timezone.get_current_timezone()) if placed else None
    return {"request": req, "pool": pool.name, "gpu_type": gpu_type.name, "start": start}


@login_required
@require_POST
def reserve(request: HttpRequest) -> HttpResponse:
    try:
        r = actions.do_reserve(request.user, form_request(request.POST))
    except Refused as exc:
        messages.error(request, exc.message)
        return render(request, "reservations/gpus.html", {
            "availability": actions.availability(), "timelines": timelines(), "hours": TIMELINE_HOURS,
            "mine": list(actions.visible_to(request.user).filter(user=request.user)[:20]),
            "form": request.POST}, status=exc.status)
    messages.success(request, f"Reservation #{r.pk} is {r.status}.")
    return redirect("gpus")


@login_required
@require_POST
def change(request: HttpRequest, reservation_id: int, verb: str) -> HttpResponse:
    if verb not in ("cancel", "extend"):
        raise Http404("No such action.")
    try:
        if verb == "cancel":
            actions.do_cancel(request.user, reservation_id)
        else:
            actions.do_extend(request.user, reservation_id, form_minutes(request.POST, "0"))
    except Refused as exc:
        message, status = exc.message, exc.status
        messages.error(request, message)
        return render(request, "reservations/error.html", {"message": message}, status=status)
    return redirect("gpus")


def filters_from(request: HttpRequest) -> usage.Filters:
    try:
        days = int(request.GET.get("days", "1"))
    except ValueError:
        raise Refused("days must be a whole number.", 400) from None
    return usage.Filters.parse(group=request.GET.get("group", "project"), pool=request.GET.get("pool", ""),
                               gpu_type=request.GET.get("gpu_type", ""), days=days)


@login_required
def usage_page(request: HttpRequest) -> HttpResponse:
    try:
        table = usage.report_for(request.user, filters_from(request))
    except Refused as exc:
        return render(request, "reservations/error.html", {"message": exc.message}, status=exc.status)
    top = max((r["gpu_hours"] for r in table["rows"]), default=0) or 1
    for r in table["rows"]:
        r["bar"] = r["gpu_hours"] / top * 100
    return render(request, "reservations/usage.html", {"table": table, "form": request.GET,
                                                        "groups": list(usage.GROUPS)})


@login_required
def usage_csv(request: HttpRequest) -> HttpResponse:
    try:
        table = usage.report_for(request.user, filters_from(request))
    except Refused as exc:
        return HttpResponse(exc.message, status=exc.status, content_type="text/plain")
    response = HttpResponse(usage.to_csv(table), content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="gpu-usage-{table["group"]}.csv"'
    return response


SLACK_WINDOW = 300  # seconds a signed request is good for: Slack's own advice


def slack_signature_ok(request: HttpRequest) -> bool:
    """Signed with our secret within the window, and not seen before (a replay inside the window is refused)."""
    secret = settings.SLACK_SIGNING_SECRET
    stamp = request.headers.get("X-Slack-Request-Timestamp", "")
    # a Unix time in ASCII digits (int() takes other scripts' digits; 400 of them overflow a float)
    if not secret or not (stamp.isascii() and stamp.isdigit() and len(stamp) <= 12) \
            or abs(time.time() - int(stamp)) > SLACK_WINDOW:
        return False
    base = b"v0:" + stamp.encode() + b":" + request.body
    expected = "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, request.headers.get("X-Slack-Signature", "")):
        return False
    now = timezone.now()
    SlackCommand.objects.filter(received__lt=now - timedelta(seconds=2 * SLACK_WINDOW)).delete()
    try:
        with transaction.atomic():
            SlackCommand.objects.create(signature=expected, received=now)
    except IntegrityError:
        return False
    return True


@csrf_exempt
@require_POST
def slack_command(request: HttpRequest) -> HttpResponse:
    """`/gpu-usage [group] [pool=…] [gpu=…] [days=N]`, signed by Slack (v0 HMAC-SHA256, 5 minutes, once)."""
    if not slack_signature_ok(request):
        return HttpResponse("invalid signature", status=401)
    text = request.POST.get("text", "")
    if "\x00" in text:
        return HttpResponse("The command holds a NUL byte.", status=400, content_type="text/plain")
    args = {"group": "project"}
    for word in text.split():
        key, _, value = word.partition("=")
        if not value:
            args["group"] = key
        elif key in ("pool", "cluster"):
            args["pool"] = value
        elif key in ("gpu", "gpu_type", "partition"):
            args["gpu_type"] = value
        elif key == "days":
            args["days"] = int(value) if value.isascii() and value.isdigit() and len(value) < 9 else 0
    try:
        table = usage.report(usage.Filters.parse(**args))
    except Refused as exc:
        return JsonResponse({"response_type": "ephemeral", "text": exc.message})
    return JsonResponse({"response_type": "in_channel", "text": f"```{usage.to_text(table, 'GPU usage')}```"})
