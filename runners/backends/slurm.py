"""Slurm: each attempt is one batch job that runs the remote agent (docs/operations.md "Attaching a Slurm cluster").

The platform is a Slurm submit host (sbatch, squeue, scancel on PATH) or reaches a login node over SSH (the pool's
`ssh` setting; non-interactive key authentication). Every command is an argv list; over SSH it is quoted with
shlex for the remote shell, so no setting or id can inject shell code. The batch script goes to sbatch on stdin,
after one line that writes the attempt's token file (mode 0600, the submitting user's), which the job reads and
removes: the job holds only its own attempt's token (never the runner key), and no secret is on a command line, in
the script, or in `scontrol show job`. The job writes its own exit marker (and the agent's result
file) under the pool's work directory; `poll` reads those first and asks squeue only when there are none. Whatever
ends the job short of SIGKILL (the agent's exit, scancel, the time limit) removes its scratch directory first.
"""

from __future__ import annotations

import getpass
import json
import math
import os
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import ClassVar

from django import forms
from django.core.exceptions import ValidationError

from .base import BackendUnavailable, Dispatch, Poll, PoolOptions, RemoteState, Reporter, RunnerBackend, runner_key

CALL_TIMEOUT_S = 60  # one sbatch/squeue/scancel, SSH included: never hold a worker longer
TIME_MARGIN_S = 180  # on top of the run's budget: queue-to-start, bootstrap, the result post
RESULT_LIMIT = 8 << 20
CONTROL_PERSIST_S = 300
NAME = r"[A-Za-z0-9_][A-Za-z0-9_.\-]*"
PATH = r"~?[A-Za-z0-9_./\-]+"
# the `sh -c` helpers get a path as $1 and expand a leading ~/ (the same on a submit host and over SSH)
HOME = 'p=$1; case $p in "~/"*) p="$HOME/${p#"~/"}";; esac;'
EXTERNAL_ID = re.compile(r"^(\d+):([0-9a-f]{1,32})$")
# what the backend sets itself: an extra argument may not override these. --no-requeue: the platform retries a lost
# attempt itself (elsewhere if it can); a job Slurm requeued would run the stale attempt again later
RESERVED = {"parsable", "export", "export-file", "output", "error", "input", "job-name", "wrap", "chdir", "time",
            "gres", "gpus", "gpus-per-node", "gpus-per-task", "nodes", "ntasks", "partition", "account", "qos",
            "array", "uid", "gid", "get-user-env", "test-only", "open-mode", "requeue", "no-requeue"}

