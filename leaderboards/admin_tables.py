"""A run's stored result and system info as the admin shows them: tables with times written as people write
them ("77.50 µs"), never raw seconds or JSON. Units sit in the cells, not the headers (the admin's CSS uppercases
headers, and an uppercased µ reads as M)."""

from __future__ import annotations

import json
from typing import Any

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from .templatetags.kb import format_ns


def seconds_text(value: float | None) -> str:
    return "–" if value is None else format_ns(value * 1e9)


def ratio_text(value: float | None, low: float | None, high: float | None) -> str:
    if value is None:
        return "–"
    upper = "∞" if high is None else f"{high:.3f}"
    return f"{value:.3f}× the reference (95 % interval {low or 0:.3f}–{upper})"


def _interval(case: dict[str, Any], low: str, high: str) -> str:
    if case.get(low) is None or case.get(high) is None:
        return "–"
    return f"{format_ns(case[low])} – {format_ns(case[high])}"


def html_table(headers: list[str], rows: list[list[Any]], numeric: set[int]) -> SafeString:
    head = format_html_join("", '<th{}>{}</th>', ((mark_safe(' class="num"') if i in numeric else "", h)
                                                  for i, h in enumerate(headers)))
    body = format_html_join("", "<tr>{}</tr>", ((format_html_join("", "<td{}>{}</td>", (
        (mark_safe(' class="num" style="white-space:nowrap"') if i in numeric else "", cell)
        for i, cell in enumerate(row))),) for row in rows))
    return format_html('<div class="kb-table" style="overflow-x:auto"><table><thead><tr>{}</tr></thead>'
                       "<tbody>{}</tbody></table></div>", head, body)


def tests_table(cases: list[dict[str, Any]]) -> SafeString:
    if not cases:
        return mark_safe("–")
    return html_table(["Case", "Verdict", "Checker message"],
                  [[c.get("spec", ""), c.get("status", ""), c.get("message") or "–"] for c in cases], set())


def timings_table(cases: list[dict[str, Any]]) -> SafeString:
    """Per case: its time with the 95 % interval, the reference's, the ratio, samples and why timing stopped.
    Older results (and the popcorn protocol) have only a mean and its interval."""
    if not cases:
        return mark_safe("–")
    rows = []
    for c in cases:
        interleaved = c.get("time") is not None
        rows.append([
            c.get("spec", ""), c.get("status", ""),
            format_ns(c["time"] if interleaved else c.get("mean")),
            _interval(c, "time_low", "time_high") if interleaved else _interval(c, "ci_low", "ci_high"),
            format_ns(c.get("reference")) if c.get("reference") is not None else "–",
            f"{c['ratio']:.3f}× ({c.get('ratio_low') or 0:.3f}–{c.get('ratio_high') or 0:.3f})"
            if c.get("ratio") is not None else "–",
            c.get("runs", "–"), c.get("stop_reason") or "–"])
    return html_table(["Case", "Verdict", "Time", "95 % interval", "Reference", "× reference", "Samples",
                   "Stopped because"], rows, {2, 3, 4, 5, 6})


def _value_text(value: Any) -> str:
    if isinstance(value, dict):
        return "; ".join(f"{k}: {_value_text(v)}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(_value_text(v) for v in value)
    return str(value)


def info_table(info: dict[str, Any]) -> SafeString:
    if not info:
        return mark_safe("–")
    return html_table(["Item", "Value"], [[k, _value_text(v)] for k, v in info.items()], set())


def raw_json(value: Any) -> SafeString:
    """The stored document, collapsed: for the rare case the tables above do not answer."""
    if not value:
        return mark_safe("–")
    return format_html("<details><summary>show the stored JSON</summary><pre>{}</pre></details>",
                       json.dumps(value, indent=2, sort_keys=True, default=str))


def precheck_text(record: dict[str, Any]) -> SafeString:
    """A submission's pre-check (`leaderboards.precheck`): kernelguard's classification and findings, or why it
    gave none."""
    if not record:
        return mark_safe("not run (not a ranked submission, or the pre-check was off or not installed)")
    tool = f"KernelGuard {record.get('version') or ''}".strip()
    seconds = f" · {record['seconds']:.2f} s" if isinstance(record.get("seconds"), int | float) else ""
    if record.get("error"):
        return format_html("{} failed: {}; the submission went ahead unchecked{}", tool, record["error"], seconds)
    verdict = record.get("classification", "unknown")
    if record.get("should_filter"):
        verdict += f"; KernelBot would refuse it ({record.get('filter_reason') or 'filtered'})"
    head = format_html("{}: <strong>{}</strong>{}", tool, verdict, seconds)
    findings = record.get("findings") or []
    if not findings:
        return format_html("{} · no findings", head)
    return format_html("{}{}", head, html_table(["Rule", "Severity", "Evidence"], [
        [f.get("pattern", ""), f.get("severity", ""), f.get("evidence", "")] for f in findings], set()))
