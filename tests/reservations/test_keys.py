"""Users' SSH public keys: what is accepted at the door (real keys of the accepted types, nothing that could smuggle
options or a second line into an authorized_keys file), the API, the import from a loopback fake of github.com."""

from __future__ import annotations

import base64
import json
import os
import socket
import stat
import struct
import subprocess
import sys
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.utils import timezone

from kernelbot.errors import Refused
from leaderboards.access.actions import do_create_token
from runners.models import GpuPool, GpuType, GpuVendor
from runners.reservations import access, keys
from runners.reservations.models import DeviceHold, HoldKind, PoolPolicy, Reservation, SshKey
from tests import factories
from tests.agents import in_process_agent
from tests.conftest import REPO
from tests.fakes.github_keys import FakeGithubKeys

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, tuple[str, str]]:
    """kind → (.pub line, fingerprint as ssh-keygen -l prints it), from real ssh-keygen keys."""
    root, out = tmp_path_factory.mktemp("keys"), {}
    for name, args in {"ed25519": ["-t", "ed25519"], "ecdsa": ["-t", "ecdsa"], "rsa": ["-t", "rsa", "-b", "2048"],
                       "rsa1024": ["-t", "rsa", "-b", "1024"], "ed25519b": ["-t", "ed25519"]}.items():
        subprocess.run(["ssh-keygen", "-q", *args, "-N", "", "-C", f"me@{name}", "-f", str(root / name)], check=True)
        line = (root / f"{name}.pub").read_text().strip()
        fp = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(root / f"{name}.pub")],
                            capture_output=True, text=True, check=True).stdout.split()[1]
        out[name] = (line, fp)
    return out


@pytest.mark.parametrize("name", ["ed25519", "ecdsa", "rsa"])
def test_real_keys_are_accepted_stored_bare_with_ssh_keygens_fingerprint(made, name):
    line, fp = made[name]
    parsed = keys.parse_key(f"  {line}  ")
    assert parsed.fingerprint == fp and parsed.comment == f"me@{name}"
    assert parsed.key == " ".join(line.split()[:2])  # no comment, no options: what a node's file gets


def test_security_key_types_are_accepted():
    blob = b"".join(struct.pack(">I", len(p)) + p for p in (b"sk-ssh-ed25519@openssh.com", bytes(32), b"ssh:"))
    line = f"sk-ssh-ed25519@openssh.com {base64.b64encode(blob).decode()} yubi"
    assert keys.parse_key(line).key.startswith("sk-ssh-ed25519@openssh.com AAAA")


def injections(made) -> list[tuple[str, str]]:
    ed, other = made["ed25519"][0], made["ed25519b"][0]
    return [
        (f'command="sh -c id" {ed}', "Options before the key"),
        (f"restrict,pty {ed}", "Options before the key"),
        (f'no-pty,command="x" {ed}', "Options before the key"),
        (f"{ed}\n{other}", "line break"),
        (f"{ed}\ncommand=\"id\" {other}", "line break"),
        (f"{ed}\r{other}", "line break"),
        (f"{ed} comment\x00", "NUL"),
        (f"{ed}\u2028{other}", "line break"),
        (f"ssh-rsa {ed.split()[1]}", "its data is a ssh-ed25519 key"),
        (f"ssh-ed25519 {ed.split()[1][:-8]}", "not a valid key"),
        ("ssh-ed25519 not*base64", "not base64"),
        ("ssh-ed25519", "missing"),
        ("ssh-dss AAAAB3NzaC1kc3MAAACBAP", "not an SSH public key type"),
        (made["rsa1024"][0], "at least 2048 bits; this one has 1024"),
        ("", "Paste an SSH public key"),
        ("-----BEGIN OPENSSH PRIVATE KEY-----", "not an SSH public key type"),
    ]


def test_what_could_smuggle_options_or_lines_into_authorized_keys_is_refused(made):
    for text, why in injections(made):
        with pytest.raises(Refused) as refused:
            keys.parse_key(text)
        assert refused.value.status == 400 and (why is None or why in refused.value.message), (text, refused.value)


