"""Every upstream problem through the runner path on a real GPU: verdicts and timings, kernelbot vs eval.py.

    python bench/gpu.py prepare --reference-kernels RK --kernelbot KB --out DIR   # here: Django builds payloads
    python bench/gpu.py run DIR [--budget-s 420] [--test-budget-s 180] [--parallel 6] [--only NAME,...]  # GPU

`prepare` imports gpu-mode/reference-kernels (pmpp_v2 as a competition: the popcorn protocol, its own eval.py;
each pmpp_v2 directory again with `--harness kernelbot` as tk_<name>; linalg/cholesky_py) and gpu-mode/kernelbot's
`examples/` (`--root examples`, both protocols) with the project's own `import_problems`, then writes, for every
solution a problem ships (submission.py, solutions/correct|wrong/*, cheat-*.py, submission_triton.py,
submission_cuda_inline.py, submission.cu, wrong.py), the payload `runners.jobs.job_payload` gives a remote runner.
Nothing of the upstream checkouts is committed: DIR is scratch.

`run` runs each payload with `runners.harness.runner.run_harness` (what the remote agent does: the sandbox, the
result nonce) on GPU 0 and prints (a) verdicts: problem x solution x protocol, with eval.py's verdict (the popcorn
protocol runs upstream's eval.py) as the expectation for the trusted protocol; (b) timings of the leaderboard runs:
per-case means of the trusted harness against eval.py's on the same code, and each run's wall seconds and the
device seconds its timed samples account for. Test-mode runs go `--parallel` at a time; leaderboard runs one at a
time. Runs not started within `--budget-s` are listed as skipped. Everything is also written to DIR/results.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
SOLUTION_GLOBS = ("submission.py", "submission_triton.py", "submission_cuda_inline.py", "submission.cu",
                  "solutions/correct/*", "solutions/wrong/*", "cheat-*.py", "wrong.py")
TIMED = ("submission_triton.py", "solutions/correct/*triton*", "solutions/correct/*pytorch*",  # the first a problem
         "solutions/correct/ref.py", "solutions/correct/*", "submission.py")  # has is timed
PRIORITY = ("vectoradd", "grayscale", "matmul", "conv2d", "sort", "vectorsum", "histogram", "prefixsum", "cholesky")


# -- prepare (Django) ----------------------------------------------------------------------------------------------
def prepare(rk: Path, kb: Path, out: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    os.environ.update(DATABASE_URL=f"sqlite:///{tmp}/db.sqlite3", KERNELBOT_DATA_DIR=str(tmp), DEBUG="1")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kernelbot.settings")
    import django

    django.setup()
    from django.core.management import call_command

    from runners.models import GpuType

    call_command("migrate", verbosity=0)
    for name in ("H100", "H200", "B200", "A100", "L4", "T4", "MI300", "MI300x8", "MI355X", "MI355X-x8"):
        GpuType.objects.get_or_create(name=name, defaults={"architecture": "sm_90" if name.startswith("H") else ""})
    pmpp = rk / "problems" / "pmpp_v2"
    call_command("import_problems", str(rk / "problems" / "pmpp_v2.yaml"), root=rk / "problems", verbosity=0)
    sources: dict[str, Path] = {}  # leaderboard -> task directory
    for task in sorted(p for p in pmpp.iterdir() if (p / "task.yml").exists()):
        name = f"tk_{task.name}"
        board(task, rk / "problems", "kernelbot", name)
        sources[name], sources[f"{task.name.removesuffix('_py')}_v2"] = task, task
    cholesky = rk / "problems" / "linalg" / "cholesky_py"
    if cholesky.exists():
        for harness in ("popcorn", "kernelbot"):
            name = f"cholesky_{harness}"
            board(cholesky, rk / "problems", harness, name)
            sources[name] = cholesky
    examples = kb / "examples"
    for task in sorted(p for p in examples.iterdir() if (p / "task.yml").exists()):
        for harness in ("popcorn", "kernelbot"):
            if harness == "kernelbot" and not (task / "reference.py").exists():
                continue  # a lang: cu task has one protocol: its own eval.cu
            name = f"kb_{task.name}_{harness}"
            try:
                board(task, examples, harness, name)
            except Exception as exc:  # reported, not fatal: the table says which example did not import
                print(f"import {name}: {exc}", file=sys.stderr)
                continue
            sources[name] = task
    write_payloads(sources, out)


def board(task: Path, root: Path, harness: str, name: str) -> None:
    from django.core.management import call_command

    call_command("import_problems", str(task), "--root", str(root), "--harness", harness, "--leaderboard", name,
                 "--deadline", "2100-01-01", "--gpu", "H100", verbosity=0)


def write_payloads(sources: dict[str, Path], out: Path) -> None:
    from types import SimpleNamespace

    from leaderboards.models import Leaderboard
    from runners import jobs
    from runners.models import GpuType

    h100 = GpuType.objects.get(name="H100")
    out.mkdir(parents=True, exist_ok=True)
    manifest = []
    for lb in Leaderboard.objects.filter(name__in=sources).select_related("problem").order_by("name"):
        task = sources[lb.name]
        files = sorted({f for pattern in SOLUTION_GLOBS for f in task.glob(pattern) if f.is_file()
                        and (f.suffix == ".cu") == (lb.problem.definition["lang"] == "cu")})
        timed = next((f for pattern in TIMED for f in sorted(task.glob(pattern)) if f in files), None)
        for n, path in enumerate(files):
            rel = str(path.relative_to(task))
            for mode in ["test"] + (["leaderboard"] if path == timed else []):
                submission = SimpleNamespace(problem=lb.problem, leaderboard=lb, pk=1000 + n, mode=mode,
                                             code=SimpleNamespace(text=path.read_text()))
                run = SimpleNamespace(submission=submission, secret=False, gpu_type=h100, gpu_type_id=h100.pk)
                key = f"{lb.name}__{rel.replace('/', '_')}__{mode}"
                (out / f"{key}.json").write_text(json.dumps(jobs.job_payload(run, None)))
                manifest.append({"key": key, "board": lb.name, "solution": rel, "mode": mode,
                                 "protocol": lb.problem.harness, "problem": task.name})
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"{len(manifest)} payloads in {out}")


# -- run (GPU machine, no Django) ----------------------------------------------------------------------------------
def run_one(out: Path, entry: dict) -> dict:
    from runners.harness.runner import run_harness, write_workdir

    payload = json.loads((out / f"{entry['key']}.json").read_text())
    workdir = Path(tempfile.mkdtemp(prefix="bench-run-")) / "work"
    write_workdir(workdir, payload["files"])
    job = {**payload["job"], "workdir": str(workdir), "gpus": ["0"][: max(1, int(payload.get("gpu_count", 1)))]}
    t0 = time.monotonic()
    result, failure = run_harness(job, python=sys.executable, pythonpath=str(REPO), timeout=payload["timeout_s"],
                                  on_progress=lambda event: None, still_wanted=lambda: True, check_interval=30)
    wall = time.monotonic() - t0
    shutil.rmtree(workdir.parent, ignore_errors=True)
    result = result or {"status": "error", "verdict": "-", "error": failure}
    cases = [{"spec": c.get("spec"), "mean": c.get("mean"), "time": c.get("time"), "runs": c.get("runs"),
              "wall_ns": c.get("wall_ns"), "stop": c.get("stop_reason")}
             for c in (result.get("benchmarks") or []) + (result.get("ranked") or [])]
    return {**entry, "wall_s": round(wall, 2), "status": result.get("status"), "verdict": result.get("verdict"),
            "error": str(result.get("error") or "")[:600], "cases": cases, "flags": result.get("flags"),
            "transport": result.get("transport"), "threads_ns": result.get("other_threads_ns"),
            "sandbox": (result.get("system") or {}).get("sandbox", {}).get("backend"),
            "memory": (result.get("system") or {}).get("sandbox", {}).get("memory")}


def pair_key(entry: dict) -> tuple[str, str, str]:
    """The same code of the same problem: a popcorn run and its trusted twin share this."""
    return entry["problem"], entry["solution"], entry["mode"]


def priority(entry: dict) -> tuple:
    rank = next((i for i, name in enumerate(PRIORITY) if name in entry["problem"]), len(PRIORITY))
    return rank, entry["problem"], entry["solution"], entry["protocol"]


def run(out: Path, budget_s: float, test_budget_s: float, parallel: int, only: set[str]) -> None:
    manifest = [e for e in json.loads((out / "manifest.json").read_text())
                if not only or any(o in e["board"] for o in only)]
    started, results = time.monotonic(), []
    tests = [e for e in manifest if e["mode"] == "test"]
    timed = [e for e in manifest if e["mode"] == "leaderboard"]
    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        for result in pool.map(lambda e: run_one(out, e) if time.monotonic() - started < test_budget_s else
                               {**e, "verdict": "skipped", "status": "-", "wall_s": 0, "error": "", "cases": []},
                               tests):
            results.append(result)
            print(f"  {result['board']:34} {result['solution']:32} {result['verdict']:9} {result['wall_s']:6.1f}s "
                  f"{result['error'][:100]!r}", flush=True)
    for entry in sorted(timed, key=priority):
        if time.monotonic() - started > budget_s:
            results.append({**entry, "verdict": "skipped", "status": "-", "wall_s": 0, "error": "", "cases": []})
            continue
        result = run_one(out, entry)
        results.append(result)
        print(f"  {result['board']:34} {result['solution']:32} {result['verdict']:9} {result['wall_s']:6.1f}s "
              f"{result['error'][:160]!r}", flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    report(results)


def report(results: list[dict]) -> None:
    by_pair: dict[tuple, dict[str, dict]] = {}
    for r in results:
        by_pair.setdefault(pair_key(r), {})[r["protocol"]] = r
    print("\n(a) verdicts: problem | solution | eval.py (popcorn) | trusted (kernelbot) | agree")
    for (problem, solution, mode), sides in sorted(by_pair.items()):
        if mode != "test":
            continue
        pop, kb = sides.get("popcorn", {}), sides.get("kernelbot", {})
        agree = "yes" if pop.get("verdict") == kb.get("verdict") else ("-" if not pop or not kb else "NO")
        print(f"| {problem} | {solution} | {pop.get('verdict', '-')} | {kb.get('verdict', '-')} | {agree} |")
    print("\n(b) leaderboard runs: problem | solution | wall s eval.py | wall s trusted | ratio | per-case means "
          "eval.py → trusted (µs)")
    for (problem, solution, mode), sides in sorted(by_pair.items()):
        if mode != "leaderboard":
            continue
        pop, kb = sides.get("popcorn", {}), sides.get("kernelbot", {})
        pw, kw = pop.get("wall_s") or 0, kb.get("wall_s") or 0
        means = []
        pcases = {c["spec"]: c for c in pop.get("cases", [])}
        for c in kb.get("cases", []):
            theirs = (pcases.get(c["spec"]) or {}).get("mean")
            ours = c.get("time") or c.get("mean")
            if theirs and ours:
                means.append(f"{theirs / 1e3:.1f}→{ours / 1e3:.1f} ({ours / theirs - 1:+.0%})")
        device_s = sum((c.get("mean") or 0) * (c.get("runs") or 0) for c in kb.get("cases", [])) / 1e9
        print(f"| {problem} | {solution} | {pw:.1f} {pop.get('verdict', '-')} | {kw:.1f} {kb.get('verdict', '-')} "
              f"| {kw / pw if pw else float('nan'):.2f} | {'; '.join(means[:6])} | timed {device_s:.2f} s |")
    skipped = [r for r in results if r.get("verdict") == "skipped"]
    if skipped:
        print(f"\nskipped for the time budget: {len(skipped)} runs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--reference-kernels", type=Path, required=True)
    p.add_argument("--kernelbot", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("run")
    r.add_argument("out", type=Path)
    r.add_argument("--budget-s", type=float, default=420, help="start no run after this")
    r.add_argument("--test-budget-s", type=float, default=180, help="start no test-mode run after this")
    r.add_argument("--parallel", type=int, default=6)
    r.add_argument("--only", default="")
    r.add_argument("--report", action="store_true", help="only print the tables of an earlier results.json")
    args = parser.parse_args()
    if args.cmd == "prepare":
        prepare(args.reference_kernels, args.kernelbot, args.out)
    elif args.report:
        report(json.loads((args.out / "results.json").read_text()))
    else:
        run(args.out, args.budget_s, args.test_budget_s, args.parallel, {o for o in args.only.split(",") if o})


if __name__ == "__main__":
    main()
