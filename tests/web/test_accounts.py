"""Accounts: local sign-up, and Discord/GitHub OAuth against a loopback fake provider (a real HTTP server),
so allauth's token exchange and profile fetch run for real."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest
from allauth.socialaccount.models import SocialAccount
from allauth.socialaccount.providers.discord.views import DiscordOAuth2Adapter
from allauth.socialaccount.providers.github.views import GitHubOAuth2Adapter
from django.contrib.auth import get_user_model

pytestmark = pytest.mark.django_db
PROFILES = {"github": {"id": 4242, "login": "octo", "name": "Octo Cat", "email": None},
            "discord": {"id": "80351110224678912", "username": "nelly", "global_name": "Nelly", "email": None}}


class FakeProvider(BaseHTTPRequestHandler):
    seen: list[tuple[str, str]] = []

    def log_message(self, *args):  # keep test output quiet
        pass

    def reply(self, body: object, status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):  # token endpoint
        form = parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
        self.seen.append(("token", form["code"][0]))
        if form["code"][0] != "good-code":
            return self.reply({"error": "bad_verification_code"}, 400)
        self.reply({"access_token": "fake-token", "token_type": "bearer", "scope": "identify"})

    def do_GET(self):
        provider = self.path.split("/")[1]
        self.seen.append((self.path, self.headers.get("Authorization", "")))
        if not self.headers.get("Authorization", "").endswith("fake-token"):
            return self.reply({"message": "Bad credentials"}, 401)
        if self.path.endswith("/emails"):
            return self.reply([])
        self.reply(PROFILES[provider])


@pytest.fixture
def fake_provider(settings, monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeProvider)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    for adapter, name in ((GitHubOAuth2Adapter, "github"), (DiscordOAuth2Adapter, "discord")):
        monkeypatch.setattr(adapter, "authorize_url", f"{base}/{name}/authorize")
        monkeypatch.setattr(adapter, "access_token_url", f"{base}/{name}/token")
        monkeypatch.setattr(adapter, "profile_url", f"{base}/{name}/user")
    monkeypatch.setattr(GitHubOAuth2Adapter, "emails_url", f"{base}/github/user/emails")
    settings.SOCIALACCOUNT_PROVIDERS = {
        name: {"APPS": [{"client_id": f"{name}-id", "secret": f"{name}-secret", "key": ""}]}
        for name in ("github", "discord")}
    FakeProvider.seen = []
    yield base
    server.shutdown()


def test_local_sign_up_logs_the_user_in(client):
    response = client.post("/accounts/signup/", {"username": "newbie", "password1": "kernels-are-fun-42",
                                                 "password2": "kernels-are-fun-42"})
    assert response.status_code == 302
    assert "newbie" in client.get("/").content.decode()


def test_oauth_buttons_are_hidden_without_provider_settings(client, settings):
    settings.SOCIALACCOUNT_PROVIDERS = {}
    page = client.get("/accounts/login/").content.decode()
    assert "GitHub" not in page and "Discord" not in page


@pytest.mark.parametrize("provider", ["github", "discord"])
def test_oauth_login_round_trip_through_a_loopback_provider(client, fake_provider, provider):
    assert provider in client.get("/accounts/login/").content.decode().lower()
    start = client.post(f"/accounts/{provider}/login/")
    authorize = urlparse(start["Location"])
    assert start["Location"].startswith(f"{fake_provider}/{provider}/authorize")
    query = parse_qs(authorize.query)
    assert query["client_id"] == [f"{provider}-id"]
    done = client.get(f"/accounts/{provider}/login/callback/", {"code": "good-code", "state": query["state"][0]})
    assert done.status_code == 302, done.content[:500]
    account = SocialAccount.objects.get(provider=provider)
    assert account.uid == str(PROFILES[provider]["id"])
    assert ("token", "good-code") in FakeProvider.seen
    assert any(auth.endswith("fake-token") for path, auth in FakeProvider.seen if path.endswith("/user"))
    assert int(client.session["_auth_user_id"]) == account.user_id
    assert get_user_model().objects.get(pk=account.user_id).username in ("octo", "nelly")


def test_oauth_callback_with_a_bad_code_shows_an_error_not_a_500(client, fake_provider):
    start = client.post("/accounts/github/login/")
    state = parse_qs(urlparse(start["Location"]).query)["state"][0]
    response = client.get("/accounts/github/login/callback/", {"code": "stolen", "state": state})
    assert response.status_code == 401 and "Third-Party Login Failure" in response.content.decode()
    assert not SocialAccount.objects.exists()
    assert "_auth_user_id" not in client.session


def test_popcorn_cli_registration_through_a_loopback_provider_answers_as_kernelbot(client, fake_provider, settings,
                                                                                   monkeypatch):
    """popcorn-cli's `register discord`: /auth/init's state is the CLI id; the provider's redirect to /auth/cli binds
    it and answers KernelBot's fields ("success", its message); the id then works as the CLI's credential."""
    from leaderboards.popcorn import oauth

    monkeypatch.setitem(oauth.ENDPOINTS, "discord", (f"{fake_provider}/discord/token", f"{fake_provider}/discord/user",
                                                     "username"))
    settings.POPCORN_OAUTH = {"discord": {"client_id": "discord-id", "client_secret": "discord-secret"}}
    cli_id = client.get("/popcorn/auth/init", {"provider": "discord"}).json()["state"]
    done = client.get("/popcorn/auth/cli/discord", {"code": "good-code", "state": cli_id})
    assert done.status_code == 200, done.content
    body = done.json()
    user = get_user_model().objects.get(username=f"discord-{PROFILES['discord']['id']}")
    assert body == {"status": "success", "message": "Successfully authenticated via discord and linked CLI ID.",
                    "user_id": str(user.pk), "user_name": user.username, "is_reset": False}
    assert client.get("/popcorn/user/submissions", headers={"X-Popcorn-Cli-Id": cli_id}).status_code == 200
    refused = client.get("/popcorn/auth/cli/discord", {"code": "stolen", "state": cli_id})
    assert refused.status_code == 401 and "rejected the authorization code" in refused.json()["detail"]
