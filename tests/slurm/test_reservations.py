"""Reservations on a Slurm pool, against the real single-node cluster: the reservation is a Slurm job holding its
GPUs (Slurm itself keeps other jobs off them), the holder attaches with the command it is given, an extension raises
the job's time limit, and the end of the reservation cancels the job. A start that is retried reuses its job."""

from __future__ import annotations

import getpass
import re
import stat
import subprocess
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from leaderboards.errors import Refused
from runners.models import Gpu, GpuPool, GpuType, GpuVendor, Node
from runners.reservations import actions, keys, tasks
from runners.reservations.access import SlurmAccess, access_for
from runners.reservations.actions import ReserveRequest
from runners.reservations.models import DeviceHold, PoolPolicy, Reservation
from tests import factories

from .sshd import login_node

pytestmark = [pytest.mark.slow, pytest.mark.django_db]


@pytest.fixture
def slurm_pool(slurm_cluster):
    h100, _ = GpuType.objects.get_or_create(name="H100", defaults={"vendor": GpuVendor.NVIDIA})
    pool = GpuPool.objects.create(name="campus", backend="slurm", settings={"gres": {"H100": "gpu:fake"}})
    node = Node.objects.create(pool=pool, hostname=slurm_cluster.node)  # the node's name is Slurm's
    Gpu.objects.bulk_create(Gpu(node=node, gpu_type=h100, index=i) for i in range(2))
    PoolPolicy.objects.create(pool=pool, competition_share=0, access_note="GPUs {gpus} on {hostname}:")
    yield pool
    for r in Reservation.objects.all():
        subprocess.run(["scancel", f"--name={SlurmAccess.job_name(r)}"], capture_output=True)


def squeue(*args: str) -> str:
    return subprocess.run(["squeue", "-h", *args], capture_output=True, text=True, check=True).stdout.strip()


def job_of(r: Reservation) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", r.access["slurm_job"]], capture_output=True, text=True,
                         check=True).stdout
    return dict(part.split("=", 1) for part in out.split() if "=" in part)


