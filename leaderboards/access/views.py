"""Logged-in pages: link a CLI's pending id (the kernelbot CLI's or popcorn-cli's) to the account, create / revoke
API tokens, and join closed leaderboards with an invite code."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from .. import dataset
from ..web_forms import InviteForm
from . import actions
from .models import ApiToken


@login_required
@require_http_methods(["GET", "POST"])
def link_cli(request):
    """A CLI's pending id (the kernelbot CLI's `login`, popcorn-cli's `register`): the user pastes it here (it is never
    put in a URL path), or opens the CLI's `?state=` link; either way the page asks before linking (the id becomes an
    API token), and declining tells the waiting CLI."""
    status, state, asking = 200, "", None
    if request.method == "POST":
        raw = request.POST.get("cli_id", "")
        try:
            if "decline" in request.POST:
                actions.do_decline_cli_login(raw)
                messages.info(request, "Not linked: the CLI waiting on that id is told so and stops waiting.")
                return redirect("access:tokens")
            if request.POST.get("confirm") != "yes":  # pasted: show what it is and ask first
                asking = actions.check_cli_login(request.user, raw)
                state = raw.strip() if asking else ""
            if asking is None:
                token = actions.do_bind_cli_login(request.user, raw)
                provider = token.pendinglogin.provider
                messages.success(request, f"Your CLI is linked: {actions.cli_name(provider)} can submit as you now.")
                return redirect("access:tokens")
        except actions.AccessDenied as exc:
            messages.error(request, exc.message)
            status = exc.status
    else:
        state = request.GET.get("state", "")
        asking = actions.pending_cli_login(state) if state else None
    if state and asking is None:
        messages.error(request, "The CLI id in this link is unknown, expired or linked already: nothing is filled in. "
                                "Run `kernelbot login` (or `popcorn-cli register`) again.")
    return render(request, "leaderboards/access/link_cli.html", {
        "cli_id": state if asking else "", "asking": asking, "cli": actions.cli_name(asking.provider) if asking else "",
        "your_address": actions.client_address(request)}, status=status)


@login_required
@require_http_methods(["GET", "POST"])
def tokens(request):
    created, status = None, 200
    try:
        if request.method == "POST" and "revoke" in request.POST:
            revoke = request.POST["revoke"]
            if not revoke.isdigit() or len(revoke) > 18:
                raise actions.AccessDenied(f"'revoke' must be a token id (a whole number), not {revoke[:40]!r}.")
            actions.do_revoke_token(request.user, int(revoke))
            return redirect("access:tokens")
        if request.method == "POST":
            days = request.POST.get("expires_days", "").strip()
            if days and not (days.isdigit() and len(days) <= 6):
                raise actions.AccessDenied(f"'expires days' must be a whole number of days, not {days[:40]!r}.")
            _, created = actions.do_create_token(request.user, request.POST.get("name", "cli"),
                                                 int(days) if days else None)
    except actions.AccessDenied as exc:
        messages.error(request, exc.message)
        status = exc.status
    return render(request, "leaderboards/access/tokens.html", {
        "created": created, "tokens": ApiToken.objects.filter(user=request.user, revoked__isnull=True),
        "api_url": request.build_absolute_uri("/popcorn").rstrip("/"), "publishes": dataset.publishes(request.user),
        "site_url": request.build_absolute_uri("/").rstrip("/")}, status=status)


@login_required
@require_http_methods(["POST"])
def publishing(request):
    """Opt in or out of the published submissions dataset (`leaderboards.dataset`)."""
    choice = request.POST.get("publish", "")
    if choice not in ("yes", "no"):
        messages.error(request, f"'publish' must be yes or no, not {choice[:40]!r}.")
        return render(request, "leaderboards/access/tokens.html", {
            "tokens": ApiToken.objects.filter(user=request.user, revoked__isnull=True),
            "publishes": dataset.publishes(request.user)}, status=400)
    dataset.do_set_publishing(request.user, choice == "yes")
    messages.success(request, "Your submissions will be in published datasets." if choice == "yes" else
                     "Your submissions are left out of every dataset exported from now on.")
    return redirect("access:tokens")


@login_required
@require_http_methods(["GET", "POST"])
def join(request):
    """Redeem an invite code, typed in or from an organiser's link (`/join/?code=…`: in the query, never the path).
    A GET only shows the boards the code opens (a link preview must not use the code up); joining is the POST,
    through `actions.do_join` like the APIs'."""
    form = InviteForm(request.POST if request.method == "POST" else request.GET if "code" in request.GET else None)
    invite, status = None, 200
    if form.is_bound and not form.is_valid():
        status = 400
    elif form.is_bound:
        code = form.cleaned_data["code"]
        try:
            invite = actions.check_invite(code)
            if request.method == "POST":
                actions.do_join(request.user, code)
                boards = actions.invite_boards(invite)
                messages.success(request, f"You are a member of {', '.join(b.name for b in boards)}: you can see "
                                          f"and submit to {'it' if len(boards) == 1 else 'them'} now.")
                return redirect("leaderboard", boards[0].name)
        except actions.AccessDenied as exc:
            form.add_error("code", exc.message)
            invite, status = None, exc.status
    return render(request, "leaderboards/access/join.html", {
        "form": form, "boards": actions.invite_boards(invite) if invite else []}, status=status)
