"""SlurmBackend against the real single-node cluster: sbatch, squeue, scancel, the job's exit marker and fake GPUs.

The jobs run a stand-in agent from a temporary "checkout" (the real agent and platform are covered end to end in
test_end_to_end.py): it records what the job gave it, waits until the test lets it finish, and exits as told."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from leaderboards.actions import check_submission, do_submit
from leaderboards.health import do_start_pool_check
from leaderboards.models import RunStatus
from runners.backends.base import BackendUnavailable, Dispatch, Poll, RemoteState
from runners.backends.slurm import SlurmBackend, SlurmOptions
from runners.models import CheckOutcome, GpuPool, GpuType, GpuVendor, PoolCheck, PoolHealth
from tests.factories import LeaderboardFactory, UserFactory, problem_from, remote_pool

KEY = "slurm-test-key-'quoted' $HOME; x"
FAKE_AGENT = """
import argparse, json, os, sys, time
from pathlib import Path
control = Path(__file__).resolve().parents[2] / "control"
parser = argparse.ArgumentParser()
for name in ("--platform", "--run", "--attempt", "--workdir", "--result-file"):
    parser.add_argument(name)
args = parser.parse_args()
scratch = Path(args.workdir) / "kernelbot-run-x" / "work"  # as the real agent unpacks its job
scratch.mkdir(parents=True)
(scratch / "submission.py").write_text("...")
(control / f"workdir-{args.run}").write_text(args.workdir)
(control / f"started-{args.run}").write_text(str(os.getpid()))
go = control / f"go-{args.run}"
deadline = time.monotonic() + 120
while not go.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
seen = {"args": vars(args), "cwd": os.getcwd(),
        "env": {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "KERNELBOT_RUNNER_KEY",
                                               "KERNELBOT_ATTEMPT_TOKEN", "KERNELBOT_SANDBOX", "SLURM_JOB_NAME",
                                               "KB_PLATFORM_SECRET")}}
Path(args.result_file).write_text(json.dumps({"verdict": "pass", "seen": seen}))
sys.exit(int(go.read_text() or 0))
"""


class Harness:
    """A temporary checkout with the stand-in agent and the pool's work directory."""

    def __init__(self, root: Path):
        self.root = root
        self.checkout = root / "checkout"
        (self.checkout / "runners" / "harness").mkdir(parents=True)
        for init in ("runners/__init__.py", "runners/harness/__init__.py"):
            (self.checkout / init).write_text("")
        (self.checkout / "runners" / "harness" / "agent.py").write_text(textwrap.dedent(FAKE_AGENT))
        self.control = self.checkout / "control"
        self.control.mkdir()
        self.workdir = root / "work"

    def pool(self, **settings) -> GpuPool:
        base = {"checkout": str(self.checkout), "workdir": str(self.workdir), "python": sys.executable,
                "key_file": str(self.root / "keys" / "runner.env"), "sandbox": "auto",
                "gres": {"H100": "gpu:fake"}}
        return GpuPool(name="slurm-test", backend="slurm", settings={**base, **settings})

    def started(self, run_id: int) -> int:
        path = self.control / f"started-{run_id}"
        wait_for(path.exists, f"the agent of run {run_id} to start")
        return int(path.read_text())

    def finish(self, run_id: int, code: int = 0) -> None:
        (self.control / f"go-{run_id}").write_text(str(code))

    def scratch(self, run_id: int | None = None) -> Path | list[Path]:
        """The job's scratch directory (its agent's --workdir); without a run, those left in the work directory."""
        if run_id is None:
            return sorted(self.workdir.glob("attempt-*"))
        return Path((self.control / f"workdir-{run_id}").read_text())