def wait_gone(job: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = squeue("-t", "all", "-j", job, "-o", "%T")
        if state in ("CANCELLED", "COMPLETED", ""):
            return state
        time.sleep(0.2)
    raise AssertionError(f"job {job} still {state}")


def test_a_reservation_is_a_slurm_job_holding_its_gpus_until_it_ends(slurm_pool, sync_queue,
                                                                       django_capture_on_commit_callbacks):
    user = factories.UserFactory(username="dev")
    with django_capture_on_commit_callbacks(execute=True):  # activation, then the start (sbatch, wait until running)
        r = actions.do_reserve(user, ReserveRequest("h100", 2, 60))
    r.refresh_from_db()
    assert r.status == "active" and r.start_hook_done_at is not None, r.failure
    job = r.access["slurm_job"]
    assert r.access["command"] == f"srun --jobid={job} --overlap --pty bash"
    assert r.access["note"].startswith("GPUs 0,1 on ") and r.access["command"] in r.access["note"]
    fields = job_of(r)
    assert fields["JobState"] == "RUNNING" and "gpu:fake:2" in str(fields)
    assert squeue("-j", job, "-o", "%j") == f"kernelbot reservation {r.pk}"
    assert fields["TimeLimit"] in ("01:02:00", "01:01:00")  # the reservation's hour and the margin

    # the holder's command attaches to the job and sees the reserved devices (without --pty here)
    attach = subprocess.run(["srun", f"--jobid={job}", "--overlap", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES"],
                            capture_output=True, text=True, timeout=60)
    assert attach.stdout.strip() == "0,1", attach.stderr
    # Slurm itself keeps other jobs off the reserved GPUs
    other = subprocess.run(["sbatch", "--parsable", "--export=NIL", "--gres=gpu:fake:1", "--time=1",
                            "--output=/dev/null", "--wrap", "true"], capture_output=True, text=True, check=True)
    other_job = other.stdout.strip().split(";")[0]
    seen = {squeue("-j", other_job, "-o", "%T|%r")}
    deadline = time.monotonic() + 30
    while "PENDING|Resources" not in seen and time.monotonic() < deadline:  # until the scheduler has looked at it
        time.sleep(0.3)
        seen.add(squeue("-j", other_job, "-o", "%T|%r"))
    assert "PENDING|Resources" in seen and not any(s.startswith("RUNNING") for s in seen), seen
    subprocess.run(["scancel", other_job], check=True)

    # a start retried (a worker killed after sbatch) finds the same job instead of submitting a second
    assert access_for(slurm_pool.reservation_policy).run(r, "start")[0]
    assert squeue("--name=kernelbot reservation " + str(r.pk), "-o", "%i") == job

    with django_capture_on_commit_callbacks(execute=True):
        actions.do_extend(user, r.pk, 30)
    r.refresh_from_db()
    assert job_of(r)["TimeLimit"] in ("01:32:00", "01:33:00")

    with django_capture_on_commit_callbacks(execute=True):  # the end hook cancels the job
        actions.do_cancel(user, r.pk)
    assert wait_gone(job) == "CANCELLED"
    assert not DeviceHold.objects.held().exists()


def test_a_job_slurm_cannot_start_fails_the_reservation_with_slurms_reason(slurm_pool, sync_queue, monkeypatch,
                                                                             django_capture_on_commit_callbacks):
    blocker = subprocess.run(["sbatch", "--parsable", "--export=NIL", "--gres=gpu:fake:2", "--time=5",
                              "--job-name=kernelbot reservation blocker", "--output=/dev/null", "--wrap", "sleep 300"],
                             capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
    try:
        monkeypatch.setattr(SlurmAccess, "START_WAIT_S", 3.0)
        with django_capture_on_commit_callbacks(execute=True):
            r = actions.do_reserve(factories.UserFactory(), ReserveRequest("H100", 1, 30))
        r.refresh_from_db()
        assert r.status == "failed" and "did not start the job holding the GPUs within 3 s: PENDING" in r.failure
        assert squeue("--name=" + SlurmAccess.job_name(r), "-o", "%i") == ""  # its pending job was cancelled
        assert not DeviceHold.objects.held().exists()
    finally:
        subprocess.run(["scancel", blocker], check=True)


def test_an_extension_slurm_refuses_changes_nothing(slurm_pool, sync_queue,
                                                    django_capture_on_commit_callbacks):
    user = factories.UserFactory()
    with django_capture_on_commit_callbacks(execute=True):
        r = actions.do_reserve(user, ReserveRequest("H100", 1, 30))
    r.refresh_from_db()
    limit, job = job_of(r)["TimeLimit"], r.access["slurm_job"]
    Reservation.objects.filter(pk=r.pk).update(access={**r.access, "slurm_job": "999999"})  # a job Slurm lost
    with pytest.raises(Refused) as refused:
        actions.do_extend(user, r.pk, 30)
    assert refused.value.status == 409 and "Slurm refused to extend job" in str(refused.value)
    ends = r.ends_at
    r.refresh_from_db()
    assert r.ends_at == ends and r.minutes == 30
    r.access["slurm_job"] = job
    assert job_of(r)["TimeLimit"] == limit
    with django_capture_on_commit_callbacks(execute=True):
        tasks.finish(r.pk, "ended", "test over")
    assert wait_gone(job) == "CANCELLED"


def test_at_its_end_the_job_and_the_holders_processes_stop(slurm_pool, sync_queue, monkeypatch,
                                                           django_capture_on_commit_callbacks):
    user = factories.UserFactory(username="dev")
    with django_capture_on_commit_callbacks(execute=True):
        r = actions.do_reserve(user, ReserveRequest("h100", 1, 30))
    r.refresh_from_db()
    assert r.status == "active", r.failure
    job = r.access["slurm_job"]
    holder = subprocess.Popen(["srun", f"--jobid={job}", "--overlap", "sleep", "600"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while squeue("-s", "-j", job, "-o", "%i").count("\n") < 1 and time.monotonic() < deadline:
            time.sleep(0.2)  # the holder's step is running in the job
        moment = r.ends_at + timedelta(seconds=1)
        monkeypatch.setattr(timezone, "now", lambda: moment)
        with django_capture_on_commit_callbacks(execute=True):  # what manage.py workers ticks every 2 s
            assert tasks.keep_time() == 1
        r.refresh_from_db()
        assert r.status == "expired" and not DeviceHold.objects.held().exists()
        assert set(r.holds.values_list("ended", flat=True)) == {r.ends_at}
        assert wait_gone(job) == "CANCELLED"
        assert holder.wait(timeout=30) != 0  # the holder's process ended with its job
    finally:
        if holder.poll() is None:
            holder.kill()


def test_the_holders_ssh_key_enters_the_reservations_job_while_it_lasts(slurm_pool, slurm_cluster, sync_queue, tmp_path,
                                                                         django_capture_on_commit_callbacks):
    user = factories.UserFactory(username="dev")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "dev@laptop", "-f", str(tmp_path / "userkey")],
                   check=True)
    keys.do_add_key(user, (tmp_path / "userkey.pub").read_text())
    placed = tmp_path / "home" / ".ssh" / "authorized_keys"  # neither it nor its directory exists yet
    slurm_pool.settings["authorized_keys"] = str(placed)
    slurm_pool.save()
    (tmp_path / "sshd").mkdir()
    with login_node(tmp_path / "sshd", slurm_cluster.env, authorized_keys=(placed,)) as config:
        port = re.search(r"Port (\d+)", config.read_text())[1]
        login = ["ssh", "-F", "/dev/null", "-p", port, "-i", str(tmp_path / "userkey"), "-o", "IdentitiesOnly=yes",
                 "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={tmp_path / 'sshd' / 'known_hosts'}",
                 "-o", "StrictHostKeyChecking=yes", f"{getpass.getuser()}@127.0.0.1", "--", "echo job=$SLURM_JOB_ID"]
        with django_capture_on_commit_callbacks(execute=True):
            r = actions.do_reserve(user, ReserveRequest("h100", 1, 30))
        r.refresh_from_db()
        assert r.status == "active", r.failure
        job = r.access["slurm_job"]
        assert r.access["ssh"] == f"ssh {getpass.getuser()}@{slurm_cluster.node}"
        assert r.access["ssh"] in r.access["note"] and r.access["ssh_keys"] == 1
        deadline = time.monotonic() + 20
        while not placed.exists() and time.monotonic() < deadline:  # the job's script runs once Slurm started it
            time.sleep(0.1)
        assert stat.S_IMODE(placed.stat().st_mode) == 0o600 and stat.S_IMODE(placed.parent.stat().st_mode) == 0o700
        ours = placed.read_text().splitlines()
        assert len(ours) == 1 and ours[0].startswith("restrict,pty,command=") and f"--jobid={job} " in ours[0]
        assert ours[0].endswith(f" kernelbot-reservation-{r.pk}-job-{job}")

        inside = subprocess.run(login, capture_output=True, text=True, timeout=60)
        assert inside.returncode == 0 and inside.stdout.strip() == f"job={job}", inside.stderr
        with placed.open("a") as f:  # another holder's line, added while the reservation lasts, stays
            f.write("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtherOtherOtherOtherOtherOtherOtherOther someone\n")

        with django_capture_on_commit_callbacks(execute=True):
            actions.do_cancel(user, r.pk)
        assert wait_gone(job) == "CANCELLED"
        deadline = time.monotonic() + 20
        while "kernelbot-reservation" in placed.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert placed.read_text().splitlines() == [
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtherOtherOtherOtherOtherOtherOtherOther someone"]
        refused = subprocess.run(login, capture_output=True, text=True, timeout=60)
        assert refused.returncode == 255 and "Permission denied" in refused.stderr, refused.stdout + refused.stderr
