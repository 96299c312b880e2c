"""When a status message may be edited next: coalesced, inside Discord's window, a finished run at once."""

from collections import deque
from datetime import datetime

from discordbot.bot import EDIT_WINDOW, EDITS_PER_WINDOW, Watch


def watch(*edits: float, final: bool = False) -> Watch:
    return Watch(1, 1, True, 1, 1, 1, 1, "token", datetime.now(), 1, last_edit=edits[-1],
                 recent_edits=deque(edits, maxlen=EDITS_PER_WINDOW), final=final)


def test_progress_waits_for_the_interval_but_a_finished_run_does_not():
    assert watch(100.0).next_edit_at(1.0) == 101.0
    assert watch(100.0, final=True).next_edit_at(1.0) == 0.0


def test_a_full_window_holds_back_even_a_finished_run():
    full = [100.0 + i for i in range(EDITS_PER_WINDOW)]
    assert watch(*full).next_edit_at(1.0) == 100.0 + EDIT_WINDOW
    assert watch(*full, final=True).next_edit_at(1.0) == 100.0 + EDIT_WINDOW
