"""Fork bombs beside an honest run on one node (issues 43 and 51): how long each bomb holds the machine, whether the
honest run beside it passes, and the host's 1-minute load meanwhile.

    python bench/fork_bomb.py [--rounds 1] [--timeout 60]

Production sandbox (KERNELBOT_SANDBOX=require: bubblewrap, memory, pids and cpu cgroups; needs root or a delegated
cgroup), through the real harness (warm template, sandboxed child, test mode, the matmul fixture, default limits but
runs_per_node 2: the node's two device slots, each run its share of the cores). Each round: the honest `fast.py`
alone (the baseline), then beside a cheap bomb (the submission starts a bare interpreter that forks without end) and
beside an expensive one (the submission itself, a torch-loaded process, forks without end), each bomb started a
second before the honest run with its test phase limited to --timeout seconds. Prints each bomb's seconds to its
verdict (from its run's start, torch import included) and its reason, the honest run's verdict and wall seconds, and
the peak of /proc/loadavg's 1-minute figure from the bomb's start to 10 s after its end, against 4x the cores.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ["KERNELBOT_SANDBOX"] = "require"  # read when each Sandbox is built, in the forked parents too
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runners.harness.sandbox import Limits, cpu_limit, node_cores  # noqa: E402
from tests.harness.helpers import SUBMISSIONS, run_submission  # noqa: E402

LIMITS = {"tree_memory_bytes": 2 << 30, "runs_per_node": 2}
FOREVER = "while True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
BARE_BOMB = "import os\n" + FOREVER
BOMBS = {
    "cheap (a bare interpreter forks)": f"import subprocess, sys\n\nBOMB = {BARE_BOMB!r}\n\n\n"
                                        "def custom_kernel(data):\n    subprocess.run([sys.executable, '-c', BOMB])\n",
    "expensive (the torch-loaded process forks)": "import os\n\n\ndef custom_kernel(data):\n"
                                                  + textwrap.indent(FOREVER, "    "),
}


class LoadWatch(threading.Thread):
    """The peak 1-minute load average while it runs."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak, self.stop = 0.0, threading.Event()
        self.start()

    def run(self) -> None:
        while True:
            with open("/proc/loadavg") as f:
                self.peak = max(self.peak, float(f.read().split()[0]))
            if self.stop.wait(0.25):
                return


def timed(directory: Path, submission: Path, **overrides) -> tuple[float, dict]:
    started = time.monotonic()
    result = run_submission(directory, submission, limits=LIMITS, **overrides)
    return time.monotonic() - started, result


def beside(directory: Path, bomb: Path, timeout: float) -> tuple[float, dict, float, dict, float]:
    """(honest seconds, honest result, bomb seconds, bomb result, peak load)."""
    watch = LoadWatch()
    with ThreadPoolExecutor(2) as pool:
        bombed = pool.submit(timed, directory / "bomb", bomb, timeouts={"test": timeout})
        time.sleep(1)
        honest = pool.submit(timed, directory / "honest", SUBMISSIONS / "fast.py")
        bomb_s, bomb_result = bombed.result()
        time.sleep(10)  # the 1-minute average follows the runnable count with a lag
        honest_s, honest_result = honest.result()
    watch.stop.set()
    watch.join()
    return honest_s, honest_result, bomb_s, bomb_result, watch.peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=60, help="the bomb's test-phase timeout")
    args = parser.parse_args()
    cores = node_cores()
    share = cpu_limit(Limits(**LIMITS), 1)
    with open("/proc/loadavg") as f:
        before = f.read().split()[0]
    print(f"{cores} cores, each run's CPU share {share:g} cores, 1-minute load before: {before}", flush=True)
    rows = []
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            t, result = timed(Path(tmp) / "alone", SUBMISSIONS / "fast.py")
            rows.append(("honest alone (baseline)", "—", "—", f"{result['verdict']}, {t:.1f} s", "—"))
        for name, code in BOMBS.items():
            with tempfile.TemporaryDirectory() as tmp:
                bomb = Path(tmp) / "bomb.py"
                bomb.write_text(code)
                honest_s, honest, bomb_s, result, peak = beside(Path(tmp), bomb, args.timeout)
                below = "<" if peak < 4 * cores else "≥"
                rows.append((name, f"{bomb_s:.1f} s", f"{result['verdict']}: {result['error'][:110]}",
                             f"{honest['verdict']}, {honest_s:.1f} s", f"{peak:.1f} ({below} {4 * cores})"))
            print(f"round {i + 1}: {rows[-1]}", flush=True)
    print("\n| run | bomb to its verdict | bomb's verdict | honest run beside it | peak 1-min load (4x cores) |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
