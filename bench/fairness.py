"""Ranking fairness under load: does the harness order kernels of known relative speed correctly, and does
the interval it reports cover the between-run spread of identical code?

    python bench/fairness.py [--reps 20] [--budget 1.5] [--load 2] [--size 256]

Three bench-only solutions of the demo matmul problem (`problems/demo/matmul_py`) do the same work 1, 2 and
3 times over (`a @ b` repeated, generated below), so their true speed ratios are 3× (x1 vs x3) and 1.5×
(x2 vs x3) by construction: the product dominates a call by far, the per-call Python overhead is a few µs.
Each rep runs the three through the real harness (`python -m runners.harness`, sandboxed child, benchmark
mode, one case) in a rotating order, while `--load` processes of this bench switch between spinning and
sleeping at random so the host's speed drifts during and between runs (on top of whatever else runs here).

Prints, per pair, how often the faster kernel got the better score, and per solution the between-run spread
of its scores next to the interval the harness reported: `covers` is the share of runs whose reported 95 %
interval contains the median of all runs of the same code (an honest interval covers it ~95 % of the time).
A run that does not pass (e.g. flagged by the plausibility check under load) counts as a wrong order.
The ranked value is the harness's ratio to the reference when the result has one, else the mean time.

    python bench/fairness.py --aa [--reps 20] [--budget 3] [--loads 0,2] [--measure 10]

The A/A check: on every problem of the trusted protocol in problems/ (each directory with a reference.py and no
evaluator of its own), a submission whose custom_kernel is the task's ref_kernel line for line (reference.py itself,
plus `custom_kernel = ref_kernel`) timed on the task's largest benchmark, `--reps` times at each load, with the
between-run spread its board is given in problems/*.yaml (`run_spread`; else, with `--measure N`, the spread N A/A
runs at each load measure first, as the platform's workers measure it on a node; else the harness's default), each
run timed as the platform times one (contract.TIMING_DEFAULTS: 3 s per case unless `--budget`). Identical code
should score 1.00x, with its 95 % interval covering 1 in at least 19 of 20 runs. The last column is the spread
those runs measured (1.96 times the standard deviation of their log ratios): what a board's `run_spread` should be.

    python bench/fairness.py --aa --separation --measure 10 [--reps 20] [--loads 0,2]

Beside each A/A run, the separation check (issue 49) times code known to be slower: the reference, then busy work
of (factor - 1) times the median of its last 31 reference calls, so each call takes `factor` times the reference's
(1.25x; 1.5x on vectoradd, whose spread is wider; CPU only: a GPU kernel would need a synchronise first). The
slower code should be ranked behind the identical code of the same rep and not statistically tied with it (the
board's `statistically_tied` on the two runs' intervals) in at least 18 of 20 reps.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from runners.harness.contract import TIMING_DEFAULTS  # noqa: E402 - the repository's, as the platform sends it
from runners.harness.stats import estimate  # noqa: E402

PROBLEM = REPO / "problems" / "demo" / "matmul_py"
VARIANTS = {"x1": 1, "x2": 2, "x3": 3}
PAIRS = [("3x", "x1", "x3"), ("1.5x", "x2", "x3")]
SOLUTION = """import torch

REPEAT = {repeat}


def custom_kernel(data):
    a, b = data
    for _ in range(REPEAT):
        out = a @ b
    return out
"""
# One load process: spin for 0.2-1.5 s, sleep for 0.1-1 s, forever (ended by the bench).
LOAD = """import random, sys, time
rng = random.Random(int(sys.argv[1]))
while True:
    end = time.monotonic() + rng.uniform(0.2, 1.5)
    while time.monotonic() < end:
        pass
    time.sleep(rng.uniform(0.1, 1.0))
