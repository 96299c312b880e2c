"""Real processes against runners.harness.sandbox: each test asserts a protection that could fail."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from runners.harness import cgroups, contract
from runners.harness import sandbox as sb
from runners.harness.sandbox import Limits, Sandbox, SandboxUnavailable
from tests.conftest import IN_CI, missing_tool

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable


needs_bwrap = pytest.mark.skipif(bool(missing_tool("bwrap")) and not IN_CI,
                                 reason=f"bwrap {missing_tool('bwrap')}; it is required under CI=true")
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="uid drop needs root")


def _cgroup_error() -> str:
    try:
        cgroups.memory_parent()
    except cgroups.CgroupUnavailable as e:
        return str(e)
    return ""


needs_cgroup = pytest.mark.skipif(
    bool(_cgroup_error()) and os.environ.get("CI") != "true",
    reason=f"no usable memory cgroup here: {_cgroup_error()} (fails under CI=true)",
)


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """A fake project tree: <repo>/var/kernelbot.sqlite3, settings, and two run dirs."""
    (tmp_path / "kernelbot").mkdir()
    (tmp_path / "kernelbot" / "settings.py").write_text("SECRET_KEY = 'hunter2'\n")
    (tmp_path / "var" / "runs" / "run1").mkdir(parents=True)
    (tmp_path / "var" / "runs" / "run2").mkdir()
    (tmp_path / "var" / "runs" / "run2" / "secret.txt").write_text("other run's secret")
    (tmp_path / "var" / "kernelbot.sqlite3").write_text("database")
    for p in tmp_path.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)  # world-readable on the host: only the sandbox hides them
    tmp_path.chmod(0o755)
    return tmp_path


def run(workdir: Path, code: str, limits: Limits | None = None, **kw) -> sb.Outcome:
    box = Sandbox(str(workdir), limits or Limits(wall_seconds=30), **{k: kw.pop(k) for k in ("devices",) if k in kw})
    return box.start([PY, "-c", textwrap.dedent(code)], **kw).wait()


@needs_bwrap
def test_describe_reports_bubblewrap():
    d = sb.describe()
    assert d["backend"] == "bubblewrap" and d["network"] == "isolated" and d["pid_namespace"] is True
    assert d["uid"] == (sb.NOBODY if os.geteuid() == 0 else os.getuid())
    assert {"cpu", "as", "nproc", "fsize", "nofile", "core"} <= set(d["rlimits"])
    if not _cgroup_error():
        assert d["memory"]["cgroup"] in ("v1", "v2")
        assert d["memory"]["tree_limit_bytes"] == sb.tree_memory_limit(Limits())


@needs_bwrap
def test_filesystem_hidden_and_workdir_writable(runs: Path):
    wd = runs / "var" / "runs" / "run1"
    (wd / "input.txt").write_text("mine")
    probe = f"""
        import os
        def readable(p):
            try:
                open(p).read(); return True
            except OSError:
                return False
        for p in [{str(runs / "var" / "kernelbot.sqlite3")!r}, {str(runs / "var" / "runs" / "run2" / "secret.txt")!r},
                  {str(runs / "kernelbot" / "settings.py")!r}, {str(REPO / "pyproject.toml")!r},
                  os.path.expanduser("~root/.bash_history"), "/etc/shadow", "/etc/hostname"]:
            print("READ", p, readable(p))
        print("LS", sorted(os.listdir({str(runs / "var" / "runs")!r})))
        print("MINE", open("input.txt").read())
        open("out.txt", "w").write("ok")
        try:
            open("/usr/evil", "w")
            print("USR writable")
        except OSError:
            pass
    """
    o = run(wd, probe)
    assert o.returncode == 0, o.stderr
    assert "READ" in o.stdout and " True" not in o.stdout, o.stdout
    assert "LS ['run1']" in o.stdout and "MINE mine" in o.stdout and "USR writable" not in o.stdout
    assert (wd / "out.txt").read_text() == "ok"


@needs_bwrap
def test_network_isolated(tmp_path: Path):
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        socket.create_connection(("127.0.0.1", port), timeout=2).close()  # reachable from the host
        o = run(
            tmp_path,
            f"""
            import socket
            for host, port in [("127.0.0.1", {port}), ("127.0.0.1", 5432), ("127.0.0.1", 6379), ("10.0.0.1", 80),
                               ("1.1.1.1", 443)]:
                try:
                    socket.create_connection((host, port), timeout=2).close()
                    print("CONNECTED", host, port)
                except OSError as e:
                    print("refused", host, port, type(e).__name__)
            print(sorted(name for _, name in socket.if_nameindex()))
        """,
        )
    assert o.returncode == 0, o.stderr
    assert "CONNECTED" not in o.stdout and o.stdout.count("refused") == 5
    assert "['lo']" in o.stdout


@needs_bwrap
def test_env_and_host_processes_hidden(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("KERNELBOT_SECRET_TOKEN", "s3cr3t")
    o = run(
        tmp_path,
        """
        import os
        print("ENV", sorted(os.environ))
        seen = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                seen.append(open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\\0", b" ").decode())
            except OSError:
                pass
            try:
                print("ENVIRON", pid, open(f"/proc/{pid}/environ", "rb").read())
            except OSError:
                pass
        print("PROCS", len(seen), seen)
    """,
        env={"GIVEN": "1"},
    )
    assert o.returncode == 0, o.stderr
    assert "s3cr3t" not in o.stdout and "KERNELBOT_SECRET_TOKEN" not in o.stdout
    assert "ENV ['GIVEN', 'HOME', 'LANG', 'PATH', 'PWD', 'TMPDIR']" in o.stdout
    assert "PROCS 2 ['/usr/bin/bwrap " in o.stdout  # only the namespace's init and itself: no host process
    assert "ENVIRON 1 " not in o.stdout  # the namespace's init runs as root: unreadable


@root_only
@needs_bwrap
def test_runs_as_nobody_without_capabilities(tmp_path: Path):
    o = run(
        tmp_path,
        """
        import os
        print(os.getuid(), os.getgid(), os.getgroups())
        print([l.split()[1] for l in open("/proc/self/status") if l.startswith(("CapEff", "CapBnd", "NoNewPrivs"))])
    """,
    )
    assert o.stdout.splitlines() == [f"{sb.NOBODY} {sb.NOBODY} []", "['0000000000000000', '0000000000000000', '1']"]


@needs_bwrap
def test_torch_imports_under_default_limits(tmp_path: Path):
    code = "import numpy, torch; print(torch.from_numpy(numpy.ones(4)).sum().item())"  # what problems import
    o = run(tmp_path, code, Limits(wall_seconds=60))
    assert (o.returncode, o.stdout.strip()) == (0, "4.0"), o.stderr


@needs_bwrap
def test_memory_bomb_fails(tmp_path: Path):
    o = run(tmp_path, "x = bytearray(4 << 30)", Limits(wall_seconds=30, memory_bytes=1 << 30))
    assert o.returncode == 1 and "MemoryError" in o.stderr


# Each child stays far below the per-process limit; only a limit on the whole tree stops them together.
TREE_BOMB = """
    import os, sys, time
    for _ in range(6):
        if os.fork() == 0:
            os.setsid()  # detached: a process-group kill would miss it
            hoard = [b"x" * (64 << 20) for _ in range(5)]  # 320 MiB each, touched
            print("hoarded", flush=True)
            time.sleep(120)  # {marker}
            os._exit(0)
    time.sleep(120)
"""


def _groups_left() -> list[str]:
    parent = cgroups.memory_parent().path
    return [n for n in os.listdir(parent) if n.startswith(f"{cgroups.PREFIX}{os.getpid()}-")]


@needs_cgroup
@needs_bwrap
def test_memory_limit_covers_the_whole_tree(tmp_path: Path):
    marker = f"sbx-{uuid.uuid4().hex}"
    limits = Limits(wall_seconds=120, memory_bytes=4 << 30, tree_memory_bytes=768 << 20)
    o = run(tmp_path, TREE_BOMB.format(marker=marker), limits)
    assert o.memory_exceeded and not o.timed_out, o
    assert o.reason.startswith("memory limit exceeded") and "768 MiB" in o.reason
    assert o.stdout.count("hoarded") < 3  # 3 x 320 MiB cannot fit in 768 MiB
    assert not _alive(marker)
    assert _groups_left() == []


@needs_cgroup
def test_memory_limit_and_tree_kill_without_bubblewrap(tmp_path: Path, monkeypatch):
    """The rlimits-only fallback still gets the cgroup: the tree's memory is capped and detached descendants die."""
    monkeypatch.setattr(sb, "_bwrap_path", lambda: None)
    monkeypatch.setenv("KERNELBOT_SANDBOX", "auto")
    limits = Limits(wall_seconds=120, memory_bytes=4 << 30, tree_memory_bytes=768 << 20)
    box = Sandbox(str(tmp_path), limits, uid=None)  # stay root: the interpreter may sit in a private home
    assert box.describe()["tree_kill"] == "cgroup" and box.describe()["memory"]["tree_limit_bytes"] == 768 << 20
    marker = f"sbx-{uuid.uuid4().hex}"
    o = box.start([PY, "-c", textwrap.dedent(TREE_BOMB.format(marker=marker))]).wait()
    assert o.memory_exceeded and o.reason.startswith("memory limit exceeded"), o
    assert not _alive(marker)
    script = f"import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)  # {marker}\n"
    o = box.start([PY, "-c", script]).wait()
    assert o.returncode == 0 and not o.memory_exceeded and o.reason == "", o
    assert not _alive(marker)  # outside the process group, inside the cgroup
    assert _groups_left() == []


def test_tree_memory_defaults_to_a_share_a_small_host_survives():
    total, usable = sb.node_memory()
    assert usable == total - max(2 << 30, total // 5)
    assert sb.tree_memory_limit(Limits()) == min(8 << 30, int(total * 0.4), usable)
    gib = 1 << 30
    host = (24 * gib, 24 * gib - max(2 * gib, 24 * gib // 5))  # the 24 GiB, 2-core host one run once took 12 GiB of
    assert sb.tree_memory_limit(Limits(), host) == 8 * gib  # was 19.2 GiB: the node's whole spare memory
    assert sb.tree_memory_limit(Limits(runs_per_node=3), host) == host[1] // 3
    small = (8 * gib, 6 * gib)
    assert sb.tree_memory_limit(Limits(), small) == int(8 * gib * 0.4)
    assert sb.tree_memory_limit(Limits(tree_memory_bytes=12 * gib), host) == 12 * gib  # a pool's own setting
    assert sb.tree_memory_limit(Limits(tree_memory_bytes=total * 2)) == usable  # never past the margin
    assert sb.tree_memory_limit(Limits(tree_memory_bytes=1)) == sb.MIN_TREE_BYTES


DISK_HOG = """
    import os
    block = b"x" * (16 << 20)
    for i in range(128):  # 2 GiB, 16 MiB a file (each under the file size limit)
        with open(f"hog-{i}", "wb") as f:
            f.write(block)
            f.flush()
            os.fsync(f.fileno())
    print("wrote it all", flush=True)
"""


@needs_bwrap
def test_the_workdirs_files_together_are_held_to_the_disk_limit(tmp_path: Path):
    """FSIZE bounds one file; many files are measured together and the tree killed past `disk_bytes`."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    tmp_path.chmod(0o755)
    o = run(tmp_path / "a", DISK_HOG, Limits(wall_seconds=120, disk_bytes=64 << 20))
    assert o.disk_exceeded and "wrote it all" not in o.stdout, o
    assert o.reason == ("disk limit exceeded: the run's files in its working directory passed its 64 MiB limit and "
                        "its processes were killed")
    assert sb.disk_usage(str(tmp_path / "a")) < 1 << 30  # stopped long before the 2 GiB
    small = DISK_HOG.replace("range(128)", "range(2)")  # 32 MiB: within the limit, untouched
    o = run(tmp_path / "b", small, Limits(wall_seconds=120, disk_bytes=64 << 20))
    assert (o.returncode, o.disk_exceeded, o.reason) == (0, False, ""), o
    assert "wrote it all" in o.stdout


@needs_bwrap  # else the sandbox refuses for want of bubblewrap before it looks for a cgroup
def test_missing_memory_cgroup_is_refused_under_require(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("KERNELBOT_CGROUP", str(tmp_path))  # not a cgroup
    monkeypatch.setenv("KERNELBOT_SANDBOX", "require")
    with pytest.raises(SandboxUnavailable, match="no memory cgroup is usable .*not a memory-controller group"):
        Sandbox(str(tmp_path), Limits())
    monkeypatch.setenv("KERNELBOT_SANDBOX", "auto")
    memory = Sandbox(str(tmp_path), Limits()).describe()["memory"]
    assert memory["cgroup"] is None and "not a memory-controller group" in memory["per_process_only"]


@needs_bwrap
def test_only_workdir_and_shm_are_writable(tmp_path: Path):
    o = run(
        tmp_path,
        """
        import multiprocessing, os, tempfile
        print("HOME", os.environ["HOME"] == os.getcwd(), tempfile.gettempdir() == os.getcwd())
        for path in ["/tmp/x", "/x", "/etc/x", "/dev/x", "/dev/shm/x", "mine.txt"]:
            try:
                open(path, "w").write("1")
                print("WRITABLE", path)
            except OSError as e:
                print("refused", path, e.strerror)
        with open("/dev/null", "w") as f:
            f.write("devices still work")
        multiprocessing.get_context("spawn").Lock()  # a POSIX semaphore in /dev/shm
        print("semaphore ok")
    """,
    )
    assert o.returncode == 0, o.stderr
    assert "HOME True True" in o.stdout and "semaphore ok" in o.stdout
    assert [line.split()[1] for line in o.stdout.splitlines() if line.startswith("WRITABLE")] == [
        "/dev/shm/x", "mine.txt"]


@needs_bwrap
def test_fork_bomb_contained(tmp_path: Path):
    limit = 16 + _tasks_of(sb.NOBODY if os.geteuid() == 0 else os.getuid())
    o = run(
        tmp_path,
        """
        import os, time
        n = 0
        try:
            for _ in range(500):
                if os.fork() == 0:
                    time.sleep(60)
                    os._exit(0)
                n += 1
        except OSError as e:
            print("fork failed after", n, type(e).__name__)
    """,
        Limits(wall_seconds=30, processes=limit),
    )
    if sb.describe()["processes"]["bound_by"] == "pids cgroup":  # the first refused fork ends the tree
        assert o.processes_exceeded and not o.timed_out, o  # killed, or exited on its own first
        assert o.reason == (f"process limit exceeded: the run tried to start more than {limit} processes and "
                            "threads together and its processes were killed")
        return
    assert o.returncode == 0 and "fork failed after" in o.stdout and "BlockingIOError" in o.stdout, o
    assert int(o.stdout.split()[3]) < limit
    assert o.elapsed < 20  # exiting the main process tore down the sleeping children with the namespace


@pytest.mark.skipif(sb.describe()["processes"]["bound_by"] != "pids cgroup", reason="needs a pids cgroup")
@pytest.mark.parametrize("backend", ["bubblewrap", "rlimits-only"])
def test_a_fork_bomb_does_not_take_the_processes_of_a_run_beside_it(tmp_path: Path, backend, monkeypatch):
    """Runs share their sandbox uid; the bomb's processes count in its own group only, so the run beside it still
    starts its 100 processes while the bomb is at its limit; with bubblewrap, and without it (auto on a bare
    machine)."""
    if backend == "rlimits-only":
        monkeypatch.setenv("KERNELBOT_SANDBOX", "auto")
        monkeypatch.setattr(sb, "_bwrap_path", lambda: None)
    elif sb.describe()["backend"] != "bubblewrap":
        pytest.skip("bubblewrap is not usable here")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    limits = Limits(wall_seconds=30, processes=200, process_count=200)  # the task limit, not the process count
    bomb = Sandbox(str(tmp_path / "a"), limits).start([PY, "-c", textwrap.dedent("""
        import os, signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            try:
                if os.fork() == 0:
                    time.sleep(60)
                    os._exit(0)
            except OSError:
                time.sleep(0.001)
    """)])
    honest = run(tmp_path / "b", """
        import os, time
        pids = []
        for _ in range(100):
            pid = os.fork()
            if pid == 0:
                time.sleep(0.5)
                os._exit(0)
            pids.append(pid)
        print(sum(os.waitpid(p, 0)[1] == 0 for p in pids), "children ran")
    """, limits)
    o = bomb.wait()
    assert sb.describe()["backend"] == backend
    assert honest.returncode == 0 and honest.stdout == "100 children ran\n", honest
    assert o.processes_exceeded and o.elapsed < 20 and not o.timed_out


@pytest.mark.skipif(sb.describe()["processes"]["bound_by"] != "pids cgroup", reason="needs a pids cgroup")
@pytest.mark.parametrize("uid", [None, sb.NOBODY], ids=["kept", "dropped"])
def test_without_bubblewrap_a_tree_that_keeps_this_uid_keeps_its_rlimit_nproc(tmp_path: Path, monkeypatch, uid):
    """Without bubblewrap a tree that keeps this process's uid could write itself into another cgroup's cgroup.procs
    and leave its pids cgroup: RLIMIT_NPROC stays at its process limit. A dropped uid cannot write the cgroup files:
    its own group bounds it (RLIMIT_NPROC, shared with every run of that uid, at this process's)."""
    monkeypatch.setenv("KERNELBOT_SANDBOX", "auto")
    monkeypatch.setattr(sb, "_bwrap_path", lambda: None)
    open_dir = Path(tempfile.mkdtemp(prefix="nproc-"))  # a uid dropped needs the run directory's parent open to it
    open_dir.chmod(0o755)
    monkeypatch.chdir(open_dir)
    (open_dir / "run").mkdir()
    box = Sandbox(str(open_dir / "run"), Limits(wall_seconds=30, processes=300), uid=uid)
    if uid is not None and box.uid is None:
        pytest.skip("the interpreter or the run directory is closed to other users here: the uid is kept")
    o = box.start([PY, "-c", "import resource; print(*resource.getrlimit(resource.RLIMIT_NPROC))"]).wait()
    assert o.returncode == 0, o
    kept = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    assert o.stdout.split() == (["300", "300"] if uid is None else [str(kept)] * 2)
    assert box.describe()["processes"]["bound_by"] == ("pids cgroup and RLIMIT_NPROC (per uid)" if uid is None else
                                                       "pids cgroup")
    shutil.rmtree(open_dir)


def test_the_default_process_limit_leaves_room_for_honest_code_on_many_cores():
    """Threads count: torch's, OpenMP's and triton's pools on a 200-core node, compile workers included, stay far
    below it; a fork bomb reaches it within seconds all the same (bench/fork_bomb.py)."""
    assert contract.DEFAULT_LIMITS["processes"] >= 4096 and Limits().processes == contract.DEFAULT_LIMITS["processes"]


@needs_bwrap
def test_file_size_limit(tmp_path: Path):
    write = "open('big', 'wb').write(b'x' * (2 << 20))"
    o = run(tmp_path, write, Limits(wall_seconds=30, file_size_bytes=1 << 20))
    assert o.returncode == 1 and "File too large" in o.stderr  # Python ignores SIGXFSZ: EFBIG
    o = run(
        tmp_path,
        f"import signal; signal.signal(signal.SIGXFSZ, signal.SIG_DFL)\n{write}",
        Limits(wall_seconds=30, file_size_bytes=1 << 20),
    )
    assert o.returncode == -signal.SIGXFSZ and "file size" in o.reason
    assert (tmp_path / "big").stat().st_size == 1 << 20


@needs_bwrap
def test_cpu_limit_kills_spinner(tmp_path: Path):
    o = run(tmp_path, "while True: pass", Limits(wall_seconds=30, cpu_seconds=1))
    assert o.returncode == -signal.SIGXCPU and "CPU" in o.reason and not o.timed_out
    assert o.elapsed < 10


@needs_bwrap
def test_wall_time_kills_whole_tree(tmp_path: Path):
    marker = f"sbx-{uuid.uuid4().hex}"
    # the grandchild double-forks, calls setsid and keeps stdout open
    o = run(
        tmp_path,
        f"""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                open("grandchild.pid", "w").write(str(os.getpid()))
                while True:
                    time.sleep(0.05)
                    open("beat", "a").write("x")
            os._exit(0)
        time.sleep(3600)  # {marker}
    """,
        Limits(wall_seconds=1.5),
    )
    assert o.timed_out and "wall time" in o.reason and 1.4 < o.elapsed < 10
    assert (tmp_path / "grandchild.pid").exists()
    size = (tmp_path / "beat").stat().st_size
    time.sleep(0.3)
    assert (tmp_path / "beat").stat().st_size == size  # nothing is still beating
    assert not _alive(marker)


def _tasks_of(uid: int) -> int:
    """RLIMIT_NPROC counts every task (threads too) of the uid on the host, other sandboxes included."""
    n = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        except (OSError, ValueError):
            continue
        n += int(status["Threads"]) if int(status["Uid"].split()[0]) == uid else 0
    return n


def _alive(marker: str) -> bool:
    """Whether any host process has `marker` in its command line."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
        except OSError:
            pass
    return False


@needs_bwrap
def test_exit_of_main_kills_leftovers_and_wait_returns(tmp_path: Path):
    o = run(
        tmp_path,
        """
        import os, time
        if os.fork() == 0:
            os.setsid()
            time.sleep(60)  # holds stdout/stderr open
        print("bye")
    """,
    )
    assert o.returncode == 0 and o.stdout == "bye\n" and o.reason == "" and o.elapsed < 4


@needs_bwrap
def test_kill_from_parent(tmp_path: Path):
    marker = f"sbx-{uuid.uuid4().hex}"
    p = Sandbox(str(tmp_path), Limits(wall_seconds=30)).start([PY, "-c", f"import time; time.sleep(60)  # {marker}"])
    time.sleep(0.3)
    p.kill()
    o = p.wait()
    assert o.reason == "killed by the parent" and not o.timed_out and o.elapsed < 10
    assert not _alive(marker)


@needs_bwrap
def test_output_flood_truncated_without_deadlock(tmp_path: Path):
    o = run(
        tmp_path,
        """
        import os
        chunk = b"y" * (1 << 20)
        for _ in range(64):
            os.write(1, chunk)
            os.write(2, chunk)
        print("done", flush=True)
    """,
        Limits(wall_seconds=30, output_bytes=1000),
    )
    assert o.returncode == 0 and not o.timed_out
    assert o.stdout == "y" * 1000 and o.stderr == "y" * 1000
    assert o.stdout_truncated and o.stderr_truncated


@needs_bwrap
def test_pass_fds_reach_the_child(tmp_path: Path):
    r, w = os.pipe()
    try:
        p = Sandbox(str(tmp_path), Limits(wall_seconds=30)).start(
            [PY, "-c", f"import os; os.write({w}, b'from inside')"], pass_fds=(w,)
        )
        os.close(w)
        assert p.wait().returncode == 0
        assert os.read(r, 100) == b"from inside"
    finally:
        os.close(r)


@needs_bwrap
def test_no_gpu_devices(tmp_path: Path):
    o = run(tmp_path, "import os, glob; print(glob.glob('/dev/nvidia*'), os.environ.get('CUDA_VISIBLE_DEVICES'))")
    assert o.stdout == "[] None\n"
    o = run(
        tmp_path,
        "import os, glob; print(glob.glob('/dev/nvidia*'), repr(os.environ['CUDA_VISIBLE_DEVICES']))",
        devices=[],
    )
    assert o.stdout == "[] ''\n"
    assert Sandbox(str(tmp_path), Limits(), devices=["0"]).describe()["rlimits"][1] == "data"


def test_require_mode_raises_without_bwrap(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(sb, "_bwrap_path", lambda: None)
    monkeypatch.setenv("KERNELBOT_SANDBOX", "require")
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        Sandbox(str(tmp_path), Limits())
    assert sb.describe()["backend"] == "unavailable"
    monkeypatch.setenv("KERNELBOT_SANDBOX", "bogus")
    with pytest.raises(ValueError):
        Sandbox(str(tmp_path), Limits())


@pytest.mark.parametrize("how", ["missing", "none"])
def test_fallback_rlimits_env_session(tmp_path: Path, monkeypatch, how):
    if how == "missing":
        monkeypatch.setattr(sb, "_bwrap_path", lambda: None)
        monkeypatch.setenv("KERNELBOT_SANDBOX", "auto")  # CI runs with "require"
    else:
        monkeypatch.setenv("KERNELBOT_SANDBOX", "none")
    monkeypatch.setenv("KERNELBOT_SECRET_TOKEN", "s3cr3t")
    box = Sandbox(str(tmp_path), Limits(wall_seconds=10, open_files=77, cpu_seconds=5, file_size_bytes=1 << 20))
    d = box.describe()
    assert d["backend"] == "rlimits-only" and d["network"] == "host" and d["pid_namespace"] is False
    assert d["fallback_reason"]
    # /bin/sh, not the interpreter: under root the child is uid 65534, which may not reach a Python in ~root
    o = box.start(["/bin/sh", "-c", "id -u; ulimit -n; ulimit -t; ulimit -c; env | sort; ps -o sid= -p $$"]).wait()
    lines = o.stdout.split()
    assert lines[:4] == [str(d["uid"]), "77", "5", "0"], o
    assert "s3cr3t" not in o.stdout and f"HOME={tmp_path}" in o.stdout and f"TMPDIR={tmp_path}" in o.stdout
    assert int(lines[-1]) != os.getsid(0)  # its own session


@root_only
def test_without_bubblewrap_an_interpreter_other_users_cannot_reach_keeps_the_uid(tmp_path: Path, monkeypatch):
    """A fresh machine without bubblewrap, where Python lives under a home other users cannot enter (pyenv under
    /root): dropping to the sandbox uid would only make every run fail to start, so the run keeps this uid and the
    sandbox description says why and how to do better."""
    monkeypatch.setattr(sb, "_bwrap_path", lambda: None)
    monkeypatch.setenv("KERNELBOT_SANDBOX", "auto")
    home = tmp_path / "home"
    (home / "bin").mkdir(parents=True)
    python = home / "bin" / "python3"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    home.chmod(0o700)
    workdir = tmp_path / "work"
    workdir.mkdir()
    monkeypatch.setattr(sys, "executable", str(python))
    box = Sandbox(str(workdir), Limits(wall_seconds=30), uid=60123)
    d = box.describe()
    closed = sb._closed_to_others(str(python))  # home, or an ancestor of it that is closed too (pytest's tmp)
    assert closed and str(home).startswith(closed)
    assert not d["uid_dropped"] and f"under {closed}, which other users cannot enter" in d["fallback_reason"]
    o = box.start([str(python), "-c", "import os; print(os.getuid())"]).wait()
    assert o.returncode == 0 and o.stdout.split() == ["0"], o


@root_only
def test_without_bubblewrap_a_run_directory_other_users_cannot_reach_keeps_the_uid(tmp_path: Path, monkeypatch):
    """The same for the run directory: an agent whose runs live under a directory closed to others (a 0700 state
    directory, pytest's tmp) would start every run as the sandbox uid unable to read its own files ("can't open
    file ... _harness_child.py: Permission denied", seen with Debian's /usr/bin/python3 and no bubblewrap); under an
    open directory the uid is still dropped."""
    monkeypatch.setattr(sb, "_bwrap_path", lambda: None)
    monkeypatch.setenv("KERNELBOT_SANDBOX", "auto")
    monkeypatch.setattr(sys, "executable", "/bin/sh")  # an interpreter every user can start
    closed = tmp_path / "state"
    (closed / "work").mkdir(parents=True)
    closed.chmod(0o700)
    (closed / "work" / "job.txt").write_text("job")
    opened = Path(tempfile.mkdtemp(prefix="kernelbot-runs-"))
    try:
        opened.chmod(0o755)
        (opened / "work").mkdir()
        (opened / "work" / "job.txt").write_text("job")
        for parent, dropped, uid in ((closed, False, "0"), (opened, True, "60123")):
            box = Sandbox(str(parent / "work"), Limits(wall_seconds=30), uid=60123)
            d = box.describe()
            assert d["uid_dropped"] is dropped, d
            assert ("the run directory lies under" in d["fallback_reason"]) is not dropped, d["fallback_reason"]
            o = box.start(["/bin/sh", "-c", "id -u; cat job.txt"]).wait()
            assert o.returncode == 0 and o.stdout.split() == [uid, "job"], o
        assert sb._closed_to_others(str(closed)) and f"under {sb._closed_to_others(str(closed))}, which other " \
            "users cannot enter" in Sandbox(str(closed / "work"), Limits(), uid=60123).describe()["fallback_reason"]
    finally:
        shutil.rmtree(opened, ignore_errors=True)


def test_fallback_wall_time(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("KERNELBOT_SANDBOX", "none")
    o = Sandbox(str(tmp_path), Limits(wall_seconds=0.5)).start(["/bin/sh", "-c", "sleep 30"]).wait()
    assert o.timed_out and o.returncode == -signal.SIGKILL and o.elapsed < 5


@root_only
@needs_bwrap
def test_unprivileged_caller_uses_user_namespace():
    """A non-root launcher (no uid drop possible) still gets every namespace, via a user namespace."""
    py = "/usr/bin/python3"
    if not (os.path.exists(py) and shutil.which("setpriv")):
        pytest.skip("needs a system python3 and setpriv")
    base = Path(tempfile.mkdtemp(prefix="sbx-unpriv-"))
    try:
        pkg = base / "runners" / "harness"
        pkg.mkdir(parents=True)
        for init in (base / "runners" / "__init__.py", pkg / "__init__.py"):
            init.touch()
        for module in (sb, cgroups, contract):  # the sandbox and the stdlib-only modules it imports
            shutil.copy(module.__file__, pkg / Path(module.__file__).name)
        wd = base / "wd"
        wd.mkdir()
        os.chown(wd, sb.NOBODY, sb.NOBODY)
        for p in [base, *base.rglob("*")]:
            p.chmod(p.stat().st_mode | 0o755 if p.is_dir() else 0o644)
        launcher = f"""
            import json, sys
            sys.path.insert(0, {str(base)!r})
            from runners.harness.sandbox import Limits, Sandbox
            box = Sandbox({str(wd)!r}, Limits(wall_seconds=20))
            o = box.start([sys.executable, "-c", "import os, socket\\n"
                           "print(os.getuid(), len([p for p in os.listdir('/proc') if p.isdigit()]))\\n"
                           "try:\\n    socket.create_connection(('127.0.0.1', {_free_port()}), timeout=1)\\n"
                           "except OSError as e:\\n    print(type(e).__name__)"]).wait()
            print(json.dumps([box.describe()["backend"], o.returncode, o.stdout, o.stderr]))
        """
        r = subprocess.run(
            [
                "setpriv",
                f"--reuid={sb.NOBODY}",
                f"--regid={sb.NOBODY}",
                "--clear-groups",
                py,
                "-c",
                textwrap.dedent(launcher),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
            env={"PATH": os.defpath},
        )
        assert r.returncode == 0, r.stderr
        backend, rc, out, err = json.loads(r.stdout.splitlines()[-1])
        assert (backend, rc, out) == ("bubblewrap", 0, f"{sb.NOBODY} 2\nConnectionRefusedError\n"), err
    finally:
        shutil.rmtree(base)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
