"""/gpus/keys/: the user's SSH public keys (add, remove, import from GitHub). Thin over `keys`."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from kernelbot.errors import Refused

from . import keys


def page(request: HttpRequest, status: int = 200, form=None) -> HttpResponse:
    return render(request, "reservations/keys.html", {"keys": keys.keys_of(request.user), "max": keys.MAX_KEYS,
                                                      "form": form or {}}, status=status)


@login_required
def keys_page(request: HttpRequest) -> HttpResponse:
    return page(request)


@login_required
@require_POST
def change(request: HttpRequest, verb: str, key_id: int | None = None) -> HttpResponse:
    try:
        if verb == "add":
            key = keys.do_add_key(request.user, request.POST.get("key", ""), request.POST.get("title", ""))
            messages.success(request, f"Added {key.fingerprint}.")
        elif verb == "github":
            added, skipped = keys.do_import_github(request.user, request.POST.get("login", ""))
            messages.success(request, f"Imported {len(added)} key(s) from GitHub"
                             + (f"; skipped: {'; '.join(skipped)}." if skipped else "."))
        elif verb == "remove" and key_id is not None:
            keys.do_remove_key(request.user, key_id)
            messages.success(request, f"Removed key #{key_id}.")
        else:
            raise Http404("No such action.")
    except Refused as exc:
        messages.error(request, exc.message)
        return page(request, exc.status, request.POST)
    return redirect("gpus_keys")
