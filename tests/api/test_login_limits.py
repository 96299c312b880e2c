"""The API's password login (the CLI's `login --username`) and the site's login count failed attempts together, with
the site's own rule (leaderboards.access.adapter: 10 per address a minute, 5 per address and account in 15 minutes,
KERNELBOT_LOGIN_FAILURES_PER_ACCOUNT per account from anywhere): past it both refuse, the right password too (issue
35: 25 wrong passwords, then the right one, got a token from the API while the site refused that address), but only
from where the failures came (issue 43: strangers locked the owner out everywhere)."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from leaderboards.access.models import ApiToken, KnownClient

from ..factories import UserFactory

pytestmark = pytest.mark.django_db
SITE_REFUSAL = "Too many failed login attempts"


@pytest.fixture
def dave(db):
    user = UserFactory(username="dave")
    user.set_password("correct horse")
    user.save()
    return user


def api_login(client, username: str, password: str, address: str = "127.0.0.1"):
    return client.post("/api/v1/auth/password", json.dumps({"username": username, "password": password}),
                       content_type="application/json", REMOTE_ADDR=address)


def site_login(client, username: str, password: str, address: str = "127.0.0.1"):
    return client.post("/accounts/login/", {"login": username, "password": password}, REMOTE_ADDR=address)


def test_failed_api_logins_lock_the_account_on_the_api_and_the_site(client, dave):
    answers = [api_login(client, "dave", f"wrong {i}").status_code for i in range(25)]
    assert answers == [401] * 5 + [429] * 20
    refused = api_login(client, "dave", "correct horse")
    detail = refused.json()["detail"]
    assert refused.status_code == 429 and "Too many failed logins for this account" in detail, detail
    assert int(refused["Retry-After"]) == 900 and "try again in 15 min" in detail
    browser = Client()
    site = site_login(browser, "dave", "correct horse")
    assert site.status_code == 200 and SITE_REFUSAL in site.content.decode()
    assert "_auth_user_id" not in browser.session


def test_failed_site_logins_lock_the_account_on_the_api(client, dave):
    for i in range(5):
        assert "not correct" in site_login(Client(), "dave", f"wrong {i}").content.decode()
    assert SITE_REFUSAL in site_login(Client(), "dave", "correct horse").content.decode()
    assert api_login(client, "dave", "correct horse").status_code == 429


def test_failures_from_one_address_refuse_every_account_from_it_only(client, dave):
    for i in range(10):  # ten accounts, one failure each: the address's limit
        assert api_login(client, f"someone{i}", "guess").status_code == 401
    assert api_login(client, "dave", "correct horse").status_code == 429
    assert SITE_REFUSAL in site_login(Client(), "dave", "correct horse").content.decode()
    elsewhere = api_login(client, "dave", "correct horse", address="10.0.0.2")
    assert elsewhere.status_code == 201 and elsewhere.json()["token"]


def test_a_right_password_is_not_counted_as_a_failure(client, dave):
    for _ in range(8):
        assert api_login(client, "dave", "correct horse").status_code == 201
    assert [api_login(client, "dave", "wrong").status_code for _ in range(5)] == [401] * 5


def test_behind_a_proxy_the_limit_is_the_forwarded_address(client, dave, settings):
    settings.ALLAUTH_TRUSTED_PROXY_COUNT = 1  # KERNELBOT_TRUSTED_PROXY_COUNT
    for i in range(10):  # one client behind the proxy fails ten times
        assert client.post("/api/v1/auth/password", json.dumps({"username": f"someone{i}", "password": "guess"}),
                           content_type="application/json", HTTP_X_FORWARDED_FOR="203.0.113.7").status_code == 401
    other = client.post("/api/v1/auth/password", json.dumps({"username": "dave", "password": "correct horse"}),
                        content_type="application/json", HTTP_X_FORWARDED_FOR="198.51.100.9")
    assert other.status_code == 201  # another client, the same proxy (REMOTE_ADDR 127.0.0.1)


def test_a_strangers_failures_do_not_lock_the_owner_out(client, dave):
    """Issue 43: 40 wrong passwords from one address refused the owner's right one from another address (429 on the
    API and on the site for 5 minutes). Failures count per (address, account): that address is refused, the owner
    elsewhere gets in on the API, the site and so the CLI linking page."""
    answers = [api_login(client, "dave", f"wrong {i}", address="203.0.113.66").status_code for i in range(20)]
    answers += [200 if "not correct" in site_login(Client(), "dave", f"wrong {i}", address="203.0.113.66")
                .content.decode() else 429 for i in range(20)]
    assert answers == [401] * 5 + [429] * 35
    assert api_login(client, "dave", "correct horse", address="203.0.113.66").status_code == 429
    token = api_login(client, "dave", "correct horse", address="198.51.100.2")
    assert token.status_code == 201 and token.json()["token"]
    browser = Client(REMOTE_ADDR="198.51.100.3")
    assert site_login(browser, "dave", "correct horse", address="198.51.100.3").status_code == 302
    assert browser.session["_auth_user_id"] == str(dave.pk)
    cli_id = client.post("/api/v1/auth/cli", REMOTE_ADDR="198.51.100.3").json()["cli_id"]
    assert browser.post("/tokens/link-cli/", {"cli_id": cli_id, "confirm": "yes"}).status_code == 302
    assert ApiToken.objects.filter(user=dave, pendinglogin__isnull=False).exists()


def test_failures_for_one_account_from_many_addresses_meet_a_slower_cap(client, dave, settings):
    """A guessing spread over many addresses (each under its own limit) meets the per-account cap, in a longer
    window; the refusal says so. KERNELBOT_LOGIN_FAILURES_PER_ACCOUNT, here 8 an hour."""
    settings.ACCOUNT_RATE_LIMITS = {**settings.ACCOUNT_RATE_LIMITS, "login_failed_account": "8/h/key"}
    answers = [api_login(client, "dave", "guess", address=f"203.0.113.{i // 2}").status_code for i in range(8)]
    assert answers == [401] * 8
    for address in ("203.0.113.50", "198.51.100.2"):
        refused = api_login(client, "dave", "correct horse", address=address)
        assert refused.status_code == 429 and int(refused["Retry-After"]) == 3600
        assert refused.json()["detail"].startswith("Too many failed logins for this account (from all addresses); "
                                                   "try again in 60 min")
    assert SITE_REFUSAL in site_login(Client(), "dave", "correct horse", address="198.51.100.4").content.decode()
    assert api_login(client, "someone", "guess", address="198.51.100.2").status_code == 401  # other accounts: as ever


def test_one_address_cannot_reach_the_account_cap_by_default():
    """The per-account cap only helps the owner when no single address can fill it: failing as fast as its own limit
    lets it, one address stays under the cap (with 5 in 5 minutes per address and 50 an hour per account it got 60
    an hour, so one stranger locked the owner out everywhere for an hour)."""
    from allauth.core.internal.ratelimit import parse_rates
    from django.conf import settings

    pair = next(r for r in parse_rates(settings.ACCOUNT_RATE_LIMITS["login_failed"]) if r.per == "key")
    (account,) = parse_rates(settings.ACCOUNT_RATE_LIMITS["login_failed_account"])
    assert pair.amount * account.duration / pair.duration < account.amount


def test_a_malformed_account_cap_is_refused_when_the_settings_load():
    import os
    import subprocess
    import sys

    env = {**os.environ, "KERNELBOT_LOGIN_FAILURES_PER_ACCOUNT": "50/h/key",
           "DJANGO_SETTINGS_MODULE": "kernelbot.settings"}
    done = subprocess.run([sys.executable, "-c", "import django; django.setup()"], env=env, capture_output=True,
                          text=True)
    assert done.returncode != 0 and "KERNELBOT_LOGIN_FAILURES_PER_ACCOUNT='50/h/key'" in done.stderr


def test_failures_from_many_addresses_never_lock_the_owner_out_where_they_logged_in_before(client, dave):
    """Issue 51: 100 wrong passwords from 20-25 addresses refused the right one everywhere for an hour. After 200
    failures from 40 addresses (each under its own limit; API and site) the per-account cap refuses a fresh address,
    but not the owner's right password from an address (API, site) or a browser (its device cookie) that logged in
    before."""
    assert api_login(client, "dave", "correct horse", address="198.51.100.7").status_code == 201
    browser = Client(REMOTE_ADDR="198.51.100.8")
    assert site_login(browser, "dave", "correct horse", address="198.51.100.8").status_code == 302
    device = browser.cookies["kb_device"].value
    answers = []
    for i in range(200):
        address = f"203.0.113.{i % 40}"
        if i % 2:
            page = site_login(Client(), "dave", f"wrong {i}", address=address).content.decode()
            answers.append(401 if "not correct" in page else 429 if SITE_REFUSAL in page else 0)
        else:
            answers.append(api_login(client, "dave", f"wrong {i}", address=address).status_code)
    assert answers == [401] * 100 + [429] * 100  # brute force meets the per-account cap (100 an hour)
    refused = api_login(client, "dave", "correct horse", address="192.0.2.1")
    assert refused.status_code == 429 and int(refused["Retry-After"]) == 3600  # a fresh address: refused
    assert api_login(client, "dave", "correct horse", address="198.51.100.7").status_code == 201
    assert site_login(Client(), "dave", "correct horse", address="198.51.100.7").status_code == 302
    returning = Client(REMOTE_ADDR="192.0.2.2")
    returning.cookies["kb_device"] = device
    assert site_login(returning, "dave", "correct horse", address="192.0.2.2").status_code == 302
    assert returning.session["_auth_user_id"] == str(dave.pk)
    erin = UserFactory(username="erin")
    erin.set_password("battery staple")
    erin.save()
    assert api_login(client, "erin", "battery staple", address="198.51.100.7").status_code == 201
    assert api_login(client, "dave", "wrong", address="198.51.100.7").status_code == 401  # still counted there
    # three addresses (198.51.100.7 and .8, 192.0.2.2), two browsers (the returning one kept its cookie): digests only
    assert KnownClient.objects.filter(user=dave).count() == 5
    assert returning.cookies["kb_device"].value == device
    assert not KnownClient.objects.filter(digest__contains="198.51").exists()


def test_an_ipv6_owner_is_known_by_their_slash_64_and_a_device_cookie_only_for_its_account(client, dave, settings):
    settings.ACCOUNT_RATE_LIMITS = {**settings.ACCOUNT_RATE_LIMITS, "login_failed_account": "8/h/key"}
    assert api_login(client, "dave", "correct horse", address="2001:db8:1::5").status_code == 201
    browser = Client(REMOTE_ADDR="198.51.100.8")
    assert site_login(browser, "dave", "correct horse", address="198.51.100.8").status_code == 302
    for i in range(8):
        assert api_login(client, "dave", "guess", address=f"203.0.113.{i}").status_code == 401
    assert api_login(client, "dave", "correct horse", address="2001:db8:1::99").status_code == 201  # same /64
    assert api_login(client, "dave", "correct horse", address="2001:db8:2::5").status_code == 429
    for i in range(8):
        assert api_login(client, "erin", "guess", address=f"203.0.113.{i}").status_code == 401
    stranger = Client(REMOTE_ADDR="192.0.2.9")
    stranger.cookies["kb_device"] = browser.cookies["kb_device"].value  # dave's browser, another account
    assert SITE_REFUSAL in site_login(stranger, "erin", "guess", address="192.0.2.9").content.decode()
