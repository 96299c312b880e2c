"""`GET /auth/cli/{provider}?code&state` for deployments that own a Discord or GitHub OAuth app: exchange the
code for the provider account, whose user is named after it."""

from __future__ import annotations

import httpx
from django.conf import settings
from ninja.errors import HttpError

ENDPOINTS = {
    "github": ("https://github.com/login/oauth/access_token", "https://api.github.com/user", "login"),
    "discord": ("https://discord.com/api/oauth2/token", "https://discord.com/api/users/@me", "username"),
}


def oauth_app(provider: str) -> dict:
    """This deployment's OAuth app for `provider`: 400 for an unknown provider, 501 without one."""
    app = settings.POPCORN_OAUTH.get(provider) or {}
    if provider not in ENDPOINTS:
        raise HttpError(400, f"Unknown provider '{provider}'; use discord or github.")
    if not app.get("client_id") or not app.get("client_secret"):
        raise HttpError(501, f"This server has no {provider} OAuth app; log in on the web site and link your "
                        "CLI id on the account page instead.")
    return app


def oauth_username(provider: str, code: str, redirect_uri: str) -> str:
    """The user name of the provider account that authorised `code`: `<provider>-<its id>`."""
    app = oauth_app(provider)
    token_url, user_url, name_key = ENDPOINTS[provider]
    try:
        token = httpx.post(token_url, headers={"Accept": "application/json"}, timeout=15, data={
            "client_id": app["client_id"], "client_secret": app["client_secret"], "code": code,
            "grant_type": "authorization_code", "redirect_uri": redirect_uri}).json().get("access_token")
        if not token:
            raise HttpError(401, f"{provider} rejected the authorization code.")
        profile = httpx.get(user_url, headers={"Authorization": f"Bearer {token}"}, timeout=15).json()
    except httpx.HTTPError as exc:
        raise HttpError(502, f"Could not reach {provider}: {exc}") from exc
    return f"{provider}-{profile['id']}"
