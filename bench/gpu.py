"""Every upstream problem through the runner path on a real GPU: verdicts and timings, kernelbot vs eval.py.

    python bench/gpu.py prepare --reference-kernels RK --kernelbot KB --out DIR   # here: Django builds payloads
    python bench/gpu.py run DIR [--budget-s 420] [--test-budget-s 180] [--parallel 4] [--warm-runs 6] [--only NAME,...]

`prepare` imports gpu-mode/reference-kernels (pmpp_v2 as a competition: the popcorn protocol, its own eval.py;
each pmpp_v2 directory again with `--harness kernelbot` as tk_<name>; linalg/cholesky_py) and gpu-mode/kernelbot's
`examples/` (`--root examples`, both protocols) with the project's own `import_problems`, then writes, for every
solution a problem ships (submission.py, solutions/correct|wrong/*, cheat-*.py, submission_triton.py,
submission_cuda_inline.py, submission.cu, wrong.py), the payload `runners.jobs.job_payload` gives a remote runner.
Nothing of the upstream checkouts is committed: DIR is scratch.

`run`, on GPU 0:
(w) the warm phase: the node agent's own path (`agent.run_attempt` against a stand-in platform that answers the job,
    with `Spares`: a parent per device slot started ahead, its child ready and both device contexts made while the
    device is free), tk_vectoradd_py's submission in test mode `--warm-runs` times on an idle device (a pause between
    runs lets the spare get ready, as on an idle node): per run the seconds to the first test verdict and to the
    result, how the parent and child started, and the harness's breakdown (`seconds`, `child_seconds`); p50.
(a) verdicts: every payload in test mode through `runners.harness.runner.run_harness` (what the remote agent does:
    the sandbox, the result nonce), `--parallel` at a time except the problems known to fill a device (BIG), which
    run alone; a run that ends out of device memory or with the device busy is run again alone. eval.py's verdict
    (the popcorn protocol runs upstream's eval.py) is the expectation for the trusted protocol.
(b) leaderboard runs one at a time, each pair (eval.py, then its trusted twin) back to back, so the budget never
    leaves half a pair: wall seconds of each and their ratio, per-case means, samples and stop reasons.
(y) the yardstick, required (run first, never skipped for the budget): on YARDSTICK_BOARDS, in leaderboard mode,
    a reference copy (reference.py plus `custom_kernel = ref_kernel`: should score 1.00x, its intervals covering 1),
    the reference run on a side stream it does not join (must be refused: work outside the timed stream) and run
    half on a side stream joined before returning (honest: must pass).
Runs not started within the budgets are listed as skipped. Every result is kept in DIR/results.json (its whole
result but the child's output: breakdown, transport, child start).
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
BIG = ("trimul", "eigh", "qr", "cholesky", "mla", "moe", "fp8", "gemm")  # test runs that may fill a device: alone
OUT_OF_MEMORY = ("out of memory", "OutOfMemoryError", "device-busy")
WARM_BOARD = "tk_vectoradd_py"
YARDSTICK_BOARDS = ("tk_vectoradd_py", "tk_matmul_py", "tk_grayscale_py")
SIDE_STREAM = """import torch
from reference import ref_kernel

_side = []


def custom_kernel(data):
    if not _side:
        _side.append(torch.cuda.Stream())
    _side[0].wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(_side[0]):
        for _ in range({repeat}):
            out = ref_kernel(data)
    return out