"""


def workdir(root: Path, name: str, repeat: int) -> Path:
    path = root / name
    shutil.copytree(PROBLEM, path, ignore=shutil.ignore_patterns("solutions", "task.yml", "template.py"))
    shutil.copyfile(PROBLEM.parent / "utils.py", path / "utils.py")
    (path / "submission.py").write_text(SOLUTION.format(repeat=repeat))
    return path


def run_once(path: Path, args: argparse.Namespace, seed: int) -> dict:
    case = {"m": args.size, "k": args.size, "n": args.size, "seed": 707}
    job = {"mode": "benchmark", "workdir": str(path), "seed": seed, "benchmarks": [case], "ranking_by": "last",
           "timing": {"rel_ci": 0.01, "min_samples": 10, "max_samples": 1000, "case_budget_s": args.budget,
                      "warmup_s": 0.2},
           "timeouts": {"benchmark": 120}}
    proc = subprocess.run([sys.executable, "-m", "runners.harness"], input=json.dumps(job), capture_output=True,
                          text=True, cwd=REPO, timeout=300)
    result = json.loads(proc.stdout.splitlines()[-1])
    if not result.get("passed"):  # an honest kernel that fails under load: counted, never ranked right
        print(f"  {path.name}: {result.get('verdict')}: {result.get('error')}"[:300], flush=True)
        return {"verdict": result.get("verdict")}
    return result["benchmarks"][0]


def trusted_problems() -> list[Path]:
    """The task directories in problems/ that the trusted protocol runs: a reference.py, no evaluator of their own."""
    import yaml

    return sorted(p.parent for p in (REPO / "problems").rglob("reference.py")
                  if "main" not in (yaml.safe_load((p.parent / "task.yml").read_text()).get("config") or {}))


def aa_workdir(root: Path, problem: Path) -> tuple[Path, dict]:
    """A workdir whose submission is the reference, and the task's largest benchmark case."""
    import yaml

    path = root / problem.name
    shutil.copytree(problem, path, ignore=shutil.ignore_patterns("solutions", "template.py"))
    for utils in (problem / "utils.py", problem.parent / "utils.py"):
        if utils.exists() and not (path / "utils.py").exists():
            shutil.copyfile(utils, path / "utils.py")
    (path / "submission.py").write_text((problem / "reference.py").read_text() + "\n\ncustom_kernel = ref_kernel\n")
    task = yaml.safe_load((problem / "task.yml").read_text())
    return path, task["benchmarks"][-1]


SLOWER = """

import statistics as _statistics
import time as _time

_FACTOR, _TAKEN = {factor}, []


def custom_kernel(data):
    started = _time.perf_counter()
    out = ref_kernel(data)
    _TAKEN.append(_time.perf_counter() - started)
    del _TAKEN[:-31]
    until = _time.perf_counter() + (_FACTOR - 1) * _statistics.median(_TAKEN)
    while _time.perf_counter() < until:
        pass
    return out
"""
SLOWER_FACTORS = {"vectoradd_py": 1.5}  # else 1.25


def slower_workdir(root: Path, problem: Path) -> tuple[Path, float]:
    """A workdir like `aa_workdir`'s whose submission takes SLOWER_FACTORS' times the reference's time per call."""
    factor = SLOWER_FACTORS.get(problem.name, 1.25)
    path, _ = aa_workdir(root / "slower", problem)
    (path / "submission.py").write_text((problem / "reference.py").read_text() + SLOWER.format(factor=factor))
    return path, factor


def tied(a: dict, b: dict) -> bool:
    """The board's rule (leaderboards/ranking.py statistically_tied) on two runs' ratio intervals."""
    fast, slow = sorted((a, b), key=lambda c: c["ratio"])
    if not (fast["ratio"] > 0 and slow["ratio_low"] > 0 and math.isfinite(fast["ratio_high"])):
        return True
    return math.log(slow["ratio"] / fast["ratio"]) <= math.hypot(math.log(fast["ratio_high"] / fast["ratio"]),
                                                                 math.log(slow["ratio"] / slow["ratio_low"]))


