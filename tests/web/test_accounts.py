"""Accounts: local sign-up, and Discord/GitHub OAuth against a loopback fake provider (a real HTTP server),
so allauth's token exchange and profile fetch run for real."""

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest
from allauth.socialaccount.models import SocialAccount
from allauth.socialaccount.providers.discord.views import DiscordOAuth2Adapter
from allauth.socialaccount.providers.github.views import GitHubOAuth2Adapter
from django.contrib.auth import get_user_model

from leaderboards.access.actions import do_create_token

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


def popcorn_state(cli_id: str, is_reset: bool) -> str:
    """The OAuth state as popcorn-cli's src/cmd/auth.rs makes it: serde_json's compact JSON, base64url unpadded."""
    text = json.dumps({"cli_id": cli_id, "is_reset": is_reset}, separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).rstrip(b"=").decode()


@pytest.fixture
def popcorn_oauth(fake_provider, settings, monkeypatch):
    from leaderboards.popcorn import oauth

    for name, key in (("discord", "username"), ("github", "login")):
        monkeypatch.setitem(oauth.ENDPOINTS, name, (f"{fake_provider}/{name}/token", f"{fake_provider}/{name}/user",
                                                    key))
    settings.POPCORN_OAUTH = {name: {"client_id": f"{name}-id", "client_secret": f"{name}-secret"}
                              for name in ("discord", "github")}


def test_popcorn_cli_registration_through_a_loopback_provider_answers_as_kernelbot(client, popcorn_oauth):
    """popcorn-cli's `register discord`: /auth/init's state is the CLI id, which the CLI sends the provider inside
    its base64url JSON state; the provider's redirect to /auth/cli binds it and answers KernelBot's fields
    ("success", its message); the id then works as the CLI's credential."""
    cli_id = client.get("/popcorn/auth/init", {"provider": "discord"}).json()["state"]
    done = client.get("/popcorn/auth/cli/discord", {"code": "good-code", "state": popcorn_state(cli_id, False)})
    assert done.status_code == 200, done.content
    body = done.json()
    user = get_user_model().objects.get(username=f"discord-{PROFILES['discord']['id']}")
    assert body == {"status": "success", "message": "Successfully authenticated via discord and linked CLI ID.",
                    "user_id": str(user.pk), "user_name": user.username, "is_reset": False}
    assert client.get("/popcorn/user/submissions", headers={"X-Popcorn-Cli-Id": cli_id}).status_code == 200
    refused = client.get("/popcorn/auth/cli/discord", {"code": "stolen", "state": cli_id})  # a bare id is taken too
    assert refused.status_code == 401 and "rejected the authorization code" in refused.json()["detail"]


def test_popcorn_cli_reregister_replaces_the_accounts_cli_id_and_a_bad_state_is_a_400(client, popcorn_oauth):
    """As KernelBot: `register` (is_reset false) refuses a provider user who has an account, `reregister` (true)
    needs one and links the new id in place of the earlier one; a state that is not popcorn-cli's is a 400 before
    the provider is asked."""
    def init() -> str:
        return client.get("/popcorn/auth/init", {"provider": "discord"}).json()["state"]

    def callback(state: str, provider: str = "discord"):
        return client.get(f"/popcorn/auth/cli/{provider}", {"code": "good-code", "state": state})

    def works(cli_id: str) -> int:
        return client.get("/popcorn/user/submissions", headers={"X-Popcorn-Cli-Id": cli_id}).status_code

    first, second = init(), init()
    assert callback(popcorn_state(first, False)).status_code == 200
    user = get_user_model().objects.get(username=f"discord-{PROFILES['discord']['id']}")
    _, site_token = do_create_token(user, "laptop")
    again = callback(popcorn_state(second, False))
    assert again.status_code == 400 and "popcorn-cli reregister discord" in again.json()["detail"]
    assert works(second) == 401  # not linked
    reset = callback(popcorn_state(second, True))
    assert reset.status_code == 200 and reset.json()["is_reset"] is True and reset.json()["user_id"] == str(user.pk)
    assert (works(first), works(second), works(site_token)) == (401, 200, 200)  # only the CLI's earlier id goes
    unknown = callback(popcorn_state(init(), True), "github")
    assert unknown.status_code == 400 and "popcorn-cli register github" in unknown.json()["detail"]
    assert not get_user_model().objects.filter(username__startswith="github-").exists()

    asked = len(FakeProvider.seen)
    for state, words in (("%%%", "not base64url-encoded JSON"), ("e30", '"cli_id"'),  # e30 is {}
                         (popcorn_state("", False), '"cli_id"'),
                         (base64.urlsafe_b64encode(b'{"cli_id": "x", "is_reset": "yes"}').decode(), "is_reset")):
        bad = callback(state)
        assert bad.status_code == 400 and bad["Content-Type"].startswith("application/json"), (state, bad.content)
        assert bad.json()["detail"].startswith("Invalid state parameter") and words in bad.json()["detail"], state
    assert len(FakeProvider.seen) == asked