"""
YARDSTICK = {  # solution -> (expected verdict, code from the task's reference.py)
    "yardstick/reference-copy.py": ("pass", lambda ref: ref + "\n\ncustom_kernel = ref_kernel\n"),
    "yardstick/side-stream.py": ("hacked", lambda ref: SIDE_STREAM.format(repeat=50)),
    "yardstick/joined-streams.py": ("pass", lambda ref: SIDE_STREAM.format(repeat=1).replace(
        "    return out", "    torch.cuda.current_stream().wait_stream(_side[0])\n    return out")),
}


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
        sources[f"{task.name.removesuffix('_py')}_v2"] = task
        try:
            board(task, rk / "problems", "kernelbot", name)
        except Exception as exc:  # the importer refuses what the trusted protocol cannot run: reported, not fatal
            print(f"import {name}: {exc}", file=sys.stderr)
            continue
        sources[name] = task
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
        if lb.name in YARDSTICK_BOARDS and (task / "reference.py").exists():
            for n, (rel, (expected, code)) in enumerate(YARDSTICK.items()):
                text = code((task / "reference.py").read_text())
                submission = SimpleNamespace(problem=lb.problem, leaderboard=lb, pk=2000 + n, mode="leaderboard",
                                             code=SimpleNamespace(text=text))
                run = SimpleNamespace(submission=submission, secret=False, gpu_type=h100, gpu_type_id=h100.pk)
                key = f"{lb.name}__{rel.replace('/', '_')}__leaderboard"
                (out / f"{key}.json").write_text(json.dumps(jobs.job_payload(run, None)))
                manifest.append({"key": key, "board": lb.name, "solution": rel, "mode": "leaderboard",
                                 "protocol": lb.problem.harness, "problem": task.name, "required": True,
                                 "expected": expected})
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"{len(manifest)} payloads in {out}")


# -- run (GPU machine, no Django) ----------------------------------------------------------------------------------
def workdir_job(payload: dict, workdir: Path) -> dict:
    return {**payload["job"], "workdir": str(workdir), "gpus": ["0"][: max(1, int(payload.get("gpu_count", 1)))]}


def summary(entry: dict, result: dict | None, failure: str, wall: float) -> dict:
    result = result or {"status": "error", "verdict": "-", "error": failure}
    cases = [{"spec": c.get("spec"), "mean": c.get("mean"), "time": c.get("time"), "runs": c.get("runs"),
              "wall_ns": c.get("wall_ns"), "stop": c.get("stop_reason")}
             for c in (result.get("benchmarks") or []) + (result.get("ranked") or [])]
    kept = {k: v for k, v in result.items() if k not in ("stdout", "stderr", "event", "nonce")}
    return {**entry, "wall_s": round(wall, 2), "status": result.get("status"), "verdict": result.get("verdict"),
            "error": str(result.get("error") or "")[:600], "cases": cases, "flags": result.get("flags"),
            "sandbox": (result.get("system") or {}).get("sandbox", {}).get("backend"), "result": kept}


def run_one(out: Path, entry: dict) -> dict:
    from runners.harness.runner import run_harness, write_workdir

    payload = json.loads((out / f"{entry['key']}.json").read_text())
    workdir = Path(tempfile.mkdtemp(prefix="bench-run-")) / "work"
    write_workdir(workdir, payload["files"])
    t0 = time.monotonic()
    result, failure = run_harness(workdir_job(payload, workdir), python=sys.executable, pythonpath=str(REPO),
                                  timeout=payload["timeout_s"], on_progress=lambda event: None,
                                  still_wanted=lambda: True, check_interval=30)
    wall = time.monotonic() - t0
    shutil.rmtree(workdir.parent, ignore_errors=True)
    return summary(entry, result, failure, wall)


class StandIn:
    """The platform's side of one attempt for `agent.run_attempt`: answers the job, notes when progress arrives."""

    def __init__(self, payload: dict):
        self.payload, self.started, self.first_verdict = payload, time.monotonic(), None

    def call(self, route: str, body: dict | None = None, retries: int = 0) -> dict:
        if route.startswith("job"):
            return self.payload
        if route == "progress" and body and body.get("phase") == "test" and self.first_verdict is None:
            self.first_verdict = time.monotonic() - self.started
        return {}


