"""A ranking's rows as the leaderboard page renders them, for the page and for the live deltas alike, so a row that
arrives over the websocket is the row a reload shows (interval, submission time, breakdown, entrants, records)."""

from __future__ import annotations

from typing import Any

from django.core.paginator import Paginator
from django.template.loader import render_to_string

from .history import board_history
from .models import BoardEntry, Run

PAGE_ROWS = 50


def attach_breakdown(entries: list[BoardEntry], gpu_type_id: int) -> None:
    """Each entry's per-benchmark breakdown (its public run's ranked cases) and the last one's 95 % interval."""
    breakdown = dict(Run.objects.filter(submission__in=[e.submission_id for e in entries], gpu_type_id=gpu_type_id,
                                        secret=False).values_list("submission_id", "result__ranked"))
    for entry in entries:
        entry.benchmarks = breakdown.get(entry.submission_id) or []
        entry.ci = score_interval(entry.benchmarks)


def score_interval(benchmarks: list[dict]) -> tuple[float, float] | None:
    """The last ranked benchmark's 95 % interval in ns, shown next to the score."""
    last = benchmarks[-1] if benchmarks else None
    if not last or last.get("ci_low") is None or last.get("ci_high") is None:
        return None
    return last["ci_low"], last["ci_high"]


def live_board(leaderboard_id: int, gpu_type_id: int, gpu_name: str, ranks: dict[int, int], *, entrants: bool = True,
               records: bool = True) -> dict[str, Any]:
    """What a delta carries besides the ranks: the changed rows' HTML (with the delta's `ranks` by user, so a row
    sorts where the delta says) and, when they may have changed, the pager (`entrants`) and the records, as page 1
    of a reload renders them."""
    entries = list(BoardEntry.objects.filter(leaderboard_id=leaderboard_id, gpu_type_id=gpu_type_id,
                                             user_id__in=list(ranks)).select_related("user__profile"))
    for entry in entries:
        entry.rank = ranks[entry.user_id]
    attach_breakdown(entries, gpu_type_id)
    out: dict[str, Any] = {"rows": {str(e.user_id): render_to_string("leaderboards/_board_row.html", {"e": e}).strip()
                                    for e in entries}}
    if entrants:
        count = BoardEntry.objects.filter(leaderboard_id=leaderboard_id, gpu_type_id=gpu_type_id).count()
        out["entrants"] = count
        out["pager"] = render_to_string("leaderboards/_board_pager.html", {
            "page": Paginator(range(count), PAGE_ROWS).get_page(1), "gpu": {"name": gpu_name}}).strip()
    if records:
        history = board_history(leaderboard_id, gpu_type_id, [])
        out["records"], out["record_names"] = history["records"], {str(k): v for k, v in history["names"].items()}
        out["records_html"] = render_to_string("leaderboards/_board_records.html",
                                               {"records": history["records"]}).strip()
    return out
