"""`kernelbot run`: the leaderboard's task as `GET /api/v1/leaderboards/{name}/local` serves it (the platform's job,
public seed only, visibility respected), and the CLI running it on the real harness with the same verdicts, checker
messages and case tables as the platform, from a server, from its cache once the server is gone, and from a task
directory."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import socket
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client

from kernelbot.cli import local as cli_local
from leaderboards import local_run, runner_api
from leaderboards.access.actions import do_create_token
from leaderboards.access.models import Membership
from leaderboards.actions import check_submission, do_submit
from leaderboards.models import Leaderboard, Visibility
from runners.jobs import run_job, run_seed, total_timeout
from taskspec import jobspec

from ..conftest import REPO
from ..factories import LeaderboardFactory, UserFactory, submission

TASK = REPO / "problems" / "demo" / "vectoradd_py"
SUBMISSIONS = {"correct": TASK / "solutions" / "correct.py", "wrong": TASK / "solutions" / "wrong.py",
               "cheat": REPO / "tests" / "cheats" / "forge_fds.py"}
EXPECTED = {"correct": "pass", "wrong": "fail", "cheat": "hacked"}


def bearer(user) -> dict[str, str]:
    return {"Authorization": f"Bearer {do_create_token(user)[1]}"}


def test_the_local_task_is_the_platforms_job_with_the_public_seed_only(client, leaderboard):
    run = submission(leaderboard, mode="test").runs.get()
    secret_run = submission(leaderboard, mode="leaderboard").runs.get(secret=True)
    response = client.get(f"/api/v1/leaderboards/{leaderboard.name}/local")
    assert response.status_code == 200, response.content
    body = response.json()
    definition = leaderboard.problem.definition
    public = jobspec.public_seed(definition)
    # the job the platform builds for a run of this mode, on no pool's limits, with the public seed instead
    assert body["jobs"]["test"] == {"job": json.loads(json.dumps({**run_job(run), "seed": public})),
                                    "timeout_s": total_timeout(run)}
    assert set(body["jobs"]) == {"test", "benchmark"} and body["jobs"]["benchmark"]["job"]["mode"] == "benchmark"
    assert body["files"] == definition["files"] and body["submission_name"] == "submission.py"
    assert body["problem"] == {"name": "vectoradd_py", "version": 1, "content_hash": leaderboard.problem.content_hash}
    text = response.content.decode()
    for secret in (leaderboard.secret_seed, run_seed(run), run_seed(secret_run)):
        assert str(secret) not in text
    tarball = client.get(body["harness"]["url"])
    assert tarball.status_code == 200 and body["harness"]["version"] == jobspec.tarball_digest(tarball.content)


def test_the_local_task_is_for_whoever_sees_the_leaderboard(client, leaderboard):
    Leaderboard.objects.filter(pk=leaderboard.pk).update(visibility=Visibility.CLOSED)
    member, outsider = UserFactory(), UserFactory()
    Membership.objects.create(leaderboard=leaderboard, user=member)
    url = f"/api/v1/leaderboards/{leaderboard.name}/local"
    assert client.get(url).status_code == 404
    assert client.get(url, headers=bearer(outsider)).status_code == 404
    assert client.get(url, headers=bearer(member)).status_code == 200
    assert client.get(url, headers={"Authorization": "Bearer nonsense"}).status_code == 401
    missing = client.get("/api/v1/leaderboards/no-such-board/local")
    assert missing.status_code == 404 and "no-such-board" in missing.json()["detail"]
    internal = LeaderboardFactory(problem=leaderboard.problem, internal=True)
    assert client.get(f"/api/v1/leaderboards/{internal.name}/local", headers=bearer(member)).status_code == 404


# --- the CLI on the real harness --------------------------------------------------------------------------------------

class Forwarder:
    """A TCP port that forwards to the live server until it is closed: then the server's URL cannot be reached."""

    def __init__(self, target_port: int):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.target = target_port
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self.pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept(); close() alone leaves it listening
        self.listener.close()