def warm_phase(out: Path, manifest: list[dict], runs: int, pause_s: float) -> list[dict]:
    """The node agent's path with spares on an idle device: seconds to the first test verdict, run by run."""
    from runners.harness.agent import run_attempt
    from runners.harness.runner import Spares

    entry = next((e for e in manifest if e["board"] == WARM_BOARD and e["mode"] == "test"
                  and e["solution"] in ("submission.py", "submission_triton.py")), None)
    entry = entry or next((e for e in manifest if e["board"] == WARM_BOARD and e["mode"] == "test"), None)
    if entry is None:
        print(f"(w) no test payload of {WARM_BOARD}: no warm phase")
        return []
    payload = json.loads((out / f"{entry['key']}.json").read_text())
    workroot = Path(tempfile.mkdtemp(prefix="bench-warm-"))
    spares, rows = Spares(sys.executable, str(REPO), workroot), []
    print(f"\n(w) warm phase: {WARM_BOARD} {entry['solution']}, the node agent's path with spares, {runs} runs")
    try:
        for n in range(runs):
            platform = StandIn(payload)
            result = run_attempt(platform, workroot, gpus=["0"], spares=spares)
            wall = time.monotonic() - platform.started
            row = {**summary({**entry, "key": f"warm{n}"}, result, "", wall),
                   "first_verdict_s": round(platform.first_verdict or wall, 3)}
            rows.append(row)
            timing = result.get("runner_timing") or {}
            print(f"  run {n}: first verdict {row['first_verdict_s']:.2f} s, result {wall:.2f} s, "
                  f"{result.get('verdict')} | parent {timing.get('parent')}, child {result.get('child_start')}, "
                  f"device context {result.get('device_context')} | {breakdown(result)}", flush=True)
            time.sleep(pause_s)
    finally:
        spares.close()
        shutil.rmtree(workroot, ignore_errors=True)
    later = sorted(r["first_verdict_s"] for r in rows[1:]) or [0.0]
    print(f"  p50 first verdict (runs 1..{runs - 1}, spares): {later[len(later) // 2]:.2f} s; "
          f"run 0 (no spare yet): {rows[0]['first_verdict_s']:.2f} s")
    return rows


def breakdown(result: dict) -> str:
    parts = [f"{k} {v:.2f}" for k, v in (result.get("seconds") or {}).items() if v >= 0.005]
    child = [f"{k} {v:.2f}" for k, v in (result.get("child_seconds") or {}).items() if v >= 0.005]
    return ", ".join(parts) + (f" (child: {', '.join(child)})" if child else "")


def big(entry: dict) -> bool:
    return any(name in entry["problem"] for name in BIG)


def out_of_memory(result: dict) -> bool:
    text = f"{result.get('error')} {result.get('flags')}"
    return any(mark in text for mark in OUT_OF_MEMORY)


def pair_key(entry: dict) -> tuple[str, str, str]:
    """The same code of the same problem: a popcorn run and its trusted twin share this."""
    return entry["problem"], entry["solution"], entry["mode"]


def priority(entry: dict) -> tuple:
    rank = next((i for i, name in enumerate(PRIORITY) if name in entry["problem"]), len(PRIORITY))
    return rank, entry["problem"], entry["solution"], entry["protocol"]


def skipped(entry: dict) -> dict:
    return {**entry, "verdict": "skipped", "status": "-", "wall_s": 0, "error": "", "cases": []}


def show(result: dict) -> None:
    print(f"  {result['board']:34} {result['solution']:32} {result['verdict']:9} {result['wall_s']:6.1f}s "
          f"{result['error'][:140]!r}", flush=True)