def auth(user) -> dict:
    return {"Authorization": f"Bearer {do_create_token(user)[1]}"}


def call(client, method: str, path: str, user, body: dict | None = None):
    return getattr(client, method)(f"/api/v1/gpus/keys{path}", json.dumps(body) if body is not None else None,
                                   content_type="application/json", headers=auth(user))


def test_api_add_list_duplicate_delete(client, made):
    dev, other = factories.UserFactory(), factories.UserFactory()
    line, fp = made["ed25519"]
    added = call(client, "post", "", dev, {"key": line})
    assert added.status_code == 201, added.content
    body = added.json()
    assert body["fingerprint"] == fp and body["title"] == "me@ed25519" and body["source"] == "manual"
    again = call(client, "post", "", dev, {"key": line.replace("me@ed25519", "other comment"), "title": "x"})
    assert again.status_code == 409 and f"already on your profile as #{body['id']}" in again.json()["detail"]
    assert call(client, "post", "", other, {"key": line}).status_code == 201  # the same key, another user: fine
    bad = call(client, "post", "", dev, {"key": injections(made)[0][0]})
    assert bad.status_code == 400 and "Options" in bad.json()["detail"]
    assert call(client, "post", "", dev, {"key": made["ecdsa"][0], "title": "a\nb"}).status_code == 400
    assert [k["fingerprint"] for k in call(client, "get", "", dev).json()] == [fp]
    assert call(client, "delete", f"/{body['id']}", other).status_code == 404  # not theirs
    assert call(client, "delete", f"/{body['id']}", dev).status_code == 204
    assert call(client, "delete", f"/{body['id']}", dev).status_code == 404
    assert call(client, "delete", "/99999999999999999999999", dev).status_code in (400, 404, 422)
    assert client.get("/api/v1/gpus/keys").status_code == 401
    assert SshKey.objects.filter(user=dev).count() == 0 and SshKey.objects.filter(user=other).count() == 1


def test_a_user_holds_at_most_max_keys(client, made, monkeypatch):
    monkeypatch.setattr(keys, "MAX_KEYS", 2)
    dev = factories.UserFactory()
    for name in ("ed25519", "ecdsa"):
        assert call(client, "post", "", dev, {"key": made[name][0]}).status_code == 201
    full = call(client, "post", "", dev, {"key": made["rsa"][0]})
    assert full.status_code == 409 and "At most 2 SSH keys" in full.json()["detail"]
    assert SshKey.objects.filter(user=dev).count() == 2


@pytest.fixture
def github(settings):
    fake = FakeGithubKeys()
    settings.GITHUB_WEB_URL = fake.url
    settings.GITHUB_KEYS_TIMEOUT = 1
    yield fake
    fake.close()


def test_import_from_github_replaces_that_logins_keys(client, made, github):
    dev = factories.UserFactory()
    github.users["Octo-Cat"] = [made["ed25519"][0].rsplit(" ", 1)[0], made["ecdsa"][0].rsplit(" ", 1)[0],
                                made["rsa1024"][0].rsplit(" ", 1)[0], "ssh-dss AAAAB3NzaC1kc3MAAACBAP"]
    manual = call(client, "post", "", dev, {"key": made["ecdsa"][0]}).json()  # already there by hand
    first = call(client, "post", "/github", dev, {"login": "octo-cat"})
    assert first.status_code == 201, first.content
    body = first.json()
    assert [k["fingerprint"] for k in body["keys"]] == [made["ed25519"][1]]
    assert body["keys"][0]["source"] == "github" and body["keys"][0]["title"] == "octo-cat@github"
    assert len(body["skipped"]) == 3 and any("already on your profile" in s for s in body["skipped"])
    assert any("at least 2048 bits" in s for s in body["skipped"]) and github.requests == ["/octo-cat.keys"]

    github.users["Octo-Cat"] = [made["ed25519b"][0]]  # the user changed their keys on GitHub: a re-import follows
    again = call(client, "post", "/github", dev, {"login": "@octo-cat"}).json()
    assert [k["fingerprint"] for k in again["keys"]] == [made["ed25519b"][1]]
    assert set(SshKey.objects.filter(user=dev).values_list("fingerprint", flat=True)) == {
        manual["fingerprint"], made["ed25519b"][1]}


