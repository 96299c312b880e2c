"""Formatting filters: times in ns/µs/ms, safe Markdown."""

from __future__ import annotations

import math

import nh3
from django import template
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt

register = template.Library()
_markdown = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table")
_rendered: dict[str, str] = {}


def format_ns(ns: float | None) -> str:
    if ns is None or not math.isfinite(ns):
        return "–"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(ns) >= scale:
            value = ns / scale
            return f"{value:.{3 if value < 10 else 2 if value < 100 else 1}f} {unit}"
    return f"{ns:.0f} ns" if abs(ns) >= 10 else f"{ns:.2f} ns"


def _number(value: object) -> float | None:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


@register.filter
def ns(value: object) -> str:
    return format_ns(_number(value))


@register.filter
def seconds(value: object) -> str:
    """A score stored in seconds, shown in the most readable unit."""
    number = _number(value)
    return format_ns(None if number is None else number * 1e9)


PHASES = {"test": "tests", "benchmark": "benchmarks", "ranked": "ranked benchmarks"}  # as site.js names them


@register.filter
def progress_text(progress: dict | None) -> str:
    """A running run's progress, "benchmarks 3/12"; site.js writes the live updates the same way."""
    if not progress or not progress.get("phase"):
        return ""
    phase = PHASES.get(progress["phase"], progress["phase"])
    return f"{phase} {progress.get('done', 0)}/{progress.get('total', '?')}"


@register.filter
def markdown(text: str) -> SafeString:
    """CommonMark with raw HTML disabled, then sanitised again by nh3 (links get rel=noopener)."""
    html = _rendered.get(text)
    if html is None:
        html = nh3.clean(_markdown.render(text or ""), link_rel="noopener noreferrer nofollow")
        if len(_rendered) < 1000:
            _rendered[text] = html
    return mark_safe(html)  # noqa: S308 - sanitised by nh3 just above