def run(out: Path, budget_s: float, test_budget_s: float, parallel: int, only: set[str], warm_runs: int) -> None:
    manifest = [e for e in json.loads((out / "manifest.json").read_text())
                if not only or any(o in e["board"] for o in only)]
    started = time.monotonic()
    results = warm_phase(out, manifest, warm_runs, pause_s=3.0) if warm_runs else []
    print("\n(y) the yardstick (required)")
    for entry in (e for e in manifest if e.get("required")):
        results.append(run_one(out, entry))
        show(results[-1])
    manifest = [e for e in manifest if not e.get("required")]

    def test(entry: dict) -> dict:
        return run_one(out, entry) if time.monotonic() - started < test_budget_s else skipped(entry)

    tests = [e for e in manifest if e["mode"] == "test"]
    print("\n(a) test-mode runs")
    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        done = list(pool.map(test, [e for e in tests if not big(e)]))
    for result in done:
        show(result)
    for entry in (e for e in tests if big(e)):  # alone: each may fill the device
        done.append(test(entry))
        show(done[-1])
    again = [r for r in done if out_of_memory(r)]
    results += [r for r in done if not out_of_memory(r)]
    for entry in again:  # ran beside others and ran out of device memory: alone now, the verdict that counts
        result = run_one(out, {k: v for k, v in entry.items() if k in manifest[0]})
        result["rerun_alone"] = True
        results.append(result)
        show(result)
    print("\n(b) leaderboard runs, pair by pair")
    pairs: dict[tuple, list[dict]] = {}
    for entry in sorted((e for e in manifest if e["mode"] == "leaderboard"), key=priority):
        pairs.setdefault(pair_key(entry), []).append(entry)
    for entries in pairs.values():
        if time.monotonic() - started > budget_s:
            results += [skipped(e) for e in entries]
            continue
        for entry in sorted(entries, key=lambda e: e["protocol"] != "popcorn"):  # eval.py first, then its twin
            result = run_one(out, entry)
            results.append(result)
            show(result)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    report(results)


def report(results: list[dict]) -> None:
    required = [r for r in results if r.get("required")]
    if required:
        print("\n(y) yardstick: board | solution | expected | verdict | ok | ratio [95 % interval] per case")
        for r in required:
            cases = ((r.get("result") or {}).get("ranked") or (r.get("result") or {}).get("benchmarks") or [])
            ratios = "; ".join(f"{c['ratio']:.3f} [{c['ratio_low']:.3f}, {c['ratio_high']:.3f}]"
                               for c in cases if c.get("ratio") is not None)
            print(f"| {r['board']} | {r['solution']} | {r['expected']} | {r['verdict']} | "
                  f"{'yes' if r['verdict'] == r['expected'] else 'NO'} | {ratios or r['error'][:200]} |")
    results = [r for r in results if not r.get("required")]
    warm = [r for r in results if str(r.get("key", "")).startswith("warm")]
    if warm:
        print("\n(w) warm phase: run | first verdict s | result s | parent | child | device context | breakdown")
        for n, r in enumerate(warm):
            res = r.get("result") or {}
            parent = (res.get("runner_timing") or {}).get("parent")
            print(f"| {n} | {r.get('first_verdict_s')} | {r['wall_s']} | {parent} | {res.get('child_start')} | "
                  f"{res.get('device_context')} | {breakdown(res)} |")
    results = [r for r in results if r not in warm]
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
        samples = ", ".join(f"{c.get('runs')} {c.get('stop')}" for c in kb.get("cases", [])[:6])
        print(f"| {problem} | {solution} | {pw:.1f} {pop.get('verdict', '-')} | {kw:.1f} {kb.get('verdict', '-')} "
              f"| {kw / pw if pw else float('nan'):.2f} | {'; '.join(means[:6])} | timed {device_s:.2f} s | "
              f"samples {samples} | {breakdown(kb.get('result') or {})} |")
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
    r.add_argument("--parallel", type=int, default=4, help="test-mode runs at once (BIG problems run alone)")
    r.add_argument("--warm-runs", type=int, default=6, help="runs of the warm phase (0: none)")
    r.add_argument("--only", default="")
    r.add_argument("--report", action="store_true", help="only print the tables of an earlier results.json")
    args = parser.parse_args()
    if args.cmd == "prepare":
        prepare(args.reference_kernels, args.kernelbot, args.out)
    elif args.report:
        report(json.loads((args.out / "results.json").read_text()))
    else:
        run(args.out, args.budget_s, args.test_budget_s, args.parallel, {o for o in args.only.split(",") if o},
            args.warm_runs)


if __name__ == "__main__":
    main()
