"""KernelBot's pre-check (kernelguard) against honest upstream code and our hostile corpus (issue 23).

    python bench/kernelguard.py --honest <reference-kernels checkout> [--honest <kernelbot>/examples ...]
                                [--cheats tests/cheats] [--profile strict]

Runs kernelguard exactly as a ranked submission does (`leaderboards.precheck.analyze`: its CLI in `--api-mode`,
a child process per file under the timeout) over
(a) honest upstream code under each `--honest` directory: every `submission*.py`, `submissions/*.py` and
    `solutions/correct/*.py`; anything kernelguard flags there is a false positive. Upstream's own known-bad
    `solutions/wrong/*.py` are listed apart, for information;
(b) our hostile corpus (`--cheats`, default this repository's tests/cheats), each file with the verdict the harness
    must give it (its `# expected:` header; tests/harness/test_cheats.py enforces those, so the harness catches
    every one by design, and `pass` marks an honest pattern a defence must not misfire on).
Prints each file's classification and rules, the false-positive count, which cheats kernelguard also flags and
which it misses, and the pre-check's latency per file (what it adds to a ranked submission's request)."""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
EXPECTED = re.compile(r"^#\s*expected:\s*(\S+)", re.MULTILINE)


def setup_django(profile: str) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kernelbot.settings")
    os.environ.setdefault("DEBUG", "1")
    if profile:
        os.environ["KERNELBOT_KERNELGUARD_PROFILE"] = profile
    import django

    django.setup()


def honest_files(root: Path) -> tuple[list[Path], list[Path]]:
    """(honest, upstream's known-bad) Python files under a reference-kernels or kernelbot checkout."""
    honest, wrong = set(), set()
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).parts
        if "solutions" in parts and "wrong" in parts:
            wrong.add(path)
        elif (path.name.startswith("submission") or "submissions" in parts[:-1]
              or ("solutions" in parts and "correct" in parts)):
            honest.add(path)
    return sorted(honest), sorted(wrong)


def check(path: Path) -> tuple[dict, float]:
    from leaderboards import precheck

    started = time.perf_counter()
    try:
        record = precheck.summary(precheck.analyze(path.read_text(errors="replace")))
    except precheck.PrecheckFailed as exc:
        record = {"classification": "error", "error": str(exc), "findings": [], "should_filter": False}
    return record, time.perf_counter() - started


def rules(record: dict) -> str:
    return ", ".join(sorted({f["pattern"] for f in record["findings"]})) or "–"


def flagged(record: dict) -> bool:
    """Anything kernelguard reports: a finding of any severity, or a classification other than valid."""
    return bool(record["findings"]) or record["classification"] not in ("valid",)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--honest", type=Path, action="append", default=[],
                        help="a reference-kernels checkout, a kernelbot examples/ directory, ... (repeatable)")
    parser.add_argument("--cheats", type=Path, default=REPO / "tests" / "cheats")
    parser.add_argument("--profile", default="", help="a kernelguard built-in profile (default: its default)")
    args = parser.parse_args()
    setup_django(args.profile)
    from leaderboards import precheck

    print(f"kernelguard {precheck.installed_version()} (profile {args.profile or 'default'})\n")
    seconds: list[float] = []

    honest, wrong = [], []
    for root in args.honest:
        found, bad = honest_files(root.resolve())
        honest += [(root, path) for path in found]
        wrong += [(root, path) for path in bad]
    false_positives, filters = [], {}
    print(f"(a) honest upstream code: {len(honest)} files")
    for root, path in honest:
        record, took = check(path)
        seconds.append(took)
        filters[path] = record["should_filter"]
        if flagged(record):
            false_positives.append(path)
        print(f"  {root.name}/{path.relative_to(root.resolve())}: {record['classification']}"
              f"{' FILTER' if record['should_filter'] else ''} [{rules(record)}]")
    refused = [p for _, p in honest if p in false_positives and filters[p]]
    print(f"  => flagged {len(false_positives)} of {len(honest)} honest files (any finding); "
          f"{len(refused)} would be refused (should_filter: KernelBot's block)")
    if wrong:
        print(f"\n    upstream's own known-bad solutions (solutions/wrong), for information: {len(wrong)} files")
        for root, path in wrong:
            record, took = check(path)
            seconds.append(took)
            print(f"    {root.name}/{path.relative_to(root.resolve())}: {record['classification']}"
                  f"{' FILTER' if record['should_filter'] else ''} [{rules(record)}]")

    cheats = sorted(args.cheats.glob("*.py"))
    print(f"\n(b) hostile corpus {args.cheats.name}/: {len(cheats)} files (harness verdict from '# expected:')")
    caught, missed, honest_flagged, blocked = [], [], [], []
    for path in cheats:
        match = EXPECTED.search(path.read_text())
        expected = match.group(1) if match else "?"
        record, took = check(path)
        seconds.append(took)
        is_guard = expected == "pass"  # an honest pattern the harness must let through
        if record["should_filter"] and not is_guard:
            blocked.append(path.name)
        if flagged(record):
            (honest_flagged if is_guard else caught).append(path.name)
        elif not is_guard:
            missed.append(path.name)
        print(f"  {path.name:28} harness: {expected:22} kernelguard: {record['classification']}"
              f"{' FILTER' if record['should_filter'] else ''} [{rules(record)}]")
    print(f"  => kernelguard flags {len(caught)} of {len(caught) + len(missed)} attacks the harness catches: "
          f"{', '.join(caught) or '-'}")
    print(f"     misses {len(missed)}: {', '.join(missed) or '-'}")
    print(f"     would refuse {len(blocked)} (should_filter): {', '.join(blocked) or '-'}")
    print(f"     flags {len(honest_flagged)} honest guard files (expected: pass): {', '.join(honest_flagged) or '-'}")

    if seconds:
        ordered = sorted(seconds)
        print(f"\nlatency per file (child process, as at submission): p50 {statistics.median(ordered) * 1000:.0f} ms,"
              f" p95 {ordered[int(0.95 * (len(ordered) - 1))] * 1000:.0f} ms, max {ordered[-1] * 1000:.0f} ms"
              f" over {len(ordered)} files; false positives: {len(false_positives)} of {len(honest)} honest")


if __name__ == "__main__":
    main()
