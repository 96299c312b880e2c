"""A real OpenSSH server on a loopback port standing for a Slurm cluster's login node (Debian `openssh-server`), with
the cluster configured for its sessions. `login_node` yields an ssh_config whose host `kernelbot-login` reaches it
with a key of its own; the user's ~/.ssh is neither used nor changed."""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from runners.backends.slurm import _shared_connection  # Django must be set up (pytest-django, bench/slurm.py)


class LoginNodeError(RuntimeError):
    pass


@contextlib.contextmanager
def login_node(root: Path, env: dict[str, str], timeout: float = 30,
               authorized_keys: tuple[Path, ...] = ()) -> Iterator[Path]:
    """`authorized_keys`: more files sshd reads keys from, after the client key's own."""
    sshd = shutil.which("sshd", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if sshd is None or shutil.which("ssh") is None:
        raise LoginNodeError("no sshd/ssh (apt-get install openssh-server openssh-client)")
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / name)], check=True)
    shutil.copy(root / "client_key.pub", root / "authorized_keys")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (root / "sshd_config").write_text(f"""\
ListenAddress 127.0.0.1
Port {port}
HostKey {root / "host_key"}
PidFile {root / "sshd.pid"}
AuthorizedKeysFile {" ".join(str(p) for p in (root / "authorized_keys", *authorized_keys))}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
""" + (f"SetEnv {' '.join(f'{k}={v}' for k, v in env.items())}\n" if env else ""))
    host_key = (root / "host_key.pub").read_text().split()
    (root / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key[0]} {host_key[1]}\n")
    config = root / "ssh_config"
    config.write_text(f"""\
Host kernelbot-login
  HostName 127.0.0.1
  Port {port}
  User {getpass.getuser()}
  IdentityFile {root / "client_key"}
  IdentitiesOnly yes
  UserKnownHostsFile {root / "known_hosts"}
  StrictHostKeyChecking yes
""")
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    with open(root / "sshd.log", "wb") as log:
        proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(root / "sshd_config")], stdout=subprocess.DEVNULL,
                                stderr=log)
    try:
        deadline = time.monotonic() + timeout
        while True:
            check = subprocess.run(["ssh", "-F", str(config), "-o", "BatchMode=yes", "kernelbot-login", "--", "true"],
                                   capture_output=True, text=True)
            if check.returncode == 0:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise LoginNodeError(f"sshd did not start: {check.stderr}\n{(root / 'sshd.log').read_text()}")
            time.sleep(0.2)
        yield config
    finally:
        # the Slurm backend's shared connection (ControlPersist) would keep a session open after the server is gone
        subprocess.run(["ssh", "-F", str(config), *_shared_connection(), "-O", "exit", "kernelbot-login"],
                       capture_output=True)
        proc.terminate()
        proc.wait(10)