@pytest.mark.parametrize("login", ["", "-octo", "octo-", "oc--to", "a" * 40, "../admin", "octo/cat", "octo.keys?x",
                                   "octo%2f", "o cto", "ö"])
def test_a_login_github_could_not_have_is_refused_before_any_request(client, github, login):
    answer = call(client, "post", "/github", factories.UserFactory(), {"login": login})
    assert answer.status_code == 400 and "is not a GitHub login" in answer.json()["detail"]
    assert github.requests == []


def test_github_failures_are_clear_answers_and_change_nothing(client, made, github, settings):
    dev = factories.UserFactory()
    github.users["octo"] = [made["ed25519"][0]]
    assert call(client, "post", "/github", dev, {"login": "octo"}).status_code == 201
    cases = [("nobody", None, 0, 404, "GitHub has no user 'nobody'"),
             ("octo", 500, 0, 502, "GitHub answered 500"),
             ("octo", None, 2, 502, "Could not reach GitHub for octo's keys (ReadTimeout)")]
    for login, status, delay, code, text in cases:
        github.status, github.delay = status, delay
        answer = call(client, "post", "/github", dev, {"login": login})
        assert answer.status_code == code and text in answer.json()["detail"], answer.content
    github.status, github.delay = None, 0
    github.users["empty"] = []
    empty = call(client, "post", "/github", dev, {"login": "empty"})
    assert empty.status_code == 404 and "lists no SSH key" in empty.json()["detail"]
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        settings.GITHUB_WEB_URL = f"http://127.0.0.1:{sock.getsockname()[1]}"
    down = call(client, "post", "/github", dev, {"login": "octo"})
    assert down.status_code == 502 and "ConnectError" in down.json()["detail"]
    assert list(SshKey.objects.filter(user=dev).values_list("fingerprint", flat=True)) == [made["ed25519"][1]]


def test_the_jobs_script_adds_its_lines_and_removes_exactly_them_on_sigterm(made, tmp_path):
    """The Slurm job's script under a plain sh (tests/slurm runs it in a real job): reservation 1's lines are not
    reservation 12's, though one tag starts the other."""
    path = tmp_path / "ak"
    path.write_text("ssh-ed25519 AAAA kernelbot-reservation-1-job-7\nplain line\n")
    script = access.keys_script(SimpleNamespace(pk=12, node_count=1), [keys.parse_key(made["ed25519"][0]).key],
                                str(path))
    proc = subprocess.Popen(["sh", "-c", script], env={"PATH": os.defpath, "SLURM_JOB_ID": "70", "HOME": "/nowhere"})
    try:
        deadline = time.monotonic() + 10
        while "job-70" not in path.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        lines = path.read_text().splitlines()
        assert lines[:2] == ["ssh-ed25519 AAAA kernelbot-reservation-1-job-7", "plain line"] and len(lines) == 3
        assert lines[2] == (f'{access.KEY_OPTIONS.replace("@JOB@", "70")} {made["ed25519"][0].rsplit(" ", 1)[0]} '
                            "kernelbot-reservation-12-job-70")
        assert '--jobid=70 --overlap bash -c \\"$SSH_ORIGINAL_COMMAND\\"' in lines[2]
    finally:
        proc.terminate()
        assert proc.wait(10) == 0
    assert path.read_text().splitlines() == ["ssh-ed25519 AAAA kernelbot-reservation-1-job-7", "plain line"]
    many = access.keys_script(SimpleNamespace(pk=12, node_count=2), ["ssh-ed25519 AAAA"], "~/.ssh/authorized_keys")
    assert "exec srun --overlap --ntasks-per-node=1 --nodes=2 /bin/sh -c '" in many and 'f="$HOME"/.ssh/' in many