def board_spreads() -> dict[str, float]:
    """The between-run spread the competition files in problems/ give a task directory's board (`run_spread`)."""
    import yaml

    spreads = {}
    for path in (REPO / "problems").glob("*.yaml"):
        for entry in yaml.safe_load(path.read_text()).get("problems") or []:
            if entry.get("run_spread") is not None:
                spreads[Path(entry["directory"]).name] = float(entry["run_spread"])
    return spreads


def aa_once(path: Path, case: dict, budget: float | None, harness: Path = REPO, spread: float | None = None) -> dict:
    """One benchmark-mode run timed as the platform times one (its TIMING_DEFAULTS), but for the budget and spread
    given."""
    timing = {**TIMING_DEFAULTS, **({"case_budget_s": budget} if budget else {}),
              **({"run_spread": spread} if spread is not None else {})}
    job = {"mode": "benchmark", "workdir": str(path), "seed": random.getrandbits(62), "benchmarks": [case],
           "ranking_by": "last", "timing": timing, "timeouts": {"benchmark": 120}}
    proc = subprocess.run([sys.executable, "-m", "runners.harness"], input=json.dumps(job), capture_output=True,
                          text=True, cwd=harness, timeout=300, env={**os.environ, "PYTHONPATH": str(harness)})
    result = json.loads(proc.stdout.splitlines()[-1])
    return result["benchmarks"][0] if result.get("passed") else {"verdict": result.get("verdict")}


def measured_spreads(dirs: dict[str, tuple[Path, dict]], runs: int, budget: float | None) -> dict[str, float]:
    """The between-run spread of each problem as the platform measures it (leaderboards/spread.py `off_one`): `runs`
    A/A runs on this machine as it is now, 1.96 times the standard deviation of their log ratios about 1.00x."""
    spreads = {}
    for name, (path, case) in dirs.items():
        logs = [math.log(r["ratio"]) for r in (aa_once(path, case, budget) for _ in range(runs))
                if "verdict" not in r and r["ratio"] > 0]
        about_one = math.sqrt(sum(v * v for v in logs) / (len(logs) - 1)) if len(logs) >= 4 else None
        spreads[name] = round(1.96 * about_one, 4) if about_one is not None else None
        print(f"measured spread of {name}: {spreads[name]} from {len(logs)} of {runs} A/A runs", flush=True)
    return {name: value for name, value in spreads.items() if value is not None}


