"""API v1: the current user, API tokens (create / list / revoke), the CLI's login flows, invitations."""

from __future__ import annotations

from django.urls import reverse
from ninja import Router
from ninja.errors import HttpError
from ninja.security import HttpBearer

from kernelbot.errors import ErrorOut

from . import actions
from .models import ApiToken
from .schemas import CliLoginOut, JoinedOut, JoinIn, MeOut, PasswordLoginIn, TokenCreatedOut, TokenIn, TokenOut


class TokenAuth(HttpBearer):
    """`Authorization: Bearer <token>`: an API token or a linked popcorn cli id."""

    def authenticate(self, request, token: str):
        user = actions.authenticate_token(token)
        state = actions.pending_login_state(token) if user is None else None
        if state == "declined":  # the kernelbot CLI waits while /me answers 401, and stops on this
            raise HttpError(403, actions.DECLINED_CLI_ID)
        if state:
            raise HttpError(401, "This CLI id is not linked to an account yet.")
        return user


class OptionalTokenAuth(TokenAuth):
    """For public reads: the token's user when one is presented (401 when it is not valid), else the session's
    user, logged in or anonymous."""

    def __call__(self, request):
        if "Authorization" not in request.headers:
            return request.user
        user = super().__call__(request)
        if user is None:
            raise HttpError(401, "Invalid, expired or revoked token.")
        return user


token_auth = TokenAuth()
optional_token_auth = OptionalTokenAuth()
router = Router(tags=["account"], auth=token_auth)


@router.get("/me", response={200: MeOut, 401: ErrorOut})
def me(request):
    user = request.auth
    profile = getattr(user, "profile", None)
    return {"id": user.pk, "username": user.get_username(), "display_name": getattr(profile, "display_name", "")
            or user.get_username(), "is_staff": user.is_staff}


def token_out(token: ApiToken) -> dict:
    return {"id": token.pk, "name": token.name, "hint": token.hint, "created": token.created,
            "expires": token.expires, "last_used": token.last_used}


@router.get("/tokens", response={200: list[TokenOut], 401: ErrorOut})
def list_tokens(request):
    return [token_out(t) for t in ApiToken.objects.usable().filter(user=request.auth)]


@router.post("/tokens", response={201: TokenCreatedOut, 401: ErrorOut})
def create_token(request, body: TokenIn):
    """A new token; its secret is in this response only."""
    token, raw = actions.do_create_token(request.auth, body.name, body.expires_days)
    return 201, {**token_out(token), "token": raw}


@router.delete("/tokens/{token_id}", response={204: None, 401: ErrorOut, 404: ErrorOut})
def revoke_token(request, token_id: int):
    if not actions.do_revoke_token(request.auth, token_id):
        raise HttpError(404, f"Token {token_id} not found.")
    return 204, None


@router.post("/auth/password", response={201: TokenCreatedOut, 401: ErrorOut, 429: ErrorOut}, auth=None)
def password_login(request, body: PasswordLoginIn):
    """The CLI's `login --username`: trade a site password for a new token. Failed attempts count with the site's
    login: past its limits (per account and per address) both refuse, 429 with Retry-After."""
    user = actions.check_password_login(request, body.username, body.password)
    token, raw = actions.do_create_token(user, body.name, body.expires_days)
    return 201, {**token_out(token), "token": raw}


@router.post("/auth/cli", response={201: CliLoginOut, 400: ErrorOut}, auth=None)
def start_cli_login(request):
    """The kernelbot CLI's browser login: a pending id to paste on the link page; usable as a token once linked."""
    return 201, {"cli_id": actions.do_start_cli_login(None, actions.client_address(request)),
                 "link_url": request.build_absolute_uri(reverse("access:link-cli"))}


@router.post("/join", response={200: JoinedOut, 401: ErrorOut, 404: ErrorOut, 410: ErrorOut})
def join(request, body: JoinIn):
    """Join a closed leaderboard with an invite code."""
    return {"leaderboard": actions.do_join(request.auth, body.code).leaderboard.name}
