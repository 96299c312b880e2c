"""Discord text for what the serialisers give (`run_out` dicts, board entries): the same fields the site shows,
within Discord's 2,000 characters per message."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta

from django.conf import settings
from django.urls import reverse

from leaderboards.models import isolated
from leaderboards.serializers import Outcome, failure_text

LIMIT = 2000
ICONS = {"queued": "⏳", "dispatched": "📦", "running": "⚙️", "succeeded": "✅", "failed": "❌",
         "timed_out": "⏱️", "hacked": "🚫", "error": "⚠️", "cancelled": "✖️"}
PHASES = {"test": "tests", "benchmark": "benchmarks", "ranked": "ranked cases"}


ISOLATES, PDI = "\u2066\u2067\u2068", "\u2069"  # LRI, RLI, FSI; POP DIRECTIONAL ISOLATE
EMBEDDINGS = "\u202a\u202b\u202c\u202d\u202e"  # LRE, RLE, PDF, LRO, RLO
NO_ISOLATES = dict.fromkeys(map(ord, ISOLATES + PDI))


def isolate(text: object) -> str:
    """User text (a name, a file name) isolated as the site does (`leaderboards.models.isolated`: FSI … PDI), less any
    isolate control of its own: a PDI in it would close the isolate early and let an override after it run on. An
    override or embedding inside (a name starting with U+202E) ends at the closing PDI."""
    return isolated(str(text).translate(NO_ISOLATES))


def who(user) -> str:
    """The name the boards show (display name, else user name), isolated."""
    profile = getattr(user, "profile", None)
    return isolate((profile.display_name if profile else "") or user.get_username())


def contained(text: str) -> str:
    """A whole message in which no bidi control reaches past the user text it came with: isolates are kept where they
    pair up within a line (matched as UAX #9 does), and an embedding or override outside them (user text not passed
    through `isolate`, e.g. echoed in an error) is dropped. Every message the bot sends goes through it."""
    pairs: set[int] = set()
    opened: list[int] = []
    for i, char in enumerate(text):
        if char in ISOLATES:
            opened.append(i)
        elif char == PDI and opened:
            pairs.update((opened.pop(), i))
        elif char == "\n":
            opened.clear()
    kept, depth = [], 0
    for i, char in enumerate(text):
        if char in ISOLATES or char == PDI:
            if i not in pairs:
                continue
            depth += 1 if char in ISOLATES else -1
        elif char in EMBEDDINGS and not depth:
            continue
        kept.append(char)
    return "".join(kept)


def clip(text: str, limit: int = LIMIT) -> str:
    """A message within Discord's limit (`contained`)."""
    return contained(text if len(text) <= limit else text[: limit - 2] + " …")


def split(text: str, limit: int = LIMIT) -> list[str]:
    """Text of any length as messages of at most `limit` characters, cut between lines where it can be."""
    parts: list[str] = []
    current = ""
    for line in text.split("\n"):
        while len(line) > limit:  # one line longer than a message: cut it
            if current:
                parts.append(current)
                current = ""
            parts.append(line[:limit])
            line = line[limit:]
        if current and len(current) + 1 + len(line) > limit:
            parts.append(current)
            current = line
        else:
            current = f"{current}\n{line}" if current else line
    if current or not parts:
        parts.append(current)
    return [contained(part) for part in parts]


def fit_file(text: str, limit: int) -> str:
    """A report within an upload limit of `limit` bytes: its beginning and its end, with a note of what is left out."""
    data = text.encode()
    if len(data) <= limit:
        return text
    keep = max(0, limit - 200) // 2
    return (data[:keep].decode(errors="ignore") + f"\n\n[… {len(data) - 2 * keep} bytes left out: Discord's upload "
            f"limit; the site has the whole report …]\n\n" + data[len(data) - keep:].decode(errors="ignore"))


def when(value: datetime) -> str:
    return f"<t:{int(value.timestamp())}:R>"


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, scale in (("s", 1), ("ms", 1e-3), ("µs", 1e-6)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-9:.3g} ns"


def ratio(low: float | None, value: float | None, high: float | None) -> str:
    if value is None:
        return ""
    interval = f" [{low or 0:.3g}, {high:.3g}]" if high is not None else ""
    return f" · {value:.3g}× reference{interval}"


def link(name: str, *args) -> str:
    return f"{settings.SITE_URL}{reverse(name, args=args)}" if settings.SITE_URL else ""


def _run_line(run: dict, scored: bool = False) -> str:
    kind = "secret" if run["secret"] else "public"
    line = f"{ICONS.get(run['status'], '')} **{run['gpu']}** ({kind}): {run['status'].replace('_', ' ')}"
    progress = run.get("progress") or {}
    if run["outcome"] is None and progress.get("phase"):
        line += f" — {PHASES.get(progress['phase'], progress['phase'])} {progress.get('done', 0)}/" \
                f"{progress.get('total', '?')}"
    if run["outcome"] is not None and run["outcome"] != Outcome.PASSED:
        line += f" — {failure_text(run)}".split("\n")[0][:300]
    if run["score"] is not None and not scored:  # scored: the submission's one score is shown instead
        line += f" — {seconds(run['score'])}{ratio(run['ratio_low'], run['ratio'], run['ratio_high'])}"
    cases = [c for phase in ("tests", "benchmarks") for c in run.get(phase) or []]
    if cases:
        line += "\n    " + " ".join("✓" if c.get("status") == "pass" else "✗" for c in cases[:60])
    return line