def kernelbot_run(tmp_path: Path, url: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KERNELBOT_URL": url, "KERNELBOT_CONFIG": str(tmp_path / "config.json"),
           "XDG_CACHE_HOME": str(tmp_path / "cache"), "COLUMNS": "250"}
    env.pop("KERNELBOT_CACHE", None)
    env.pop("KERNELBOT_TOKEN", None)
    return subprocess.run([sys.executable, "-m", "kernelbot.cli.main", "run", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def local_result(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode in (0, 2), done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def spec(text: str) -> str:
    """A case's `k: v; k: v` in a stable order: on PostgreSQL the platform's stored task (jsonb) has its keys in
    jsonb's order, not task.yml's, and so does the task it serves."""
    return "; ".join(sorted(text.split("; ")))


def error(result: dict) -> str:
    """The run's error with the case it names in `spec`'s order."""
    return re.sub(r"\(((?:\w+: [^;()]+; )*\w+: [^;()]+)\)", lambda m: f"({spec(m.group(1))})", result["error"])


def cases(result: dict) -> list[tuple[str, str, str]]:
    return [(spec(c["spec"]), c["status"], c["message"]) for c in result["tests"]]


def unvalued(text: str | None) -> str:
    """A checker message without its values: the platform's public run has inputs of its own seed."""
    return re.sub(r"-?\d+\.\d+", "<value>", text or "")  # the API shows no message as null


@pytest.fixture
def platform_results(leaderboard, sync_queue, django_capture_on_commit_callbacks):
    """Each submission's test run on the platform (its node agent, the real harness), as its author reads it."""
    settings.RUNS_DIR.mkdir(parents=True, exist_ok=True)
    user = UserFactory()
    found = {}
    for name, path in SUBMISSIONS.items():
        request = check_submission(user, leaderboard.name, ["CPU"], "test", path.name, path.read_bytes())
        with django_capture_on_commit_callbacks(execute=True):
            sub = do_submit(user, request)
        run = sub.runs.get()
        shown = Client().get(f"/api/v1/submissions/{sub.pk}", headers=bearer(user)).json()["runs"][0]
        found[name] = {"verdict": run.verdict, "error": shown["error"], "tests": shown["tests"]}
    return found


@pytest.mark.slow(seconds=90)
@pytest.mark.timeout(900)
def test_kernelbot_run_gives_the_platforms_verdicts_online_offline_and_from_a_directory(
        live_server, leaderboard, platform_results, tmp_path):
    forwarder = Forwarder(int(live_server.url.rsplit(":", 1)[1]))
    url = f"http://127.0.0.1:{forwarder.port}"
    online, offline, directory = {}, {}, {}
    for name, path in SUBMISSIONS.items():
        done = kernelbot_run(tmp_path, url, str(path), "-l", leaderboard.name, "--json")
        online[name] = local_result(done)
        assert ("harness downloaded" if name == "correct" else "harness cached") in done.stderr, done.stderr
        directory[name] = local_result(kernelbot_run(tmp_path, url, str(path), "--problem", str(TASK), "--json"))
    cached = tmp_path / "cache" / "kernelbot" / "harness"
    assert [p.name for p in cached.iterdir()] == [local_run.harness_version()]  # the server's, under its version
    assert (cached / local_run.harness_version() / "runners" / "harness" / "__main__.py").is_file()
    forwarder.close()
    for name, path in SUBMISSIONS.items():
        done = kernelbot_run(tmp_path, url, str(path), "-l", leaderboard.name, "--json")
        offline[name] = local_result(done)
        assert "from the cache" in done.stderr and "offline: ConnectError" in done.stderr, done.stderr
    shown = kernelbot_run(tmp_path, url, str(SUBMISSIONS["wrong"]), "-l", leaderboard.name)
    assert shown.returncode == 2 and "Tests" in shown.stdout and "checker message" in shown.stdout
    row = next(line for line in shown.stdout.splitlines() if "size: 127" in line)
    assert "seed: 5236" in row and re.search(r"│ fail +│ 1 of 127 elements differ", row), shown.stdout
    assert "verdict: fail" in shown.stdout and "from the cache" in shown.stdout

    for name in SUBMISSIONS:
        platform, local = platform_results[name], online[name]
        assert platform["verdict"] == local["verdict"] == EXPECTED[name], (name, platform, local["error"])
        assert local["status"] == "ok" and local["mode"] == "test" and local["passed"] is (name == "correct")
        assert [c["spec"] for c in platform["tests"]] == [c["spec"] for c in local["tests"]], name  # as shown
        assert [(spec(c["spec"]), c["status"], unvalued(c["message"])) for c in platform["tests"]] == \
            [(case, status, unvalued(message)) for case, status, message in cases(local)], name
        assert unvalued(platform["error"]) == unvalued(local["error"]), name
        # the same public seed from the server's task and from the directory: the very same messages, offline too
        for other in (offline[name], directory[name]):
            assert (other["verdict"], error(other), cases(other)) == (local["verdict"], error(local), cases(local))
        assert local["system"]["sandbox"]["backend"] in ("bubblewrap", "rlimits-only")
    assert len(online["correct"]["tests"]) == 4 and online["cheat"]["tests"] == []
    assert "expected" in online["wrong"]["tests"][0]["message"]


def test_kernelbot_run_says_precisely_why_it_cannot_run(live_server, leaderboard, tmp_path):
    code = str(SUBMISSIONS["correct"])
    unknown = kernelbot_run(tmp_path, live_server.url, code, "-l", "no-such-board")
    assert unknown.returncode == 1 and "Unknown leaderboard 'no-such-board'" in unknown.stdout
    assert "HTTP 404" in unknown.stdout
    ranked = kernelbot_run(tmp_path, live_server.url, code, "-l", leaderboard.name, "--mode", "leaderboard")
    assert ranked.returncode == 1 and "mode 'leaderboard' does not run locally" in ranked.stdout, ranked.stdout
    never = kernelbot_run(tmp_path, "http://127.0.0.1:9", code, "-l", leaderboard.name)
    assert never.returncode == 1 and "was never downloaded here: run once while online" in never.stdout
    assert "ConnectError" in never.stdout
    nameless = kernelbot_run(tmp_path, live_server.url, code)
    assert nameless.returncode == 1 and "Name a leaderboard with --leaderboard" in nameless.stdout
    (tmp_path / "empty").mkdir()
    no_task = kernelbot_run(tmp_path, live_server.url, code, "--problem", str(tmp_path / "empty"))
    assert no_task.returncode == 1 and "not a usable task directory" in no_task.stdout, no_task.stdout
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True, timeout=120)
    bare = str(tmp_path / "bare" / "bin" / "python")
    no_torch = kernelbot_run(tmp_path, live_server.url, code, "--problem", str(TASK), "--python", bare)
    assert no_torch.returncode == 1 and f"{bare} cannot run the harness: it has no torch" in no_torch.stdout


def repacked(data: bytes, extra: str) -> bytes:
    """The harness tarball with one more file: another harness version."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as src, tarfile.open(fileobj=out, mode="w:gz") as dst:
        for member in src.getmembers():
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)
        note = tarfile.TarInfo("runners/harness/release_note.py")
        note.size = len(extra.encode())
        dst.addfile(note, io.BytesIO(extra.encode()))
    return out.getvalue()


def test_the_harness_follows_the_servers_version(live_server, leaderboard, tmp_path, monkeypatch):
    code = str(SUBMISSIONS["correct"])
    args = (code, "-l", leaderboard.name, "--mode", "leaderboard")  # fetched, then refused before the harness runs
    first = kernelbot_run(tmp_path, live_server.url, *args)
    assert "harness downloaded" in first.stdout, first.stdout
    assert "harness cached" in kernelbot_run(tmp_path, live_server.url, *args).stdout
    original = jobspec.tarball_digest(runner_api.harness_tarball())
    upgraded = repacked(runner_api.harness_tarball(), "NOTE = 'upgraded'\n")
    monkeypatch.setattr(runner_api, "harness_tarball", lambda: upgraded)  # the server upgraded: what it serves
    monkeypatch.setattr(local_run, "harness_version", lambda: jobspec.tarball_digest(upgraded))  # and announces
    again = kernelbot_run(tmp_path, live_server.url, *args)
    assert "harness downloaded" in again.stdout, again.stdout
    cached = tmp_path / "cache" / "kernelbot" / "harness"
    assert {p.name for p in cached.iterdir()} == {original, jobspec.tarball_digest(upgraded)}
    assert (cached / jobspec.tarball_digest(upgraded) / "runners" / "harness" / "release_note.py").is_file()


def test_a_harness_of_another_version_than_announced_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELBOT_CACHE", str(tmp_path))
    with pytest.raises(cli_local.LocalRunError, match="was the server upgraded meanwhile"):
        cli_local.install_harness(runner_api.harness_tarball(), "0" * 64)
    assert not (tmp_path / "harness" / ("0" * 64)).exists()
