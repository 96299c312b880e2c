"""How a holder reaches reserved devices, per pool backend. Every pool: its access note and optional start/end hook
commands (details as JSON on stdin and KB_RESERVATION_* variables). A Slurm pool also holds the GPUs with a Slurm
job for the reservation's time (`SlurmAccess`), so Slurm itself keeps other jobs off them, and that job places the
holder's SSH keys on its nodes for its life (`keys_script`)."""

from __future__ import annotations

import getpass
import json
import math
import os
import shlex
import subprocess
import time
from datetime import datetime
from functools import cached_property

from django.utils import timezone

from runners.backends.slurm import SlurmBackend, _sh_path, _tail
from runners.models import GpuVendor

from . import keys
from .models import PoolPolicy, Reservation, ReservationStatus

# what a key placed for a reservation lets its holder do: enter the reservation's job (a command given to ssh, or an
# interactive login shell), nothing else (restrict: no forwarding of ports, agents or X11); @JOB@ is $SLURM_JOB_ID
KEY_OPTIONS = ('restrict,pty,command="if [ -n \\"$SSH_ORIGINAL_COMMAND\\" ]; then exec srun --jobid=@JOB@ --overlap '
               'bash -c \\"$SSH_ORIGINAL_COMMAND\\"; else exec srun --jobid=@JOB@ --overlap --pty bash -l; fi"')


def keys_script(r: Reservation, lines: list[str], path: str) -> str:
    """The batch script of a reservation's job when its holder has SSH keys: on each node it adds them to `path`
    (created 0600, its directory 0700, when missing), each line tagged with the reservation and the job, sleeps, and
    whatever ends the job short of SIGKILL (scancel, the time limit) removes exactly those lines again. Edits take a
    lock beside the file and replace it whole, so a concurrent job's edit or sshd's read never sees half of one.
    `lines` are `SshKey.key` values: a known type and base64 (`keys.parse_key`), nothing a shell or sshd reads."""
    tag = f"kernelbot-reservation-{r.pk}-job-"
    block = "".join(f"{KEY_OPTIONS} {line} {tag}@JOB@\n" for line in lines)
    place = f"""\
umask 077
HOME=${{HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}}
f={_sh_path(path)}
tag=" {tag}$SLURM_JOB_ID"
mkdir -p "$(dirname "$f")"
edit() {{  # drop this job's lines, add stdin's
  (flock -w 60 9 || exit 1; t="$f.kernelbot.$$"
   {{ grep -v -- "$tag\\$" "$f" 2>/dev/null; cat; }} >"$t" && mv -f "$t" "$f") 9>>"$f.lock"
}}
trap 'kill "$s" 2>/dev/null; exit 0' TERM INT HUP
trap 'edit </dev/null' EXIT
sed "s/@JOB@/$SLURM_JOB_ID/g" <<'KERNELBOT_KEYS' | edit
{block}KERNELBOT_KEYS
sleep infinity &
s=$!
wait
"""
    if r.node_count == 1:
        return f"#!/bin/sh\n# kernelbot reservation {r.pk}: the holder's SSH keys on its node while it lasts\n{place}"
    return (f"#!/bin/sh\n# kernelbot reservation {r.pk}: the holder's SSH keys on its nodes while it lasts\n"
            f"exec srun --overlap --ntasks-per-node=1 --nodes={r.node_count} /bin/sh -c {shlex.quote(place)}\n")


def details(r: Reservation) -> dict:
    return {"id": r.pk, "user": r.user.get_username(), "email": r.user.email, "project": r.project,
            "pool": r.pool.name, "gpu_type": r.gpu_type.name, "hostname": r.node.hostname if r.node else "",
            "hostnames": r.hostnames(), "nodes": r.node_count,
            "gpus": [g.index for g in r.gpus()] if r.node else [], "status": r.status,
            "started_at": r.started_at.isoformat() if r.started_at else None,
            "ends_at": r.ends_at.isoformat() if r.ends_at else None}


