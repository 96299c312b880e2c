"""Every hostile submission in tests/cheats/ must get its expected verdict from the real harness; the honest
ones there (`# expected: pass`) guard against defences that misfire."""

import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from runners.harness import cgroups, sandbox

from .helpers import CHEATS, SUBMISSIONS, run_submission

pytestmark = pytest.mark.slow
CHEAT_FILES = sorted(CHEATS.glob("*.py"))
_box = sandbox.describe()
ISOLATED = bool(_box.get("pid_namespace")) and _box.get("uid") != 0
# The whole tree of every corpus run may use 2 GiB (a run on a real node gets that node's share) and 256 tasks (a
# job may set its own limit below the default 4096).
CORPUS_LIMITS = {"tree_memory_bytes": 2 << 30, "processes": 256}  # 256: the fork bomb (400 at most) meets it


def header(path: Path, key: str, default: str | None = None) -> str:
    match = re.search(rf"^# {key}: (.+)$", path.read_text(), re.MULTILINE)
    assert match or default is not None, f"{path.name} has no '# {key}:' header"
    return match.group(1).strip() if match else default


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _memory_cgroup() -> bool:
    try:
        cgroups.memory_parent()
    except cgroups.CgroupUnavailable:
        return False
    return True


@pytest.mark.parametrize("cheat", CHEAT_FILES, ids=lambda p: p.stem)
def test_cheat_gets_expected_verdict(tmp_path, cheat):
    expected = header(cheat, "expected").split("|")
    needs = header(cheat, "needs", "")
    if needs == "cuda" and not _cuda():
        pytest.skip("this attack needs a CUDA device (it runs wherever there is one, and in bench/gpu.py)")
    if needs == "isolation" and not ISOLATED:
        pytest.skip("this defence needs the bubblewrap sandbox (pid namespace, uid drop)")
    if needs == "memory-cgroup" and not _memory_cgroup() and os.environ.get("CI") != "true":
        pytest.skip("this defence needs a memory cgroup (root or a delegated cgroup)")
    result = run_submission(tmp_path, cheat, header(cheat, "mode"), header(cheat, "problem", "matmul"),
                            timeouts={"test": 10, "benchmark": 30, "ranked": 30}, limits=CORPUS_LIMITS)
    assert result["status"] == "ok"
    if expected == ["pass"]:
        assert result["verdict"] == "pass" and result["passed"] is True, result["error"]
        return
    assert result["verdict"] != "pass" and result["passed"] is False
    assert result["verdict"] in expected, (result["verdict"], result["error"])
    assert result["error"]
    assert "LEAKED" not in result["stderr"]
    assert result["ranked"] == []


def test_memory_bomb_verdict_is_clear(tmp_path):
    if not _memory_cgroup() and os.environ.get("CI") != "true":
        pytest.skip("needs a memory cgroup (root or a delegated cgroup)")
    result = run_submission(tmp_path, CHEATS / "memory_bomb.py", limits=CORPUS_LIMITS)
    assert (result["status"], result["verdict"]) == ("ok", "memory_limit"), result["error"]
    assert result["error"] == ("memory limit exceeded: the run's processes together reached its 2048 MiB limit "
                               "and were killed (in the test phase)")
    assert result["system"]["sandbox"]["memory"]["tree_limit_bytes"] == 2 << 30


def test_corpus_is_complete():
    assert len(CHEAT_FILES) >= 20


def test_a_fork_bomb_ends_at_its_process_limit_and_the_honest_run_beside_it_passes(tmp_path):
    """A fork bomb gets a clear verdict at its process limit, not at its timeout, and its processes never count
    against the run beside it on the node (same sandbox uid): that one passes."""
    if not _box["processes"]["bound_by"].startswith("pids") and os.environ.get("CI") != "true":
        pytest.skip("needs a pids cgroup (root or a delegated cgroup)")
    with ThreadPoolExecutor(2) as pool:
        bomb = pool.submit(run_submission, tmp_path / "bomb", CHEATS / "fork_bomb.py", limits=CORPUS_LIMITS,
                           timeouts={"test": 60})
        time.sleep(1)  # the bomb's processes are there when the honest run starts
        honest = pool.submit(run_submission, tmp_path / "honest", SUBMISSIONS / "fast.py", limits=CORPUS_LIMITS)
        bomb, honest = bomb.result(), honest.result()
    assert (honest["verdict"], honest["passed"]) == ("pass", True), honest["error"]
    # its 256 tasks, or first its process count (max(64, 32 per core of its CPU share): 64 on a small node)
    assert bomb["verdict"] == "crash" and re.match(
        r"process limit exceeded: the run (tried to start more than 256 processes and threads together|held \d+ "
        r"processes at once, more than its \d+)", bomb["error"]), bomb["error"]