def test_site_keys_page_add_import_remove(client, made, github):
    dev = factories.UserFactory()
    assert client.get("/gpus/keys/").status_code == 302  # login required
    client.force_login(dev)
    assert client.post("/gpus/keys/add", {"key": made["ed25519"][0], "title": "laptop"}).status_code == 302
    page = client.get("/gpus/keys/").content.decode()
    assert made["ed25519"][1] in page and "laptop" in page and "added by hand" in page
    bad = client.post("/gpus/keys/add", {"key": injections(made)[0][0], "title": "evil"})
    assert bad.status_code == 400 and "Options before the key" in bad.content.decode()
    assert 'value="evil"' in bad.content.decode()  # the form keeps what was typed
    dup = client.post("/gpus/keys/add", {"key": made["ed25519"][0]})
    assert dup.status_code == 409 and "already on your profile" in dup.content.decode()
    github.users["octo"] = [made["ecdsa"][0]]
    assert client.post("/gpus/keys/github", {"login": "octo"}).status_code == 302
    assert "GitHub (octo)" in client.get("/gpus/keys/").content.decode()
    assert client.post("/gpus/keys/github", {"login": "../x"}).status_code == 400 and github.requests == ["/octo.keys"]
    mine = SshKey.objects.get(user=dev, source="manual")
    assert client.post(f"/gpus/keys/{mine.pk}/remove").status_code == 302
    assert client.post("/gpus/keys/nonsense").status_code == 404
    other = factories.UserFactory()
    theirs = keys.do_add_key(other, made["rsa"][0])
    assert client.post(f"/gpus/keys/{theirs.pk}/remove").status_code == 404
    assert list(SshKey.objects.filter(user=dev).values_list("github_login", flat=True)) == ["octo"]
    assert SshKey.objects.filter(pk=theirs.pk).exists()


def test_site_key_changes_need_the_csrf_token(made):
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(factories.UserFactory())
    assert strict.post("/gpus/keys/add", {"key": made["ed25519"][0]}).status_code == 403
    assert not SshKey.objects.exists()


def test_cli_keys_add_list_import_remove(live_server, made, github, tmp_path, transactional_db):
    dev = factories.UserFactory()
    env = {**os.environ, "KERNELBOT_URL": live_server.url, "KERNELBOT_TOKEN": do_create_token(dev)[1],
           "KERNELBOT_CONFIG": str(tmp_path / "c.json"), "COLUMNS": "200", "HOME": str(tmp_path)}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kernelbot.cli.main", "gpus", "keys", *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=60)

    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "id_ed25519.pub").write_text(made["ed25519"][0] + "\n")
    added = cli("add")  # the default file
    assert added.returncode == 0 and made["ed25519"][1] in added.stdout, added.stdout + added.stderr
    again = cli("add", str(tmp_path / ".ssh" / "id_ed25519.pub"))
    assert again.returncode == 1 and "already on your profile" in again.stdout and "HTTP 409" in again.stdout
    (tmp_path / "id_ecdsa").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    private = cli("add", str(tmp_path / "id_ecdsa"))
    assert private.returncode == 2 and "not a .pub file" in private.stderr
    github.users["octo"] = [made["ecdsa"][0], made["rsa1024"][0]]
    imported = cli("import-github", "octo")
    assert imported.returncode == 0 and "Imported 1 key(s)" in imported.stdout and "2048 bits" in imported.stdout
    listed = cli("list")
    assert all(text in listed.stdout for text in (made["ed25519"][1], made["ecdsa"][1], "github (octo)"))
    first = SshKey.objects.get(user=dev, source="manual")
    assert cli("remove", str(first.pk)).returncode == 0
    assert "HTTP 404" in cli("remove", str(first.pk)).stdout
    assert list(SshKey.objects.filter(user=dev).values_list("fingerprint", flat=True)) == [made["ecdsa"][1]]


