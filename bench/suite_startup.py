"""Where `./dev test`'s fixed costs go (issue 43: a fresh clone's `./dev test` took 3 min 38 s on 2 cores), side by side
in one run so a loaded machine still gives ratios:

1. Collection, per pytest process (each xdist worker collects everything): CPU seconds of `pytest --collect-only`
   with every installed plugin autoloaded (pytest then rewrites the asserts of each plugin's whole distribution as
   it is imported: faker, hypothesis, schemathesis) against the plugins named in pyproject.toml's addopts.
2. The install's byte-compiling: CPU seconds to compile every .py of the venv (what pip does after installing,
   on one core, unless --no-compile) against those the suite's collection imports (what Python then compiles on
   first import, once).

    python bench/suite_startup.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COLLECT = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "not slow"]
AUTOLOAD = ["-o", "addopts=-ra --strict-markers"]  # the addopts before issue 43
IMPORTED = """
import sys, time, pytest
pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-m", "not slow"])
files = {m.__file__ for m in list(sys.modules.values())
         if (getattr(m, "__file__", None) or "").endswith(".py") and "site-packages" in m.__file__}
start = time.process_time()
for f in files:
    compile(open(f, "rb").read(), f, "exec", dont_inherit=True)
print(f"IMPORTED {len(files)} {time.process_time() - start:.2f}")
"""


def child_cpu(command: list[str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one child process."""
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    subprocess.run(command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"},
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, time.monotonic() - start


def compile_all(root: Path) -> tuple[int, float]:
    count, start = 0, time.process_time()
    for path in root.rglob("*.py"):
        try:
            compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
            count += 1
        except (SyntaxError, ValueError):
            pass
    return count, time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds
    figures: dict[str, list[float]] = {"autoload": [], "named": []}
    for _ in range(rounds):  # alternated, so both meet the same load
        figures["autoload"].append(child_cpu(COLLECT + AUTOLOAD)[0])
        figures["named"].append(child_cpu(COLLECT)[0])
    auto, named = (statistics.median(figures[k]) for k in ("autoload", "named"))
    print(f"collection CPU s per process (median of {rounds}): plugins autoloaded {auto:.2f}, named {named:.2f} "
          f"({named / auto:.2f}x)")
    total = compile_all(Path(sysconfig.get_paths()["purelib"]))
    out = subprocess.run([sys.executable, "-c", IMPORTED], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}).stdout
    _, used, used_s = next(line for line in out.splitlines() if line.startswith("IMPORTED")).split()
    print(f"byte-compiling: the whole venv {total[0]} files {total[1]:.1f} CPU s; those collection imports {used} "
          f"files {float(used_s):.1f} CPU s ({float(used_s) / total[1]:.2f}x)")


if __name__ == "__main__":
    main()