def wait_for(predicate, what: str, timeout: float = 90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def wait_state(backend: SlurmBackend, external_id: str, *states: RemoteState, timeout: float = 90):
    polls = []

    def reached():
        polls.append(backend.poll(external_id))
        return polls[-1].state in states and polls[-1]

    try:
        return wait_for(reached, f"{external_id} to reach {states}", timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; polls: {polls[-3:]}") from exc


def job(run_id: int, gpu_count: int = 1, gpu: str = "H100") -> Dispatch:
    return Dispatch(run_id=run_id, attempt=1, nonce=f"{run_id:04d}" + "ab" * 14, platform_url="http://127.0.0.1:9",
                    gpu_type=GpuType(name=gpu, vendor=GpuVendor.NVIDIA), gpu_count=gpu_count, timeout_s=120,
                    label=f"kernelbot run {run_id} attempt 1", token=f"{run_id:04d}" + "c" * 60)


def token_file(harness: Harness, run_id: int) -> Path:
    return harness.root / "keys" / f"runner.env.{job(run_id).nonce[:16]}"


def squeue(job_id: str, fmt: str) -> str:
    return subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", fmt], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.fixture
def harness(tmp_path, settings, slurm_cluster, monkeypatch) -> Harness:
    settings.RUNNER_KEY = KEY
    monkeypatch.setenv("KB_PLATFORM_SECRET", "the platform's own environment must not reach a job")
    os.chmod(tmp_path, 0o755)
    return Harness(tmp_path)


def test_a_job_queues_runs_and_finishes_with_its_gpus_and_its_attempts_token_only(harness):
    backend = SlurmBackend(harness.pool(extra_args="--hold"))
    external_id = backend.dispatch(job(7, gpu_count=2), reporter=None)
    job_id = external_id.split(":")[0]

    held = backend.poll(external_id)
    assert held.state == RemoteState.QUEUED and "JobHeldUser" in held.detail
    assert squeue(job_id, "%j|%b") == "kernelbot run 7 attempt 1|gres:gpu:fake:2"
    assert stat.S_IMODE(token_file(harness, 7).stat().st_mode) == 0o600
    script = subprocess.run(["scontrol", "write", "batch_script", job_id, "-"], capture_output=True, text=True).stdout
    # the token travels only in the 0600 file, the runner key not at all
    assert "#!/bin/sh" in script and job(7).token not in script and "slurm-test-key" not in script

    subprocess.run(["scontrol", "release", job_id], check=True)
    harness.started(7)
    assert wait_state(backend, external_id, RemoteState.RUNNING).detail == "RUNNING"
    harness.finish(7)
    done = wait_state(backend, external_id, RemoteState.FINISHED)

    seen = done.result["seen"]
    assert seen["env"] == {"CUDA_VISIBLE_DEVICES": "0,1", "KERNELBOT_RUNNER_KEY": None,
                           "KERNELBOT_ATTEMPT_TOKEN": job(7).token, "KERNELBOT_SANDBOX": "auto",
                           "SLURM_JOB_NAME": "kernelbot run 7 attempt 1", "KB_PLATFORM_SECRET": None}
    assert seen["args"]["run"] == "7" and not token_file(harness, 7).exists()  # read once, then removed
    assert seen["args"]["workdir"].startswith(str(harness.workdir / "attempt-"))
    assert not Path(seen["args"]["workdir"]).exists()  # the job's scratch is removed
    assert seen["cwd"] == str(harness.checkout)


def test_each_job_gets_its_own_fake_gpu_and_a_cpu_job_none(harness):
    backend = SlurmBackend(harness.pool())
    first, second = backend.dispatch(job(21), None), backend.dispatch(job(22), None)
    cpu = backend.dispatch(job(23, gpu_count=0, gpu="CPU"), None)
    harness.started(21), harness.started(22)  # both GPU jobs run at once (the node's 2 cores): one device each
    for run_id in (21, 22, 23):
        harness.finish(run_id)
    devices = {wait_state(backend, ext, RemoteState.FINISHED).result["seen"]["env"]["CUDA_VISIBLE_DEVICES"]
               for ext in (first, second)}
    assert devices == {"0", "1"}
    assert wait_state(backend, cpu, RemoteState.FINISHED).result["seen"]["env"]["CUDA_VISIBLE_DEVICES"] is None


def test_cancel_a_running_job_and_kill_one(harness):
    backend = SlurmBackend(harness.pool())
    cancelled, killed = (backend.dispatch(job(run_id), None) for run_id in (31, 32))  # the node's 2 cores
    pids = {run_id: harness.started(run_id) for run_id in (31, 32)}

    scratch = {run_id: harness.scratch(run_id) for run_id in (31, 32)}
    assert all((path / "kernelbot-run-x" / "work").is_dir() for path in scratch.values())
    backend.cancel(cancelled)  # scancel: SIGTERM to the batch shell and the agent
    assert wait_state(backend, cancelled, RemoteState.CANCELLED)
    wait_for(lambda: not Path(f"/proc/{pids[31]}").exists(), "the cancelled job's agent to be gone")
    wait_for(lambda: not scratch[31].exists(), "the cancelled job's scratch to be removed")
    job_id, tag = cancelled.split(":")
    assert (harness.workdir / "jobs" / f"{job_id}-{tag}.exit").read_text() == "143\n"  # written after the scratch went
    polled = backend.poll(cancelled)  # Slurm's view while it remembers the job; the marker's while it is completing it
    assert polled.state == RemoteState.CANCELLED
    assert polled.detail.startswith(("CANCELLED", "the job was stopped by SIGTERM")), polled
    backend.cancel(cancelled)  # again, and on a finished job: harmless

    batch_shell = int(Path(f"/proc/{pids[32]}/stat").read_text().split(") ")[1].split()[1])
    os.kill(batch_shell, 9)  # the job dies under Slurm's feet (OOM killer, a crash): no marker
    assert wait_state(backend, killed, RemoteState.FAILED).detail.startswith("FAILED")  # Slurm: JobLaunchFailure
    os.kill(pids[32], 9)  # orphaned: proctrack/linuxproc loses reparented processes (proctrack/cgroup would not)

    kill_signal, agent_killed = (backend.dispatch(job(run_id), None) for run_id in (33, 34))
    harness.started(33), harness.started(34)
    subprocess.run(["scancel", "--signal=KILL", "--full", kill_signal.split(":")[0]], check=True)
    # Slurm: CANCELLED; or, when the batch shell outlived its agent by a moment, the marker's signal exit code
    assert wait_state(backend, kill_signal, RemoteState.CANCELLED, RemoteState.FAILED)

    os.kill(harness.started(34), 9)  # the agent dies under a live batch script: the script's marker says so
    died = wait_state(backend, agent_killed, RemoteState.FAILED)
    assert died.detail.startswith("agent exit code 137")
    assert not harness.scratch(34).exists()  # removed before the marker was written
    assert scratch[32].exists()  # only a SIGKILLed batch shell leaves its scratch (the next jobs sweep it after 7 days)


def test_a_job_that_never_starts_stays_queued_until_cancelled(harness):
    backend = SlurmBackend(harness.pool(extra_args="--begin=now+1hour"))
    external_id = backend.dispatch(job(41), None)
    assert backend.poll(external_id).state == RemoteState.QUEUED
    backend.cancel(external_id)
    assert wait_state(backend, external_id, RemoteState.CANCELLED)


def test_a_job_without_its_token_file_fails_with_the_reason(harness):
    backend = SlurmBackend(harness.pool(extra_args="--hold"))
    external_id = backend.dispatch(job(81), None)
    token_file(harness, 81).unlink()  # e.g. a node without the shared home directory
    subprocess.run(["scontrol", "release", external_id.split(":")[0]], check=True)
    failed = wait_state(backend, external_id, RemoteState.FAILED)
    assert failed.detail == "agent exit code 4: the attempt's token file is not readable on the node"
    assert not (harness.control / "started-81").exists()


def test_a_failed_node_loses_its_job_and_slurm_does_not_requeue_it(harness, slurm_cluster):
    backend = SlurmBackend(harness.pool())
    external_id = backend.dispatch(job(71), None)
    harness.started(71)
    slurm_cluster.scontrol("update", f"NodeName={slurm_cluster.node}", "State=DOWN", "Reason=test")
    try:
        assert wait_state(backend, external_id, RemoteState.LOST).detail.startswith("NODE_FAIL")
        time.sleep(1)
        assert backend.poll(external_id).state == RemoteState.LOST  # not requeued: the platform retries
    finally:
        slurm_cluster.scontrol("update", f"NodeName={slurm_cluster.node}", "State=RESUME")
        wait_for(slurm_cluster.node_idle, "the node to be back")


def test_refused_and_unknown_jobs(harness, settings):
    backend = SlurmBackend(harness.pool())
    settings.RUNNER_KEY = ""
    with pytest.raises(RuntimeError, match="no runner key to issue the attempt's token with"):
        backend.dispatch(job(50), None)
    settings.RUNNER_KEY = KEY
    with pytest.raises(RuntimeError, match="sbatch refused the job: .*"):
        backend.dispatch(job(51, gpu_count=3), None)  # the node has two
    with pytest.raises(BackendUnavailable, match="Invalid partition name.*To fix: set the pool's partition"):
        SlurmBackend(harness.pool(partition="nosuch")).dispatch(job(52), None)  # the pool's, not the job's
    assert backend.poll("999999:abcd") == backend.poll("999999:abcd")
    assert backend.poll("999999:abcd").state == RemoteState.LOST
    backend.cancel("999999:abcd")  # Slurm forgot it: nothing to do
    (harness.workdir / "jobs").mkdir(parents=True)
    (harness.workdir / "jobs" / "999998-abcd.exit").write_text("0\n")
    (harness.workdir / "jobs" / "999998-abcd.result.json").write_text('{"verdict": "pass"}')
    finished = backend.poll("999998:abcd")  # Slurm forgot the job, its marker did not
    assert finished.state == RemoteState.FINISHED and finished.result == {"verdict": "pass"}
    (harness.workdir / "jobs" / "999997-abcd.exit").write_text("143\n")  # its shell got SIGTERM, then Slurm forgot it
    assert backend.poll("999997:abcd") == Poll(RemoteState.CANCELLED, "the job was stopped by SIGTERM (scancel, or "
                                                                       "its time limit)")
    with pytest.raises(ValueError, match="not a Slurm job"):
        backend.poll("1; rm -rf /")


def test_ssh_login_node(harness, ssh_login, monkeypatch):
    """Every command goes through a real sshd as one string for the login node's shell: quoting (the label's spaces,
    the key's quotes and $) must survive it, and ~ paths are the login user's."""
    monkeypatch.delenv("SLURM_CONF")  # only the login node knows the cluster
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")  # no sbatch here: ssh only
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: "/usr/bin/ssh" if name == "ssh" else None)
    key_dir = f".kernelbot-test-{harness.root.name}"
    backend = SlurmBackend(harness.pool(ssh="kernelbot-login", ssh_config=str(ssh_login),
                                        key_file=f"~/{key_dir}/runner.env"))
    try:
        external_id = backend.dispatch(job(61), None)
        assert backend.poll(external_id).state in (RemoteState.QUEUED, RemoteState.RUNNING)
        harness.started(61)
        harness.finish(61)
        done = wait_state(backend, external_id, RemoteState.FINISHED)
        env = done.result["seen"]["env"]
        assert (env["KERNELBOT_ATTEMPT_TOKEN"], env["KERNELBOT_RUNNER_KEY"]) == (job(61).token, None)
        assert not (Path.home() / key_dir / f"runner.env.{job(61).nonce[:16]}").exists()  # read, then removed
        assert stat.S_IMODE((Path.home() / key_dir).stat().st_mode) == 0o700
    finally:
        shutil.rmtree(Path.home() / key_dir, ignore_errors=True)
    backend.cancel(external_id)  # a finished job: harmless
    assert SlurmBackend.available() is None  # ssh is enough

    unreachable = harness.root / "unreachable_config"
    unreachable.write_text(ssh_login.read_text().replace("Host kernelbot-login", "Host kernelbot-login\n  Port 1"))
    down = SlurmBackend(harness.pool(ssh="kernelbot-login", ssh_config=str(unreachable)))
    with pytest.raises(RuntimeError, match="ssh to kernelbot-login failed: .*Connection refused"):
        down.dispatch(job(62), None)
    with pytest.raises(RuntimeError, match="ssh to kernelbot-login failed"):
        down.poll(external_id)  # not LOST: the login node being away says nothing about the job


def test_configuration_errors_are_the_pools_and_say_what_to_fix(harness, monkeypatch):
    """Not chance, so not retried: the dispatch refuses with the tool's own words and the fix (BackendUnavailable)."""
    with pytest.raises(BackendUnavailable, match="ssh to kernelbot@nosuchhost.invalid failed: .*Could not resolve "
                                                 "hostname.*To fix: set the pool's ssh to user@host"):
        SlurmBackend(harness.pool(ssh="kernelbot@nosuchhost.invalid")).dispatch(job(63), None)
    monkeypatch.delenv("SLURM_CONF")  # a submit host without the cluster's configuration
    with pytest.raises(BackendUnavailable, match="Could not establish a configuration source.*To fix: .*SLURM_CONF"):
        SlurmBackend(harness.pool()).dispatch(job(64), None)


@pytest.mark.django_db
def test_a_misconfigured_pool_fails_its_check_with_the_fix_and_its_run_is_tried_once(
        harness, monkeypatch, sync_queue, django_capture_on_commit_callbacks, demo_task):
    monkeypatch.delenv("SLURM_CONF")
    cpu, _ = GpuType.objects.get_or_create(name="CPU", defaults={"vendor": GpuVendor.CPU})
    pool = remote_pool("slurm", cpu, name="slurm", settings=harness.pool().settings)
    board = LeaderboardFactory(problem=problem_from(demo_task), gpu_types=[cpu])
    user = UserFactory()
    request = check_submission(user, board.name, ["CPU"], "test", "k.py", b"def custom_kernel(d): ...")
    with django_capture_on_commit_callbacks(execute=True):
        run = do_submit(user, request).runs.get()
    run.refresh_from_db()
    assert (run.status, run.attempt, run.infra_failures) == (RunStatus.QUEUED, 1, 0)  # one try, then it waits
    assert "SLURM_CONF" in run.attempts.get().reason and "SLURM_CONF" not in run.error
    pool.refresh_from_db()
    assert pool.health == PoolHealth.FAILING and "To fix: sbatch on the workers' machine finds no Slurm " \
                                                  "configuration: give the workers SLURM_CONF" in pool.health_detail
    with django_capture_on_commit_callbacks(execute=True):
        do_start_pool_check(pool)
    (check,) = PoolCheck.objects.filter(pool=pool, run_id__isnull=False)
    assert check.outcome == CheckOutcome.FAILING and "To fix: " in check.detail and "SLURM_CONF" in check.detail
    run.refresh_from_db()
    assert (run.status, run.attempt) == (RunStatus.QUEUED, 1)  # never sent into the same refusal again


@pytest.mark.parametrize(("pool_settings", "error"), [
    ({"extra_args": "--export=ALL"}, "--export is set by the platform"),
    ({"extra_args": "-o /tmp/x"}, "only long options"),
    ({"extra_args": "--wrap='rm -rf ~'"}, "--wrap is set by the platform"),
    ({"extra_args": "--comment='unbalanced"}, "Cannot split"),
    ({"ssh": "-oProxyCommand=touch /tmp/x"}, "ssh"),
    ({"partition": "gpu;reboot"}, "partition"),
    ({"gres": {"H100": "gpu:h100:2 --wrap x"}}, "gres name"),
    ({"gres": ["gpu"]}, "JSON object"),
    ({"workdir": "$(reboot)"}, "workdir"),
    ({"sandbox": "none"}, "sandbox"),
])
def test_bad_settings_are_refused_with_the_reason(pool_settings, error):
    form = SlurmOptions(data=pool_settings)
    assert not form.is_valid()
    assert error in str(form.errors.as_data())
    with pytest.raises(BackendUnavailable, match="invalid settings"):
        SlurmBackend(GpuPool(name="bad", backend="slurm", settings=pool_settings))


def test_sbatch_arguments_follow_the_pool_and_the_job():
    pool = GpuPool(name="p", backend="slurm", settings={
        "partition": "gpu", "account": "lab", "qos": "short", "gres": {"H100": "gpu:h100"},
        "extra_args": "--constraint=sm90 --mem=64G", "ssh": "kb@login"})
    args = SlurmBackend(pool).sbatch_args(job(1, gpu_count=4))
    assert args == ["sbatch", "--parsable", "--export=NIL", "--job-name=kernelbot run 1 attempt 1", "--no-requeue",
                    "--nodes=1", "--ntasks=1", "--time=5", "--output=/dev/null", "--error=/dev/null", "--partition=gpu",
                    "--account=lab", "--qos=short", "--gres=gpu:h100:4", "--constraint=sm90", "--mem=64G"]
    assert "--gres=gpu:1" in SlurmBackend(pool).sbatch_args(job(1, gpu="L4"))
    odd = Dispatch(**{**job(1).__dict__, "label": "run 1\nrm -rf ~"})
    script = SlurmBackend(pool).batch_script(odd, "ab")
    assert script.splitlines()[1] == "# run 1_rm -rf _" and "rm -rf ~" not in script  # a label adds no line
    with pytest.raises(ValueError, match="not hex"):
        SlurmBackend(pool).dispatch(Dispatch(**{**job(1).__dict__, "nonce": "$(reboot)"}), None)


def test_a_job_that_fails_between_the_marker_check_and_squeue_is_told_by_its_marker(tmp_path):
    """One poll reads the marker, then squeue: a job that writes its marker and exits in between is FAILED to Slurm
    (NonZeroExitCode, seen under load); the poll looks at the marker once more, which names the agent's exit code."""
    backend = SlurmBackend(Harness(tmp_path).pool(ssh="login.example"))  # Slurm is faked here: no sbatch needed
    answers = iter(["@kernelbot:Q\n42|FAILED|NonZeroExitCode\n", "@kernelbot:M\n137\n"])
    backend.call = lambda argv, stdin=None: subprocess.CompletedProcess(argv, 0, next(answers), "")
    polled = backend.poll("42:5eed")
    assert polled.state == RemoteState.FAILED
    assert polled.detail.startswith("agent exit code 137")
