"""Durations as people type them, read alike by the CLI and the site."""

import pytest

from kernelbot.durations import parse_minutes


@pytest.mark.parametrize(("text", "minutes"), [
    ("90", 90), ("90m", 90), ("2h", 120), ("1h30m", 90), ("1h 30m", 90), ("0.25h", 15), ("1.5h", 90),
    (" 45 min ", 45), ("2 hours", 120), ("0", 0), ("-5", -5), ("2147483648", 2**31),
])
def test_durations(text, minutes):
    assert parse_minutes(text) == minutes


@pytest.mark.parametrize(("text", "words"), [
    ("", "not a duration"), ("h", "not a duration"), ("2x", "not a duration"), ("1m30h", "not a duration"),
    ("0.01h", "whole minutes"), ("1.5m", "whole minutes"), ("1e3h", "not a duration"),
    ("9" * 400 + "h", "too long a duration: at most 2147483648 minutes"), ("9" * 400, "too long"),
    ("-" + "9" * 400, "too long"), ("1" + "0" * 30 + ".5m", "too long"), ("2147483649", "too long"),
])
def test_bad_durations(text, words):
    with pytest.raises(ValueError, match=words):
        parse_minutes(text)


def test_a_huge_duration_is_named_briefly():
    with pytest.raises(ValueError) as refused:
        parse_minutes("9" * 400 + "h")
    assert len(str(refused.value)) < 120 and "…" in str(refused.value)