def aa(args: argparse.Namespace) -> None:
    """Identical code against the reference, per trusted-protocol problem and load: does it score 1.00x?"""
    problems = [p for p in trusted_problems() if not args.problems or p.name in args.problems.split(",")]
    loads = [int(n) for n in args.loads.split(",")]
    budget = args.budget or TIMING_DEFAULTS["case_budget_s"]
    print(f"settings: A/A reps={args.reps} budget={budget}s loads={loads} cores={os.cpu_count()} "
          f"sandbox={os.environ.get('KERNELBOT_SANDBOX', 'auto')} problems={[p.name for p in problems]}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    root = Path(tempfile.mkdtemp(prefix="kernelbot-aa-"))
    dirs = {p.name: aa_workdir(root, p) for p in problems}
    slower = {p.name: slower_workdir(root, p) for p in problems} if args.separation else {}
    separation: list[str] = []
    spreads = board_spreads()  # as the boards are configured; the others the harness's default
    if args.spread is not None:  # as if measured (leaderboards/spread.py): every board but those with their own
        spreads = {p.name: spreads.get(p.name, args.spread) for p in problems}
    harnesses = {"": REPO, **({" (baseline)": args.baseline} if args.baseline else {})}
    rows: list[str] = []
    saved: dict[str, dict[str, list[dict]]] = {}
    try:
        for load in loads:
            loaders = [subprocess.Popen([sys.executable, "-c", LOAD, str(i)]) for i in range(load)]
            try:
                if args.measure:  # first, as the workers measure a pair on the nodes that serve it, as they run
                    spreads = {**spreads, **measured_spreads(dirs, args.measure, args.budget), **board_spreads()}
                runs: dict[str, list[dict]] = {name + h: [] for h in harnesses for name in dirs}
                slow_runs: dict[str, list[dict]] = {name: [] for name in slower}
                saved[str(load)] = {**runs, **{f"{name} slower": r for name, r in slow_runs.items()}}
                for rep in range(args.reps):
                    for name, (path, case) in dirs.items():
                        for label, harness in harnesses.items():  # side by side: same load, same minute
                            runs[name + label].append(aa_once(path, case, args.budget, harness, spreads.get(name)))
                        if name in slower:  # the slower code right after its identical one
                            slow_runs[name].append(aa_once(slower[name][0], case, args.budget, REPO,
                                                           spreads.get(name)))
                    if args.save:  # every load's runs so far, by load
                        args.save.write_text(json.dumps(saved))
                    print(f"load {load} rep {rep + 1}: " + "  ".join(
                        f"{n}={ranked_value(r[-1])[0]:.3f}" for n, r in [*runs.items(), *(
                            (f"{n} x{slower[n][1]}", r) for n, r in slow_runs.items())]), flush=True)
            finally:
                for p in loaders:
                    p.send_signal(signal.SIGKILL)
                    p.wait()
            for name, slow in slow_runs.items():
                pairs = list(zip(runs[name], slow, strict=True))
                apart = sum("verdict" not in a and "verdict" not in b and a["ratio"] < b["ratio"] and not tied(a, b)
                            for a, b in pairs)
                covers = sum("verdict" not in a and a["ratio_low"] <= 1 <= a["ratio_high"] for a, _ in pairs)
                ratios = [b["ratio"] for _, b in pairs if "verdict" not in b]
                separation.append(f"| {name} | {load} | {slower[name][1]}x | {covers}/{len(pairs)} | "
                                  f"{apart}/{len(pairs)} | {statistics.median(ratios) if ratios else math.nan:.3f} | "
                                  f"{spreads.get(name, 'default')} |")
            for name, cases in runs.items():
                ok = [c for c in cases if "verdict" not in c]
                ratios = [c["ratio"] for c in ok]
                covers = sum(c["ratio_low"] <= 1 <= c["ratio_high"] for c in ok)
                half = statistics.median((c["ratio_high"] - c["ratio_low"]) / 2 for c in ok) if ok else math.nan
                sd = statistics.stdev(math.log(r) for r in ratios) if len(ratios) > 2 else math.nan
                board = spreads.get(name.removesuffix(" (baseline)"), "default")
                rows.append(f"| {name} | {load} | {statistics.median(ratios) if ratios else math.nan:.3f} | "
                            f"{min(ratios, default=math.nan):.3f}–{max(ratios, default=math.nan):.3f} | "
                            f"{covers}/{len(cases)} | ±{half:.3f} | {len(cases) - len(ok)} | "
                            f"{board} | {sd:.3f} → {1.96 * sd:.2f} |")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("\n| problem (reference copy) | load | median ratio | range | interval covers 1 | median half-width "
          "| failed | board's run_spread | sd of log ratio → suggested run_spread (1.96 sd) |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    if separation:
        print("\n| problem | load | slower code | identical covers 1 | slower ranked behind, not tied | median ratio "
              "of the slower | run_spread |\n| --- | --- | --- | --- | --- | --- | --- |")
        print("\n".join(separation))


def ranked_value(case: dict) -> tuple[float, float, float]:
    """(value, 95 % low, 95 % high) of what the harness ranks on; a failed run scores worst."""
    if "verdict" in case:
        return math.inf, math.inf, math.inf
    if case.get("ratio") is not None:
        return case["ratio"], case["ratio_low"], case["ratio_high"]
    return case["mean"], case["ci_low"], case["ci_high"]


def time_value(case: dict) -> tuple[float, float, float]:
    if "verdict" in case:
        return math.inf, math.inf, math.inf
    if case.get("time") is not None:
        return case["time"], case["time_low"], case["time_high"]
    return case["mean"], case["ci_low"], case["ci_high"]


def spread_row(name: str, runs: list[dict], pick) -> str:
    cases = [c for c in runs if "verdict" not in c]
    failed = len(runs) - len(cases)
    if len(cases) < 2:
        return f"| {name} | – | – | – | – | – | – | {failed} |"
    values = [pick(c) for c in cases]
    scores = [v[0] for v in values]
    med = statistics.median(scores)
    rel_sd = statistics.stdev(scores) / statistics.fmean(scores)
    half = statistics.median((hi - lo) / 2 / v for v, lo, hi in values)
    covers = sum(lo <= med <= hi for _, lo, hi in values)
    stops = {r: sum(c.get("stop_reason") == r for c in cases) for r in ("ci", "budget", "max_samples")}
    return (f"| {name} | {med:.4g} | {rel_sd:.1%} | {max(scores) / min(scores):.2f} | ±{half:.1%} | "
            f"{covers}/{len(cases)} | {stops['ci']}/{stops['budget']}/{stops['max_samples']} | {failed} |")


# Estimators compared offline (--analyse) on the same runs; batches are [submission min, reference min,
# submission median, reference median] per interleaved batch (ns).
ESTIMATORS = {
    "mean time (before)": lambda c: c["mean"],
    "min time": lambda c: c["best"],
    "time: median of batch minima": lambda c: statistics.median(b[0] for b in c["batches"]),
    "ratio: median of batch median ratios": lambda c: statistics.median(b[2] / b[3] for b in c["batches"]),
    "ratio: median of batch min ratios (ranked)": lambda c: statistics.median(b[0] / b[1] for b in c["batches"]),
    "ratio: min / min": lambda c: min(b[0] for b in c["batches"]) / min(b[1] for b in c["batches"]),
}


def analyse(results: dict[str, list[dict]]) -> None:
    """Order right and between-run spread of each estimator on the same runs (a failed run scores worst)."""
    reps = min(len(v) for v in results.values())
    print(f"\nestimators on the same {reps} reps: order right at 3x / 1.5x, between-run sd per solution")
    print("| estimator | 3x | 1.5x | sd x1 | sd x2 | sd x3 |\n| --- | --- | --- | --- | --- | --- |")
    for label, pick in ESTIMATORS.items():
        values = {name: [pick(c) if "batches" in c else math.inf for c in cases[:reps]]
                  for name, cases in results.items()}
        right = [sum(f < s < math.inf for f, s in zip(values[fast], values[slow], strict=True))
                 for _, fast, slow in PAIRS]
        sds = [statistics.stdev(ok) / statistics.fmean(ok) if len(ok := [x for x in v if x < math.inf]) > 1
               else math.nan for v in values.values()]
        print(f"| {label} | {right[0]}/{reps} | {right[1]}/{reps} | " + " | ".join(f"{sd:.1%}" for sd in sds) + " |")
    print("\ncoverage of the median of identical runs by the ranked ratio's interval, by run_spread:")
    print("| run_spread | x1 | x2 | x3 | median half-width |\n| --- | --- | --- | --- | --- |")
    for spread in (0.0, 0.03, 0.05, 0.08, 0.1, 0.15):
        cells, halves = [], []
        for cases in results.values():
            ratios = [[b[0] / b[1] for b in c["batches"]] for c in cases if "batches" in c]
            mid = statistics.median(statistics.median(r) for r in ratios)
            intervals = [estimate(r, spread) for r in ratios]
            cells.append(f"{sum(e.low <= mid <= e.high for e in intervals)}/{len(intervals)}")
            halves += [e.rel_half_width for e in intervals]
        print(f"| {spread} | " + " | ".join(cells) + f" | ±{statistics.median(halves):.1%} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--budget", type=float, help="seconds of timing per case (case_budget_s; default 1.5, with "
                                                     "--aa the platform's TIMING_DEFAULTS: 3)")
    parser.add_argument("--load", type=int, default=2, help="load processes started by the bench")
    parser.add_argument("--size", type=int, default=256, help="m = k = n of the matmul case")
    parser.add_argument("--save", type=Path, help="write every run's timed case (JSON) here, for offline analysis")
    parser.add_argument("--analyse", type=Path, help="compare estimators on runs saved by --save, and exit")
    parser.add_argument("--aa", action="store_true", help="the A/A check: reference copies on every trusted problem")
    parser.add_argument("--loads", default="0,2", help="--aa: the load settings, comma-separated")
    parser.add_argument("--problems", help="--aa: only these problems (directory names, comma-separated)")
    parser.add_argument("--separation", action="store_true", help="--aa: also time slower code beside each A/A run")
    parser.add_argument("--spread", type=float, help="--aa: the run_spread of boards that set none (as if measured)")
    parser.add_argument("--measure", type=int, default=0, metavar="RUNS",
                        help="--aa: at each load, first measure each problem's spread from RUNS A/A runs, as the "
                             "platform does (KERNELBOT_SPREAD_RUNS: 10), for the boards that set none")
    parser.add_argument("--baseline", type=Path, help="--aa: also time each rep with the harness (runners/) under DIR")
    args = parser.parse_args()
    if args.aa:
        aa(args)
        return
    if args.analyse:
        analyse(json.loads(args.analyse.read_text()))
        return
    args.budget = args.budget or 1.5
    print(f"settings: reps={args.reps} budget={args.budget}s load={args.load} size={args.size} "
          f"cores={os.cpu_count()} sandbox={os.environ.get('KERNELBOT_SANDBOX', 'auto')}", flush=True)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # so the load processes are ended below
    root = Path(tempfile.mkdtemp(prefix="kernelbot-fairness-"))
    paths = {name: workdir(root, name, repeat) for name, repeat in VARIANTS.items()}
    loaders = [subprocess.Popen([sys.executable, "-c", LOAD, str(i)]) for i in range(args.load)]
    results: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    right = {label: 0 for label, _, _ in PAIRS}
    started = time.monotonic()
    try:
        names = list(VARIANTS)
        for rep in range(args.reps):
            order = names[rep % 3:] + names[:rep % 3]
            for name in order:
                results[name].append(run_once(paths[name], args, seed=random.getrandbits(62)))
            if args.save:
                args.save.write_text(json.dumps(results))
            for label, fast, slow in PAIRS:
                f, s = ranked_value(results[fast][-1])[0], ranked_value(results[slow][-1])[0]
                right[label] += f < s < math.inf  # a run that failed makes its pair wrong, either side
            print(f"rep {rep + 1}: " + "  ".join(f"{n}={ranked_value(results[n][-1])[0]:.4g}" for n in names),
                  flush=True)
    finally:
        for p in loaders:
            p.send_signal(signal.SIGKILL)
            p.wait()
        shutil.rmtree(root, ignore_errors=True)

    if any("batches" in c for cases in results.values() for c in cases):
        analyse(results)
    print(f"\n{args.reps} reps in {time.monotonic() - started:.0f} s")
    best = {n: min((c["best"] for c in results[n] if "best" in c), default=None) for n in VARIANTS}
    if all(best.values()):
        print("true ratios from the fastest single call of each (least disturbed): " + ", ".join(
            f"{slow}/{fast} = {best[slow] / best[fast]:.2f}" for _, fast, slow in PAIRS))
    print("\n| pair (true ratio) | order right |\n| --- | --- |")
    for label, fast, slow in PAIRS:
        print(f"| {fast} vs {slow} ({label}) | {right[label]}/{args.reps} |")
    header = ("| code | median | between-run sd | max/min | reported 95 % half-width (median) | covers median "
              "| stop ci/budget/max | failed |\n| --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\nranked value (ratio to the reference where reported, else mean ns):\n" + header)
    for name in VARIANTS:
        print(spread_row(name, results[name], ranked_value))
    print("\ntime (ns):\n" + header)
    for name in VARIANTS:
        print(spread_row(name, results[name], time_value))


if __name__ == "__main__":
    main()
