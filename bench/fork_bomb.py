"""A fork bomb beside an honest run on one node (issue 43): how long the bomb holds the machine, and whether the honest
run beside it keeps its time.

    python bench/fork_bomb.py [--rounds 5] [--timeout 20]

Each round, through the real harness (warm template, sandboxed child, test mode, the matmul fixture, default limits):
the honest `fast.py` alone (the baseline), then beside `tests/cheats/fork_bomb.py` started a second earlier, the bomb
with a process limit of 256 (a pool's own; its pids cgroup) and with that limit raised to 100 000 (what the tree had
before: no bound of its own). Both runs use the default sandbox uid, as two runs of one device slot do. Prints the
honest run's wall seconds alone and beside each bomb (median and spread over the rounds), and each bomb's seconds to
its verdict. Then an unbounded bomb (every process forks) in a bare sandbox at 256 and at the default limit
(contract.DEFAULT_LIMITS, 4096): seconds to its verdict. Needs root (or a delegated cgroup) for the pids controller.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runners.harness.contract import DEFAULT_LIMITS  # noqa: E402
from runners.harness.sandbox import Limits, Sandbox  # noqa: E402
from tests.harness.helpers import CHEATS, SUBMISSIONS, run_submission  # noqa: E402

LIMITS = {"tree_memory_bytes": 2 << 30}
BOMB = textwrap.dedent("""
    import os, time
    while True:
        try:
            os.fork()
        except OSError:
            time.sleep(0.001)
""")


def bare_bomb(processes: int) -> tuple[float, str]:
    """An unbounded fork bomb in a sandbox of its own: seconds to its verdict, and the verdict."""
    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        limits = Limits(wall_seconds=60, processes=processes, tree_memory_bytes=LIMITS["tree_memory_bytes"])
        outcome = Sandbox(tmp, limits).start([sys.executable, "-c", BOMB]).wait()
        return time.monotonic() - started, outcome.reason[:60]


def timed(directory: Path, submission: Path, **overrides) -> tuple[float, dict]:
    started = time.monotonic()
    result = run_submission(directory, submission, limits=LIMITS | overrides.pop("limits", {}), **overrides)
    return time.monotonic() - started, result


def beside(directory: Path, processes: int, timeout: float) -> tuple[float, dict, float, dict]:
    with ThreadPoolExecutor(2) as pool:
        bomb = pool.submit(timed, directory / "bomb", CHEATS / "fork_bomb.py", limits={"processes": processes},
                           timeouts={"test": timeout})
        time.sleep(1)
        honest = pool.submit(timed, directory / "honest", SUBMISSIONS / "fast.py")
        return (*honest.result(), *bomb.result())


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}–{max(values):.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=20, help="the bomb's test-phase timeout")
    args = parser.parse_args()
    alone, with_limit, without, bomb_limit, bomb_none, verdicts = [], [], [], [], [], set()
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            t, result = timed(Path(tmp) / "alone", SUBMISSIONS / "fast.py")
            assert result["verdict"] == "pass", result["error"]
            alone.append(t)
        for processes, honest_times, bomb_times in ((256, with_limit, bomb_limit), (100_000, without, bomb_none)):
            with tempfile.TemporaryDirectory() as tmp:
                t, honest, bt, bomb = beside(Path(tmp), processes, args.timeout)
                honest_times.append(t if honest["verdict"] == "pass" else float("nan"))
                bomb_times.append(bt)
                verdicts.add(f"limit {processes}: honest {honest['verdict']}, bomb {bomb['verdict']}: "
                             f"{bomb['error'][:90]}")
        print(f"round {i + 1}: alone {alone[-1]:.2f} s, beside a limited bomb {with_limit[-1]:.2f} s, beside an "
              f"unlimited one {without[-1]:.2f} s", flush=True)
    print("\n| | honest run (wall) | bomb to its verdict |\n| --- | --- | --- |")
    print(f"| honest alone (baseline) | {spread(alone)} | — |")
    print(f"| beside a bomb, process limit 256 (pids cgroup) | {spread(with_limit)} | {spread(bomb_limit)} |")
    print(f"| beside a bomb, no process limit of its own | {spread(without)} | {spread(bomb_none)} |")
    print("\n" + "\n".join(sorted(verdicts)))
    print("\n| unbounded bomb, bare sandbox | seconds to its verdict |\n| --- | --- |")
    for processes in (256, DEFAULT_LIMITS["processes"]):
        bombs = [bare_bomb(processes) for _ in range(args.rounds)]
        print(f"| process limit {processes} | {spread([t for t, _ in bombs])} ({bombs[-1][1]}…) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
