"""How a holder reaches reserved devices, per pool backend. Non-Slurm pools: the pool's access note and optional
start/end hook commands (details as JSON on stdin and KB_RESERVATION_* variables). A Slurm pool will hold the GPUs
with a Slurm job instead: add a `SlurmAccess` here (start: `sbatch --wrap 'sleep …' --gres=gpu:N`, describe:
`srun --jobid … --pty bash`, end: `scancel`) and map it in `ACCESS`."""

from __future__ import annotations

import json
import os
import shlex
import subprocess

from .models import PoolPolicy, Reservation


def details(r: Reservation) -> dict:
    return {"id": r.pk, "user": r.user.get_username(), "email": r.user.email, "project": r.project,
            "pool": r.pool.name, "gpu_type": r.gpu_type.name, "hostname": r.node.hostname if r.node else "",
            "gpus": [g.index for g in r.gpus()] if r.node else [], "status": r.status,
            "started_at": r.started_at.isoformat() if r.started_at else None,
            "ends_at": r.ends_at.isoformat() if r.ends_at else None}


class HookAccess:
    def __init__(self, policy: PoolPolicy):
        self.policy = policy

    def describe(self, r: Reservation) -> dict:
        info = details(r)
        values = {**info, "gpus": ",".join(map(str, info["gpus"]))}
        try:
            text = self.policy.access_note.format(**values)
        except (KeyError, IndexError, ValueError):
            text = self.policy.access_note
        return {"note": text, "hostname": info["hostname"], "gpus": info["gpus"]}

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


ACCESS = {}  # backend name → access class; Slurm's goes here when its backend lands


def access_for(policy: PoolPolicy) -> HookAccess:
    return ACCESS.get(policy.pool.backend, HookAccess)(policy)