def score(value: float, interval) -> str:
    """A submission's score as the board and the announcements show it."""
    if interval is None:
        return seconds(value)
    return seconds(value) + ratio(interval.low, interval.value, None if math.isinf(interval.high) else interval.high)


def status(submission, runs: list[dict], state: str, queue: dict | None, scores: dict | None = None) -> str:
    """`scores`: GPU name → the submission's one (score, ratio) there (`serializers.submission_results`), shown
    instead of each run's own."""
    scores = scores or {}
    lines = [f"**#{submission.pk}** `{isolate(submission.file_name)}` → **{submission.leaderboard.name}** "
             f"({submission.mode}): {state}"]
    if queue:
        lines.append(f"Queue position {queue['position']} of {queue['queued_jobs']} on {queue['gpu']}, about "
                     f"{timedelta(seconds=int(queue['eta_seconds']))} to go.")
    lines += [f"Score on **{gpu}**: {score(*result)}" for gpu, result in scores.items()]
    lines += [_run_line(r, r["gpu"] in scores) for r in runs]
    if url := link("submission", submission.pk):
        lines.append(url)
    return clip("\n".join(lines))


def report(submission, runs: list[dict]) -> str:
    """The full report for the owner: errors, checker messages, per-benchmark table, logs and system info."""
    out = [f"Submission #{submission.pk} {isolate(submission.file_name)} on {submission.leaderboard.name} "
           f"({submission.mode})"]
    for run in runs:
        out.append(f"\n== {run['gpu']} {'secret' if run['secret'] else 'public'} run: {run['status']}"
                   f" ({Outcome.TEXT.get(run['outcome'], '-')})")
        if run["error"] or (run["outcome"] not in (None, Outcome.PASSED)):
            out.append(f"error: {failure_text(run)}")
        for phase in ("tests", "benchmarks", "ranked"):
            for case in run.get(phase) or []:
                mean = case.get("time", case.get("mean"))
                timing = f"  {seconds(float(mean))}" if isinstance(mean, int | float) else ""
                message = f"  {case['message']}" if case.get("message") else ""
                out.append(f"{phase[:-1] if phase != 'ranked' else 'ranked'} {case.get('spec', '')}: "
                           f"{case.get('status', '')}{timing}{message}")
        if run["score"] is not None:
            out.append(f"score: {seconds(run['score'])}{ratio(run['ratio_low'], run['ratio'], run['ratio_high'])}")
        for stream in ("stdout", "stderr"):
            if run[stream]:
                out.append(f"--- {stream} ---\n{run[stream]}")
        if run["system_info"]:
            out.append("system: " + json.dumps(run["system_info"], default=str))
    return "\n".join(out)


def ranking(board, gpu_type, entries, page: int, pages: int, gpu_names: list[str]) -> str:
    lines = [f"**{board.name}** on **{gpu_type.name}** — page {page}/{pages} (GPUs: {', '.join(gpu_names)})"]
    for e in entries:
        lines.append(f"{e.rank}{'≈' if e.tied else '.'} {who(e.user)} — {seconds(e.score)}"
                     f"{ratio(e.ratio_low, e.ratio, e.ratio_high)} (#{e.submission_id})")
    if len(lines) == 1:
        lines.append("No ranked submission yet.")
    if url := link("leaderboard", board.name):
        lines.append(url)
    return clip("\n".join(lines))


def task(board) -> str:
    gpus = ", ".join(g.name for g in board.gpu_types.all())
    text = f"**{board.name}** ({board.problem.lang}; GPUs: {gpus}; closes {when(board.deadline)})\n" \
           f"{board.description or board.problem.description}"
    return clip(text)


def statistics(days: int, submissions: int, by_mode: dict, per_runner: list[dict], passed: int, finished: int,
               delay, gpu_time, top: list[dict], queued: int) -> str:
    lines = [f"**Last {days} day(s)**: {submissions} submissions ("
             + (", ".join(f"{m} {n}" for m, n in sorted(by_mode.items())) or "none") + ")",
             f"Pass rate: {passed}/{finished}" + (f" ({100 * passed / finished:.0f} %)" if finished else ""),
             f"Mean queue delay: {delay.total_seconds():.1f} s" if delay else "Mean queue delay: -",
             f"GPU time: {gpu_time.total_seconds():.0f} s" if gpu_time else "GPU time: 0 s",
             f"Queued now: {queued}",
             "Runs per runner: " + (", ".join(f"{r['runner']} {r['n']}" for r in per_runner) or "none"),
             "Top users: " + (", ".join(f"{isolate(t['user__username'])} {t['n']}" for t in top) or "none")]
    return "\n".join(lines)