STATES = {
    RemoteState.QUEUED: {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"},
    RemoteState.RUNNING: {"RUNNING", "COMPLETING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "RESIZING", "STOPPED"},
    RemoteState.LOST: {"PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "REVOKED"},
    RemoteState.CANCELLED: {"CANCELLED"},
    RemoteState.FAILED: {"FAILED", "TIMEOUT", "OUT_OF_MEMORY", "DEADLINE", "SPECIAL_EXIT"},
}
AGENT_EXITS = {1: "the agent reported an infrastructure failure",
               2: "the agent could not start (bad usage, or no attempt token)",
               3: "the platform said the attempt was no longer current",
               4: "the attempt's token file is not readable on the node",
               5: "the harness could not be set up on the node"}
# the batch script's marker when its shell was signalled (it stopped the agent and removed its scratch first)
SIGNALLED = {129: "SIGHUP", 130: "SIGINT", 143: "SIGTERM"}


def _path_field(default: str, help_text: str) -> forms.RegexField:
    return forms.RegexField(regex=rf"^{PATH}$", required=False, initial=default, help_text=help_text,
                            error_messages={"invalid": "Letters, digits, _ . / - and a leading ~ only."})


class OptionsField(forms.CharField):
    """Command-line options typed as one string, stored as the list `clean_extra_args` splits them into."""

    def prepare_value(self, value):
        return shlex.join(value) if isinstance(value, list | tuple) else value

    def to_python(self, value):  # the stored list, when the backend re-validates a pool's settings
        return super().to_python(self.prepare_value(value))


class SlurmOptions(PoolOptions):
    partition = forms.RegexField(regex=rf"^{NAME}(,{NAME})*$", required=False,
                                 help_text="sbatch --partition (empty: the cluster's default).")
    account = forms.RegexField(regex=rf"^{NAME}$", required=False, help_text="sbatch --account.")
    qos = forms.RegexField(regex=rf"^{NAME}$", required=False, help_text="sbatch --qos.")
    gres = forms.JSONField(required=False, help_text='GPU type → gres name[:type] for --gres, e.g. {"H100": '
                           '"gpu:h100"}; a type not listed asks for "gpu". The count is the run\'s GPU count.')
    extra_args = OptionsField(required=False, help_text="More sbatch options, e.g. --constraint=a100 "
                                 "--mem=64G (long options only; the ones the platform sets are refused).")
    ssh = forms.RegexField(regex=rf"^{NAME}(@{NAME})?$", required=False,
                           help_text="user@login-node to run the Slurm commands on over SSH (key authentication, "
                                     "~/.ssh/config of the worker's user); empty: this machine is a submit host.")
    ssh_config = _path_field("", "An ssh_config file for that connection (ssh -F; port, identity, known hosts); "
                             "empty: the worker user's ~/.ssh/config.")
    python = _path_field("python3", "Python on the compute nodes (needs torch for GPU problems).")
    checkout = _path_field("", "A kernelbot checkout on the cluster to run the agent from; empty: each job "
                           "downloads the platform's harness (harness.tar.gz) with curl.")
    workdir = _path_field("~/.kernelbot", "Directory on the cluster (shared with the compute nodes) for exit "
                          "markers, results, logs and the jobs' scratch; default ~/.kernelbot.")
    key_file = _path_field("~/.kernelbot/attempt.env", "Where each job's credential goes: the platform writes the "
                           "attempt's token to this path + '.' + the attempt's tag (mode 0600) at dispatch, and the "
                           "job reads and removes it; default ~/.kernelbot/attempt.env.")
    authorized_keys = _path_field("", "Reservations: the file each reservation's job adds its holder's SSH keys to on "
                                  "its nodes for its life, the jobs' user's (e.g. ~/.ssh/authorized_keys, read by the "
                                  "sshd holders reach); empty: no keys are placed. A holder then runs commands as the "
                                  "jobs' user: see docs/operations.md before setting it.")
    ssh_host = forms.RegexField(regex=rf"^{NAME}(@{NAME})?$", required=False,
                                help_text="Reservations: the user@host holders ssh to with their keys (default: the "
                                          "`ssh` login node, else the node as the platform's user).")
    sandbox = forms.ChoiceField(choices=[("require", "require"), ("auto", "auto")], required=False,
                                help_text="KERNELBOT_SANDBOX for the harness on the nodes (default require: a node "
                                          "without a usable bubblewrap fails the run rather than run it unsandboxed).")

    def clean_gres(self):
        gres = self.cleaned_data.get("gres") or {}
        if not isinstance(gres, dict):
            raise ValidationError('A JSON object of GPU type → gres, e.g. {"H100": "gpu:h100"}.')
        for gpu_type, spec in gres.items():
            if not isinstance(spec, str) or not re.fullmatch(rf"{NAME}(:{NAME})?", spec):
                raise ValidationError(f"{gpu_type}: {spec!r} is not a gres name[:type] such as gpu:h100.")
        return gres

    def clean_extra_args(self):
        try:
            args = shlex.split(self.cleaned_data.get("extra_args") or "")
        except ValueError as exc:
            raise ValidationError(f"Cannot split the options: {exc}.") from exc
        for arg in args:
            match = re.fullmatch(r"--([a-z][a-z0-9-]*)(=[^\x00-\x1f]+)?", arg)
            if match is None:
                raise ValidationError(f"{arg!r}: only long options, as --name or --name=value.")
            if match[1] in RESERVED:
                raise ValidationError(f"--{match[1]} is set by the platform.")
        return args


class SlurmBackend(RunnerBackend):
    options: ClassVar[type[forms.Form]] = SlurmOptions

    def __init__(self, pool):
        super().__init__(pool)
        if not self.settings.get("ssh") and not shutil.which("sbatch"):
            raise BackendUnavailable(f"GPU pool '{pool.name}': no sbatch on this machine's PATH and no ssh login "
                                     "node set")

    @classmethod
    def available(cls) -> str | None:
        if shutil.which("sbatch") or shutil.which("ssh"):
            return None
        return "neither sbatch (a Slurm submit host) nor ssh (to reach a login node) is on PATH"

    # --- the contract --------------------------------------------------------------------------------------------

    def dispatch(self, job: Dispatch, reporter: Reporter) -> str:
        tag = job.nonce[:16]
        if not re.fullmatch(r"[0-9a-f]{1,16}", tag):  # it names files in the script: hex only
            raise ValueError(f"the attempt's nonce is not hex: {job.nonce!r}")
        if not runner_key(self.pool) or not re.fullmatch(r"[0-9a-f]{64}", job.token):
            raise RuntimeError(f"no runner key to issue the attempt's token with: set "
                               f"{self.settings.get('runner_key_env') or 'KERNELBOT_RUNNER_KEY'}")
        # one call: the first stdin line writes the attempt's token file, sbatch reads the rest (the batch script)
        refresh = (f'{HOME} umask 077 && mkdir -p "$(dirname "$p")" && IFS= read -r line && '
                   'printf "%s\\n" "$line" > "$p.$$" && mv -f "$p.$$" "$p" && shift && exec "$@"')
        argv = ["sh", "-c", refresh, "kernelbot-sbatch", self.token_file(tag), *self.sbatch_args(job)]
        stdin = f"KERNELBOT_ATTEMPT_TOKEN={job.token}\n{self.batch_script(job, tag)}"
        out = self.call(argv, stdin)
        if out.returncode != 0:
            said = _tail(out.stderr or out.stdout)
            if fix := _fix(said, SBATCH_FIXES):
                raise BackendUnavailable(f"sbatch refused the job: {said}. To fix: {fix}")
            raise RuntimeError(f"sbatch refused the job: {said}")
        job_id = out.stdout.strip().splitlines()[-1].split(";")[0] if out.stdout.strip() else ""
        if not job_id.isdigit():
            raise RuntimeError(f"sbatch answered without a job id: {_tail(out.stdout)}")
        return f"{job_id}:{tag}"

    def poll(self, external_id: str) -> Poll:
        """The exit marker when the job wrote one, else squeue's view: one call (one SSH round trip). A job whose shell
        was signalled (scancel, a failing node, the time limit) is told by Slurm's view while Slurm remembers it."""
        job_id, tag = _parse(external_id)
        squeue = ["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%i|%T|%r"]
        marker, out = self.marker(job_id, tag, squeue)
        if marker is not None and marker.state != RemoteState.CANCELLED:
            return marker
        if marker is not None:
            out = self.call(squeue)
        line = next((ln for ln in out.stdout.splitlines() if ln.split("|")[0] == job_id), "")
        if out.returncode != 0 and not _unknown_job(out.stderr):
            if marker is not None:
                return marker
            raise RuntimeError(f"squeue failed: {_tail(out.stderr)}")  # controller unreachable: not the job's fault
        if not line:  # the marker may have landed since (or NFS lagged): look once more
            return marker or self.marker(job_id, tag)[0] or Poll(RemoteState.LOST, "Slurm no longer knows the job")
        _, state, reason = (line.split("|") + ["", ""])[:3]
        state = state.split()[0].rstrip("+") if state else ""
        if state == "COMPLETED":  # the marker is written before the script exits
            return marker or self.marker(job_id, tag)[0] or Poll(RemoteState.FAILED, "COMPLETED without an exit marker")
        for remote, names in STATES.items():
            if state in names:
                if marker is not None and remote in (RemoteState.QUEUED, RemoteState.RUNNING):
                    return marker  # the job's shell has ended; Slurm has not caught up yet
                if marker is None and remote == RemoteState.FAILED:  # the script may have written it since we looked
                    marker = self.marker(job_id, tag)[0]
                    if marker is not None and marker.state != RemoteState.CANCELLED:
                        return marker  # its own account says why (the agent's exit code), Slurm's only that it failed
                detail = state if reason in ("", "None") else f"{state}: {reason}"
                return Poll(remote, detail)
        return marker or Poll(RemoteState.RUNNING, f"unknown Slurm state {state}")  # the deadline decides

    def cancel(self, external_id: str) -> None:
        job_id, _ = _parse(external_id)
        out = self.call(["scancel", job_id])
        if out.returncode != 0 and not _unknown_job(out.stderr):
            raise RuntimeError(f"scancel failed: {_tail(out.stderr)}")

    # --- helpers -------------------------------------------------------------------------------------------------

    def setting(self, name: str) -> str:
        return self.settings.get(name) or SlurmOptions.base_fields[name].initial or ""

    def token_file(self, tag: str) -> str:
        return f"{self.setting('key_file')}.{tag}"

    def sbatch_args(self, job: Dispatch) -> list[str]:
        limit = math.ceil((job.timeout_s + TIME_MARGIN_S) / 60)
        return ["sbatch", "--parsable", "--export=NIL", f"--job-name={job.label}", "--no-requeue", "--nodes=1",
                "--ntasks=1", f"--time={limit}", "--output=/dev/null", "--error=/dev/null",
                *self.placement_args(job.gpu_type.name, job.gpu_count)]

    def placement_args(self, gpu_type: str, gpu_count: int) -> list[str]:
        """Where a job of this pool goes and what it asks for: partition, account, qos, `gpu_count` GPUs of the
        type's gres (none for 0), then the pool's extra options. Runs and reservations alike."""
        args = [f"--{option}={value}" for option in ("partition", "account", "qos")
                if (value := self.settings.get(option))]
        if gpu_count > 0:
            args.append(f"--gres={(self.settings.get('gres') or {}).get(gpu_type, 'gpu')}:{gpu_count}")
        return [*args, *self.settings.get("extra_args", [])]

    def batch_script(self, job: Dispatch, tag: str) -> str:
        q = shlex.quote
        root = self.setting("checkout")
        fetch = (f'curl -fsS --retry 3 {q(job.platform_url + "/api/runner/v1/harness.tar.gz")} | tar xz -C "$work" '
                 f'|| finish 5\nroot="$work"' if not root else f"root={_sh_path(root)}")
        agent = _sh_path(self.setting("python")) + " " + shlex.join([
            "-m", "runners.harness.agent", "--platform", job.platform_url, "--run", str(job.run_id),
            "--attempt", str(job.attempt)])
        return f"""#!/bin/sh
# {re.sub(r"[^A-Za-z0-9 _.:-]", "_", job.label)}
umask 077
base={_sh_path(self.setting("workdir"))}
jobs="$base/jobs"
mkdir -p "$jobs" || exit 5
out="$jobs/$SLURM_JOB_ID-{tag}"
rm -f "$out.exit" "$out.result.json"
exec >"$out.log" 2>&1
work= agent=
# every end goes through finish: the scratch first, then the exit marker (poll trusts a marker as the end)
finish() {{ trap '' TERM INT HUP; [ -z "$work" ] || rm -rf "$work" || {{ sleep 1; rm -rf "$work"; }}
  echo "$1" > "$out.exit.tmp" && mv -f "$out.exit.tmp" "$out.exit"; exit "$1"; }}
# scancel and the time limit signal this shell (SIGTERM, SIGKILL after KillWait): a shell defers a trap while a
# foreground child runs and dash runs no EXIT trap on a signal, so the agent runs in the background and is waited
# for; the trap stops it and finishes (marker 128 + the signal: `parse_marker` reads it as cancelled)
stop() {{ [ -z "$agent" ] || {{ kill -TERM "$agent" 2>/dev/null; wait "$agent"; }}; finish "$1"; }}
trap 'stop 129' HUP; trap 'stop 130' INT; trap 'stop 143' TERM
find "$jobs" -type f -mtime +7 -delete 2>/dev/null
# scratch that SIGKILLed jobs left behind
find "$base" -maxdepth 1 -type d -name 'attempt-*' -mtime +7 -exec rm -rf {{}} + 2>/dev/null
token={_sh_path(self.token_file(tag))}
[ -r "$token" ] || {{ echo "the attempt's token file $token is not readable"; finish 4; }}
set -a; . "$token"; set +a
rm -f "$token"
export KERNELBOT_SANDBOX={q(self.settings.get("sandbox") or "require")}
work=$(mktemp -d "$base/attempt-XXXXXXXX") || finish 5
{fetch}
cd "$root" || finish 5
{agent} --workdir "$work" --result-file "$out.result.json" &
agent=$!
wait "$agent"
code=$?; agent=
finish "$code"
"""

    def marker(self, job_id: str, tag: str, otherwise: list[str] | None = None
               ) -> tuple[Poll | None, subprocess.CompletedProcess]:
        """The job's own account of how it ended (None while it has not), and the output of `otherwise`, run in the
        same call when there is no marker."""
        script = (f'{HOME} if [ -f "$p.exit" ]; then echo @kernelbot:M; head -c 16 "$p.exit"; echo; '
                  f'[ -f "$p.result.json" ] && head -c {RESULT_LIMIT} "$p.result.json"; exit 0; fi; '
                  'echo @kernelbot:Q; shift; [ $# -eq 0 ] || exec "$@"')
        out = self.call(["sh", "-c", script, "kernelbot-poll", f"{self.setting('workdir')}/jobs/{job_id}-{tag}",
                         *(otherwise or [])])
        # a login shell may print before our command does: read after our own first line
        _, found, rest = f"\n{out.stdout}".partition("\n@kernelbot:")
        kind, _, rest = rest.partition("\n")
        if not found or kind not in ("M", "Q"):
            raise RuntimeError(f"reading the exit marker failed: {_tail(out.stderr or out.stdout)}")
        if kind == "Q":
            return None, subprocess.CompletedProcess(out.args, out.returncode, rest, out.stderr)
        return self.parse_marker(rest), out

    @staticmethod
    def parse_marker(text: str) -> Poll:
        code_text, _, result_text = text.partition("\n")
        try:
            code = int(code_text.strip())
        except ValueError:
            return Poll(RemoteState.FAILED, f"unreadable exit marker {code_text[:16]!r}")
        result = None
        if result_text.strip():
            try:
                result = json.loads(result_text)
            except ValueError:
                result = None
        if code == 0:
            return Poll(RemoteState.FINISHED, "agent exit code 0", result if isinstance(result, dict) else None)
        if code in SIGNALLED:  # scancel, or Slurm's time limit (which the platform's own deadline comes before)
            return Poll(RemoteState.CANCELLED, f"the job was stopped by {SIGNALLED[code]} (scancel, or its time "
                        "limit)")
        reason = AGENT_EXITS.get(code, "the job failed")
        return Poll(RemoteState.FAILED, f"agent exit code {code}: {reason}")

    def call(self, argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
        """Run argv here, or on the login node over SSH (quoted for its shell: nothing in it is shell code)."""
        if ssh := self.settings.get("ssh"):
            config = ["-F", os.path.expanduser(self.settings["ssh_config"])] if self.settings.get("ssh_config") else []
            argv = ["ssh", *config, "-o", "BatchMode=yes", "-o", "ConnectTimeout=15", *_shared_connection(), "-T",
                    ssh, "--", shlex.join(argv)]
        try:
            out = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=CALL_TIMEOUT_S,
                                 stdin=None if stdin is not None else subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"{argv[0]} did not answer within {CALL_TIMEOUT_S} s") from exc
        if ssh and out.returncode == 255:  # ssh's own failure, not the command's
            said = _tail(out.stderr)
            if fix := _fix(said, SSH_FIXES):
                raise BackendUnavailable(f"ssh to {ssh} failed: {said}. To fix: {fix}")
            raise RuntimeError(f"ssh to {ssh} failed: {said}")  # unreachable for now: the next try may get through
        return out


def _shared_connection() -> list[str]:
    """One SSH connection per login node, kept CONTROL_PERSIST_S after its last use and shared by this machine's
    workers (a fresh connection costs a key exchange per call), in a directory only this user can enter."""
    directory = Path(tempfile.gettempdir()) / f"kernelbot-ssh-{os.getuid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    if directory.owner() != getpass.getuser() or stat.S_IMODE(directory.stat().st_mode) != 0o700:
        return []  # not ours: no sharing rather than a socket someone else could have placed
    return ["-o", "ControlMaster=auto", "-o", f"ControlPath={directory}/%C", "-o",
            f"ControlPersist={CONTROL_PERSIST_S}"]


def _parse(external_id: str) -> tuple[str, str]:
    match = EXTERNAL_ID.match(external_id or "")
    if match is None:
        raise ValueError(f"not a Slurm job of this backend: {external_id!r}")
    return match[1], match[2]


def _sh_path(path: str) -> str:
    """A path for the batch script: quoted, with a leading ~/ as "$HOME"/."""
    if path == "~" or path.startswith("~/"):
        return '"$HOME"' + (shlex.quote(path[1:]) if len(path) > 1 else "")
    return shlex.quote(path)


# What sbatch or ssh say when the pool's configuration is wrong, and what to fix: the pool's failure (it fails until
# a health check passes), never retried as the run's bad luck.
SBATCH_FIXES = (
    ("Could not establish a configuration source",
     "sbatch on the workers' machine finds no Slurm configuration: give the workers SLURM_CONF (the cluster's "
     "slurm.conf) and the cluster's munge key, or set the pool's ssh to a login node"),
    ("Invalid partition name", "set the pool's partition to one the cluster has (`sinfo -s`)"),
    ("Invalid account", "set the pool's account (and partition) to ones the cluster lets its Slurm user use"),
    ("Invalid qos", "set the pool's qos to one the cluster has (`sacctmgr show qos`)"),
    ("Invalid generic resource", "set the pool's gres to the cluster's names (`sinfo -o %G`)"),
    ("Invalid feature specification", "fix the pool's extra args (--constraint names a feature no node has)"),
    ("command not found", "install the Slurm client on the login node, on the login user's PATH"),
    ("Munge encode failed", "start munged with the cluster's key on the machine that runs sbatch"),
)
SSH_FIXES = (
    ("Could not resolve hostname", "set the pool's ssh to user@host of a login node the workers' machine can "
                                   "resolve (or a Host entry of the pool's ssh config)"),
    ("Permission denied", "give the workers' user a key the login node accepts without a passphrase (BatchMode)"),
    ("Host key verification failed", "add the login node's host key to the workers' user's known_hosts"),
    ("Bad configuration option", "fix the pool's ssh config file"),
    ("Can't open user config file", "set the pool's ssh config to a file the workers' user can read"),
)


def _fix(said: str, fixes: tuple[tuple[str, str], ...]) -> str:
    return next((fix for marker, fix in fixes if marker in said), "")


def _unknown_job(stderr: str) -> bool:
    return "Invalid job id" in stderr


def _tail(text: str, limit: int = 500) -> str:
    text = (text or "").strip()
    return text[-limit:] or "no output"