class HookAccess:
    def __init__(self, policy: PoolPolicy):
        self.policy = policy

    def describe(self, r: Reservation) -> dict:
        info = details(r)
        values = {**info, "gpus": ",".join(map(str, info["gpus"])), "hostnames": ",".join(info["hostnames"])}
        try:
            text = self.policy.access_note.format(**values)
        except (KeyError, IndexError, ValueError):
            text = self.policy.access_note
        return {"note": text, "hostname": info["hostname"], "hostnames": info["hostnames"], "gpus": info["gpus"]}

    def run(self, r: Reservation, phase: str) -> tuple[bool, str]:
        """Run the phase's hook; (ok, output tail). No hook configured: ok."""
        command = self.policy.start_hook if phase == "start" else self.policy.end_hook
        if not command:
            return True, ""
        info = {**details(r), "phase": phase}
        env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8",
               **{f"KB_RESERVATION_{k.upper()}": ",".join(map(str, v)) if isinstance(v, list) else str(v or "")
                  for k, v in info.items()}}
        try:
            done = subprocess.run(shlex.split(command), input=json.dumps(info), env=env, capture_output=True,
                                  text=True, timeout=self.policy.hook_timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, f"{phase} hook could not run: {exc}"
        tail = (done.stdout + done.stderr)[-2000:]
        return done.returncode == 0, tail if done.returncode == 0 else f"{phase} hook exited {done.returncode}: {tail}"


    def extend(self, r: Reservation) -> tuple[bool, str]:
        """Make the access last until the reservation's (new) `ends_at`; (ok, why not)."""
        return True, ""


class SlurmAccess(HookAccess):
    """The reservation is a Slurm job that holds its GPUs on its node (the pool's node names are Slurm's) until it
    ends: start submits it and waits until it runs (a cluster that cannot start it within START_WAIT_S fails the
    reservation with Slurm's reason), the holder attaches with `srun --jobid=… --overlap --pty bash`, extend raises
    its time limit (the platform's Slurm user must be an operator for that), end cancels it. The job is found by its
    name, so a start retried after a crash reuses it and an end cancels whatever was submitted."""

    START_WAIT_S = 30.0
    MARGIN_MIN = 2  # the job outlives the reservation's end by this much; the platform's expiry cancels it

    @cached_property
    def backend(self) -> SlurmBackend:  # only when Slurm is called: describing needs no sbatch here
        return SlurmBackend(self.policy.pool)

    @staticmethod
    def job_name(r: Reservation) -> str:
        return f"kernelbot reservation {r.pk}"

    def ssh_host(self, r: Reservation) -> str:
        """Where the holder logs in with their keys: the pool's `ssh_host`, else its login node (`ssh`), else the
        node as the platform's user (the jobs' user, whose authorized_keys gets the keys)."""
        settings = self.policy.pool.settings or {}
        return settings.get("ssh_host") or settings.get("ssh") or f"{getpass.getuser()}@{r.hostnames()[0]}"

    def describe(self, r: Reservation) -> dict:
        info = super().describe(r)
        if job := (r.access or {}).get("slurm_job"):
            command = f"srun --jobid={job} --overlap --pty bash"
            info.update(slurm_job=job, command=command, note=f"{info['note']}\n{command}".strip())
            if r.access.get("ssh_keys"):
                ssh = f"ssh {self.ssh_host(r)}"
                info.update(ssh=ssh, ssh_keys=r.access["ssh_keys"],
                            note=f"{info['note']}\nor with your SSH key ({r.access['ssh_keys']} placed): {ssh}")
        return info

    def run(self, r: Reservation, phase: str) -> tuple[bool, str]:
        ok, said = self.hold(r) if phase == "start" else self.release(r)
        if not ok:
            return False, said
        ok, hook = super().run(r, phase)
        return ok, "\n".join(filter(None, [said, hook]))

    def hold(self, r: Reservation) -> tuple[bool, str]:
        job, state, reason = self.find(r)
        path = (self.policy.pool.settings or {}).get("authorized_keys") or ""  # empty: the operator did not opt in
        lines = keys.snapshot(r.user) if path else []  # the keys as they are now, for the reservation's life
        if not job:
            gpus = r.gpu_count if r.gpu_type.vendor != GpuVendor.CPU else 0
            out = self.backend.call([
                "sbatch", "--parsable", "--export=NIL", f"--job-name={self.job_name(r)}", "--no-requeue",
                f"--nodes={r.node_count}", f"--ntasks={r.node_count}", "--ntasks-per-node=1",
                f"--nodelist={','.join(r.hostnames())}", f"--time={self.limit(r.ends_at)}",
                "--output=/dev/null", "--error=/dev/null", *self.backend.placement_args(r.gpu_type.name, gpus),
                *([] if lines else ["--wrap", "sleep infinity"])], stdin=keys_script(r, lines, path) if lines else None)
            if out.returncode != 0:
                return False, f"sbatch refused the job holding the GPUs: {_tail(out.stderr or out.stdout)}"
        deadline = time.monotonic() + self.START_WAIT_S
        while state != "RUNNING":
            if time.monotonic() > deadline or state in ("CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "COMPLETED"):
                self.release(r)
                return False, (f"Slurm did not start the job holding the GPUs within {self.START_WAIT_S:.0f} s: "
                               f"{state or 'gone'}" + (f" ({reason})" if reason not in ("", "None") else ""))
            time.sleep(0.5)
            job, state, reason = self.find(r)
        if not Reservation.objects.filter(pk=r.pk, status=ReservationStatus.ACTIVE).exists():
            self.release(r)  # ended while its job was starting
            return False, "the reservation ended while its Slurm job started"
        r.access = {**(r.access or {}), "slurm_job": job, "ssh_keys": len(lines)}
        r.access = self.describe(r)
        Reservation.objects.filter(pk=r.pk).update(access=r.access)
        return True, f"Slurm job {job} holds the GPUs"

    def release(self, r: Reservation) -> tuple[bool, str]:
        out = self.backend.call(["scancel", f"--name={self.job_name(r)}"])
        if out.returncode != 0:
            return False, f"scancel failed: {_tail(out.stderr)}"
        return True, ""

    def extend(self, r: Reservation) -> tuple[bool, str]:
        job = (r.access or {}).get("slurm_job")
        if not job:
            return True, ""
        out = self.backend.call(["scontrol", "update", f"JobId={job}",
                                 f"TimeLimit={self.limit(r.ends_at, since=r.started_at)}"])
        if out.returncode != 0:
            return False, f"Slurm refused to extend job {job}: {_tail(out.stderr or out.stdout)}"
        return True, ""

    def find(self, r: Reservation) -> tuple[str, str, str]:
        """(job id, state, reason) of the reservation's live job, or empty strings."""
        out = self.backend.call(["squeue", "-h", f"--name={self.job_name(r)}", "-o", "%i|%T|%r"])
        if out.returncode != 0:
            raise RuntimeError(f"squeue failed: {_tail(out.stderr)}")
        line = out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""
        job, state, reason = (line.split("|") + ["", ""])[:3]
        return job, state, reason

    def limit(self, ends_at: datetime, since: datetime | None = None) -> int:
        """Minutes from `since` (default now) to `ends_at`, plus the margin."""
        return math.ceil(((ends_at - (since or timezone.now())).total_seconds()) / 60) + self.MARGIN_MIN


ACCESS = {"slurm": SlurmAccess}  # backend name → access class; others: HookAccess


def access_for(policy: PoolPolicy) -> HookAccess:
    return ACCESS.get(policy.pool.backend, HookAccess)(policy)
