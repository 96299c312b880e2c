"""A real single-node Slurm cluster in one directory, for the tests and for operators trying the Slurm backend.

    python -m tests.slurm.cluster up [--dir DIR]     # start it; prints the `export SLURM_CONF=...` to use
    python -m tests.slurm.cluster down [--dir DIR]   # stop it (also cleans up after a crashed run)

munged, slurmctld and slurmd run as child processes in the foreground (no systemd), with their own munge key and
socket, configuration, state and logs under DIR: nothing in /etc is used or changed. The node is `hostname -s` with
all its CPUs and `gpus` fake GPUs (gres `gpu:<gpu_type>` over placeholder files, so Slurm hands each job its
CUDA_VISIBLE_DEVICES as on a real GPU node). Needs root (or the user the daemons should run as) and Debian's
`slurm-wlm` and `munge`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_DIR = Path(tempfile.gettempdir()) / f"kernelbot-slurm-{os.getuid()}"
DAEMONS = ("munged", "slurmctld", "slurmd")


class ClusterError(RuntimeError):
    pass


class SlurmCluster:
    def __init__(self, root: Path = DEFAULT_DIR, *, gpus: int = 2, gpu_type: str = "fake",
                 ctld_port: int = 6817, slurmd_port: int = 6818, partition: str = "debug"):
        self.root = Path(root).resolve()
        self.gpus, self.gpu_type, self.partition = gpus, gpu_type, partition
        self.ctld_port, self.slurmd_port = ctld_port, slurmd_port
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.procs: dict[str, subprocess.Popen] = {}

    @property
    def env(self) -> dict[str, str]:
        """What a client (sbatch, squeue, the Slurm backend) needs in its environment to use this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def write_config(self) -> None:
        user = os.environ.get("USER") or subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
        for sub in ("munge", "state", "spool", "log", "gpus"):
            (self.root / sub).mkdir(parents=True, exist_ok=True, mode=0o755)
        devices = [self.root / "gpus" / f"fakegpu{i}" for i in range(self.gpus)]
        for device in devices:  # Slurm wants character devices: placeholders that are /dev/null underneath
            if not device.is_symlink():
                device.unlink(missing_ok=True)
                device.symlink_to("/dev/null")
        key = self.root / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        cpus = os.cpu_count() or 1
        self.conf.write_text(f"""\
ClusterName=kernelbot
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={self.ctld_port}
SlurmdPort={self.slurmd_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc={self.root / "log" / "jobcomp.txt"}
GresTypes=gpu
StateSaveLocation={self.root / "state"}
SlurmdSpoolDir={self.root / "spool"}
SlurmctldPidFile={self.root / "slurmctld.pid"}
SlurmdPidFile={self.root / "slurmd.pid"}
SlurmctldLogFile={self.root / "log" / "slurmctld.log"}
SlurmdLogFile={self.root / "log" / "slurmd.log"}
SlurmctldDebug=info
SlurmdDebug=info
MinJobAge=300
KillWait=5
InactiveLimit=0
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} Gres=gpu:{self.gpu_type}:{self.gpus} State=UNKNOWN
PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""")
        files = f"{self.root / 'gpus'}/fakegpu[0-{self.gpus - 1}]" if self.gpus > 1 else str(devices[0])
        (self.root / "gres.conf").write_text(f"AutoDetect=off\nName=gpu Type={self.gpu_type} File={files}\n")
        (self.root / "cgroup.conf").write_text("CgroupAutomount=no\nConstrainDevices=no\nConstrainCores=no\n")

    def ours(self) -> list[int]:
        """Daemons started for this directory, by their command line (a previous run that crashed included)."""
        marks = (str(self.conf), str(self.munge_socket))
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and Path(argv[0].decode(errors="replace")).name in DAEMONS \
                    and any(mark.encode() in arg for arg in argv for mark in marks):
                pids.append(int(entry.name))
        return pids

    def kill_leftovers(self, timeout: float = 10) -> None:
        pids = self.ours()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + timeout
            while pids and time.monotonic() < deadline:
                pids = [pid for pid in pids if Path(f"/proc/{pid}").exists() and not _zombie(pid)]
                time.sleep(0.05)
            if not pids:
                return
        raise ClusterError(f"could not stop the previous cluster's daemons: {pids}")

    def start(self, timeout: float = 60) -> SlurmCluster:
        missing = [name for name in ("munged", "slurmctld", "slurmd", "sbatch", "scontrol")
                   if not shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")]
        if missing:
            raise ClusterError(f"missing {', '.join(missing)}: apt-get install slurm-wlm munge")
        self.kill_leftovers()
        for stale in ("state", "spool"):  # a fresh cluster: no jobs or node state from a crashed run
            shutil.rmtree(self.root / stale, ignore_errors=True)
        for pid_file in ("slurmctld.pid", "slurmd.pid", "munge/munged.pid"):
            (self.root / pid_file).unlink(missing_ok=True)
        self.munge_socket.unlink(missing_ok=True)
        for port in (self.ctld_port, self.slurmd_port):
            if not _port_free(port):
                raise ClusterError(f"port {port} is in use by a process that is not this cluster's "
                                   f"(started with {self.conf}); stop it or pick other ports")
        self.write_config()
        try:
            munge = self.root / "munge"
            self._spawn("munged", [_sbin("munged"), "-F", "--force", f"--socket={self.munge_socket}",
                                   f"--key-file={munge / 'munge.key'}", f"--pid-file={munge / 'munged.pid'}",
                                   f"--log-file={self.root / 'log' / 'munged.log'}",
                                   f"--seed-file={munge / 'munged.seed'}"])
            self._wait(lambda: self.munge_socket.exists(), timeout, "munged to open its socket")
            self._spawn("slurmctld", [_sbin("slurmctld"), "-D", "-i", "-f", str(self.conf)])
            self._wait(lambda: self.scontrol("ping").returncode == 0 and "UP" in self.scontrol("ping").stdout,
                       timeout, "slurmctld to answer")
            self._spawn("slurmd", [_sbin("slurmd"), "-D", "-f", str(self.conf), "-N", self.node])
            self._wait(self.node_idle, timeout, f"node {self.node} to become idle")
        except BaseException:
            self.stop()
            raise
        return self

    def node_idle(self) -> bool:
        out = self.scontrol("show", "node", self.node, "-o").stdout
        state = next((part.split("=", 1)[1] for part in out.split() if part.startswith("State=")), "")
        if state.startswith(("DOWN", "DRAIN")) and "NOT_RESPONDING" not in state:
            self.scontrol("update", f"NodeName={self.node}", "State=RESUME")
        return state.split("+")[0] == "IDLE"

    def scontrol(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=30,
                              env={**os.environ, **self.env})

    def stop(self, timeout: float = 15) -> None:
        for name in reversed(DAEMONS):
            proc = self.procs.pop(name, None)
            if proc is None:
                continue
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            proc.log.close()
        self.kill_leftovers()  # started by an earlier `up` in another process

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")  # noqa: SIM115 - the daemon's lifetime
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        proc.log = log
        self.procs[name] = proc

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise ClusterError(f"{name} exited with {proc.returncode} while waiting for {what}:\n"
                                       f"{self.logs(name)}")
            if ready():
                return
            time.sleep(0.1)
        raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}:\n"
                           + "\n".join(self.logs(name) for name in self.procs))

    def logs(self, name: str, limit: int = 3000) -> str:
        text = ""
        for path in (self.root / "log" / f"{name}.out", self.root / "log" / f"{name}.log"):
            if path.exists():
                text += path.read_text(errors="replace")
        return f"--- {name}\n{text[-limit:]}"


def _sbin(name: str) -> str:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") or name


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.slurm.cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--gpu-type", default="fake")
    args = parser.parse_args(argv)
    cluster = SlurmCluster(args.dir, gpus=args.gpus, gpu_type=args.gpu_type)
    if args.action == "down":
        cluster.kill_leftovers()
        print(f"stopped the cluster in {cluster.root}")
        return 0
    cluster.start()
    for proc in cluster.procs.values():  # the daemons outlive this command; `down` stops them
        proc.log.close()
    print(f"cluster up: node {cluster.node}, partition {cluster.partition}, gres gpu:{cluster.gpu_type}:{cluster.gpus}")
    print(f"export SLURM_CONF={cluster.conf}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
