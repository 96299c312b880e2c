"""Durations as people type them (`90`, `90m`, `2h`, `1h30m`, `0.25h`, `1.5h`): whole minutes. Plain Python, no
Django, so the CLI and the site read them alike."""

from __future__ import annotations

import re
from decimal import Decimal

FORMAT = re.compile(r"^(?:(?P<h>\d+(?:\.\d+)?)\s*h(?:ours?)?)?\s*(?:(?P<m>\d+(?:\.\d+)?)\s*m(?:in(?:utes?)?)?)?$")
EXAMPLES = "e.g. 90, 90m, 2h, 1h30m, 0.25h"
MAX_MINUTES = 2**31  # the API's bound; far beyond any reservation policy's longest, which the server checks


def parse_minutes(text: str) -> int:
    """Whole minutes; ValueError naming the text when it is not a duration, not a whole number of minutes, or beyond
    MAX_MINUTES either way (exact arithmetic: no float overflows)."""
    raw = text.strip().lower()
    shown = text if len(text) <= 40 else f"{text[:16]}…{text[-8:]}"  # (who sent 400 digits need not read them back)
    if re.fullmatch(r"-?\d+", raw):
        minutes = Decimal(raw)  # bare minutes (the server refuses what is too short)
    elif (found := FORMAT.match(raw) if raw else None) and (found["h"] or found["m"]):
        minutes = Decimal(found["h"] or 0) * 60 + Decimal(found["m"] or 0)
    else:
        raise ValueError(f"'{shown}' is not a duration ({EXAMPLES})")
    if abs(minutes) > MAX_MINUTES:
        raise ValueError(f"'{shown}' is too long a duration: at most {MAX_MINUTES} minutes")
    if minutes != minutes.to_integral_value():
        raise ValueError(f"'{shown}' is {minutes.normalize():f} minutes; durations are whole minutes")
    return int(minutes)
