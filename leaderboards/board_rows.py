"""A ranking's rows as the leaderboard page renders them, for the page and for the live deltas alike, so a row that
arrives over the websocket is the row a reload shows (interval, submission time, breakdown, entrants, records)."""

from __future__ import annotations

from html import escape
from typing import Any

from django.core.paginator import Paginator
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe

from .history import board_history, user_names
from .models import BoardEntry
from .templatetags.kb import ns, seconds

PAGE_ROWS = 50


def attach_breakdown(entries: list[BoardEntry]) -> None:
    """Each entry's per-benchmark breakdown (see `with_breakdown`) and the last one's 95 % interval."""
    for entry in entries:
        entry.benchmarks = entry.breakdown or []
        entry.ci = score_interval(entry.benchmarks)


def score_interval(benchmarks: list[dict]) -> tuple[float, float] | None:
    """The last ranked benchmark's 95 % interval in ns, shown next to the score."""
    last = benchmarks[-1] if benchmarks else None
    if not last or last.get("ci_low") is None or last.get("ci_high") is None:
        return None
    return last["ci_low"], last["ci_high"]


def name_of(user) -> str:
    """The user's display name (Profile.__str__), or the username when the user has no profile row."""
    return str(getattr(user, "profile", None) or user)


def _ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def interval_text(ratio: float | None, low: float | None, high: float | None) -> str:
    """A ratio with its 95 % interval, as every board shows it."""
    if ratio is None:
        return "–"
    return f"{_ratio(ratio)}× ({_ratio(low or 0)}–{'∞' if high is None else _ratio(high)})"


def _benchmark(b: dict) -> str:
    if b.get("time") is not None:
        cells = (ns(b["time"]), f"{ns(b.get('time_low'))} – {ns(b.get('time_high'))}", _ratio(b.get("ratio")))
    else:
        cells = ns(b.get("mean")), f"{ns(b.get('ci_low'))} – {ns(b.get('ci_high'))}", "–"
    return (f'<tr><td>{escape(str(b.get("spec", "")))}</td>' + "".join(f'<td class="num">{c}</td>' for c in cells)
            + f'<td class="num">{escape(str(b.get("runs", "")))}</td></tr>')


def row_html(e: BoardEntry) -> SafeString:
    """One ranking row (`e` from `number_rows` or with `rank` set, and `attach_breakdown`). Built here with the
    standard library's escaping, not in a template: a page renders 50 of them, and the template engine's 0.7 ms a
    row was most of a page view."""
    if e.ratio is not None:
        interval = interval_text(e.ratio, e.ratio_low, e.ratio_high)
    elif e.ci:
        interval = f"{ns(e.ci[0])} – {ns(e.ci[1])} (mean, last benchmark)"
    else:
        interval = "–"
    breakdown = (f'<details class="breakdown"><summary>{len(e.benchmarks)} benchmarks</summary>'
                 '<div class="table-scroll"><table><tr><th>Case</th><th class="num">Time</th><th class="num">95 %</th>'
                 '<th class="num">× ref</th><th class="num">n</th></tr>' + "".join(_benchmark(b) for b in e.benchmarks)
                 + "</table></div></details>") if e.benchmarks else ""
    tied = ' class="tied" title="statistically tied with the entry above"' if e.tied else ""
    submitted = timezone.localtime(e.submitted_at)
    user = escape(reverse("user", args=[e.user.username]))
    return mark_safe(  # noqa: S308 - every value from data is escaped or a number
        f'<tr data-user="{e.user_id}"{tied} data-sub="{e.submission_id}" data-rank="{e.rank}">'
        f'<td class="num">{e.rank}</td><td><a href="{user}"><bdi>{escape(name_of(e.user))}</bdi></a></td>'
        f'<td class="num" data-score="{e.score}"><a href="{reverse("submission", args=[e.submission_id])}">'
        f'{seconds(e.score)}</a></td><td class="muted">{interval}</td><td class="muted">'
        f'<time datetime="{submitted.isoformat()}">{submitted:%Y-%m-%d %H:%M}</time></td><td>{breakdown}</td></tr>')


def figure_text(figure: float, on_ratio: bool) -> str:
    """What a board ranks on, as it shows it: the ratio to the reference, or the time."""
    return f"{_ratio(figure)}× the reference" if on_ratio else seconds(figure)


def record_html(record: list, on_ratio: bool = False) -> str:
    stamp, figure, _ = record
    return f"<li>{escape(stamp[:16].replace('T', ' '))} UTC · {figure_text(figure, on_ratio)}</li>"


def records_html(records: list[list], on_ratio: bool = False) -> SafeString:
    """The board's record progression as a list (what the chart draws, for readers without it)."""
    return mark_safe(  # noqa: S308 - built by record_html
        f'<details id="records"><summary class="muted">Records ({len(records)})</summary>\n'
        f'  <ul>{"".join(record_html(r, on_ratio) for r in records)}</ul>\n</details>')


def live_board(leaderboard_id: int, gpu_type_id: int, gpu_name: str, ranks: dict[int, int], *, entrants: bool = True,
               records: bool = True, record_added: list | None = None, on_ratio: bool = False) -> dict[str, Any]:
    """What a delta carries besides the ranks: the changed rows' HTML (with the delta's `ranks` by user, so a row
    sorts where the delta says) and, when they may have changed, the pager (`entrants`) and the records, as page 1
    of a reload renders them; a record appended to the progression (`record_added`: [iso time, figure, user id])
    travels alone, since the list only grows at its end. `on_ratio`: the figures are ratios to the reference."""
    entries = list(BoardEntry.objects.filter(leaderboard_id=leaderboard_id, gpu_type_id=gpu_type_id,
                                             user_id__in=list(ranks)).select_related("user__profile").with_breakdown())
    for entry in entries:
        entry.rank = ranks[entry.user_id]
    attach_breakdown(entries)
    names = {str(e.user_id): name_of(e.user) for e in entries}
    out: dict[str, Any] = {"rows": {str(e.user_id): row_html(e) for e in entries}, "names": names}
    if entrants:
        count = BoardEntry.objects.filter(leaderboard_id=leaderboard_id, gpu_type_id=gpu_type_id).count()
        out["entrants"] = count
        out["pager"] = render_to_string("leaderboards/_board_pager.html", {
            "page": Paginator(range(count), PAGE_ROWS).get_page(1), "gpu": {"name": gpu_name}}).strip()
    if records:
        history = board_history(leaderboard_id, gpu_type_id, [])
        out["records"], out["record_names"] = history["records"], {str(k): v for k, v in history["names"].items()}
        out["records_html"] = records_html(history["records"], on_ratio)
        out["records_on_ratio"] = on_ratio
    elif record_added:
        holder = str(record_added[2])
        name = names.get(holder) or next(iter(user_names([record_added[2]]).values()), holder)
        out.update(record_added=record_added, record_names={holder: name},
                   record_html=record_html(record_added, on_ratio), records_on_ratio=on_ratio)
    return out