def test_a_local_pools_agent_keeps_active_reservations_keys_in_its_file(cpu_pool, made, tmp_path):
    """The poll answer carries the keys of reservations active on the node; an agent with --authorized-keys keeps
    exactly those there (forced into the reserved devices), and drops a reservation's once it ends."""
    node = cpu_pool.nodes.get()
    gpu = node.gpus.get(index=0)
    dev, idle = factories.UserFactory(), factories.UserFactory()
    keys.do_add_key(dev, made["ed25519"][0])
    keys.do_add_key(idle, made["ecdsa"][0])  # holds nothing: never placed
    now = timezone.now()
    r = Reservation.objects.create(user=dev, project="p", pool=cpu_pool, gpu_type=gpu.gpu_type, gpu_count=1,
                                   minutes=30, status="active", node=node, started_at=now,
                                   ends_at=now + timedelta(minutes=30), planned_gpus=[gpu.pk])
    hold = DeviceHold.objects.create(gpu=gpu, node=node, pool=cpu_pool, gpu_type=gpu.gpu_type, reservation=r,
                                     kind=HoldKind.RESERVATION, user=dev, started=now, ends=r.ends_at)
    path = tmp_path / "ssh" / "authorized_keys"
    agent = in_process_agent(node)
    agent.authorized_keys = path
    agent.poll()
    lines = path.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f'restrict,pty,command="export CUDA_VISIBLE_DEVICES=0 KERNELBOT_RESERVATION={r.pk} '
        f'KERNELBOT_INSTALLATION={agent.installation}; exec ')
    assert "runners/harness/hold.py" in lines[0]  # joins the reservation's cgroup (test_reservation_containment)
    assert lines[0].endswith(f"{keys.parse_key(made['ed25519'][0]).key} kernelbot-node-agent-reservation-{r.pk}")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    with path.open("a") as f:
        f.write("ssh-ed25519 AAAA someone else\n")
    DeviceHold.objects.filter(pk=hold.pk).update(ended=timezone.now())  # the reservation ended
    agent.poll()
    assert path.read_text() == "ssh-ed25519 AAAA someone else\n"


def test_a_slurm_pool_places_keys_only_when_its_operator_names_the_file(made, monkeypatch):
    """Placing keys lets a holder run commands as the jobs' Slurm account: off until the pool's setting names the
    file; until then the job is the plain sleep, whatever keys the holder has."""
    dev = factories.UserFactory()
    keys.do_add_key(dev, made["ed25519"][0])
    pool = GpuPool.objects.create(name="campus", backend="slurm", settings={})
    policy = PoolPolicy.objects.create(pool=pool, competition_share=0)
    h100, _ = GpuType.objects.get_or_create(name="H100", defaults={"vendor": GpuVendor.NVIDIA})
    r = SimpleNamespace(pk=3, user=dev, node_count=1, gpu_count=1, gpu_type=h100, ends_at=timezone.now(),
                        hostnames=lambda: ["node-a"], access={})
    submitted = []

    def call(args, stdin=None):
        submitted.append((args, stdin))
        return subprocess.CompletedProcess(args, 1, "", "stop here")

    for settings, placed in (({}, False), ({"authorized_keys": "~/.ssh/authorized_keys"}, True)):
        pool.settings = settings
        slurm = access.SlurmAccess(policy)
        monkeypatch.setattr(slurm, "find", lambda r: ("", "", ""))
        monkeypatch.setattr(type(slurm), "backend", SimpleNamespace(call=call, placement_args=lambda *a: []))
        assert slurm.hold(r)[0] is False  # sbatch "refused": only what was submitted matters here
        args, stdin = submitted.pop()
        assert ("--wrap" not in args and "kernelbot-reservation-3-job-" in stdin) if placed else (
            args[-2:] == ["--wrap", "sleep infinity"] and stdin is None)
