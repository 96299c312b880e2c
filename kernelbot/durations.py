"""Durations as people type them (`90`, `90m`, `2h`, `1h30m`, `0.25h`, `1.5h`): whole minutes. Plain Python, no
Django, so the CLI and the site read them alike."""

from __future__ import annotations

import re

FORMAT = re.compile(r"^(?:(?P<h>\d+(?:\.\d+)?)\s*h(?:ours?)?)?\s*(?:(?P<m>\d+(?:\.\d+)?)\s*m(?:in(?:utes?)?)?)?$")
EXAMPLES = "e.g. 90, 90m, 2h, 1h30m, 0.25h"


def parse_minutes(text: str) -> int:
    """Whole minutes; ValueError naming the text when it is not a duration or not a whole number of minutes."""
    raw = text.strip().lower()
    if re.fullmatch(r"-?\d+", raw):
        return int(raw)  # bare minutes (the server refuses what is too short)
    found = FORMAT.match(raw) if raw else None
    if found is None or not (found["h"] or found["m"]):
        raise ValueError(f"'{text}' is not a duration ({EXAMPLES})")
    minutes = float(found["h"] or 0) * 60 + float(found["m"] or 0)
    if abs(minutes - round(minutes)) > 1e-6:
        raise ValueError(f"'{text}' is {minutes:g} minutes; durations are whole minutes")
    return round(minutes)
