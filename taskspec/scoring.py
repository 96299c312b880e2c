"""The score rule: benchmark times -> one figure, lower is better. The platform scores runs with it
(`leaderboards.scoring`) and `kernelbot run` scores a local benchmark run the same way."""

from __future__ import annotations

import math
from collections.abc import Sequence

NS_PER_SECOND = 1e9


def score_seconds(means_ns: Sequence[float], rule: str) -> float:
    """Lower is better. `last` ranks on the last benchmark only; `mean` and `geom` on all of them."""
    if not means_ns:
        raise ValueError("no ranked timings to score")
    if any(not math.isfinite(m) or m <= 0 for m in means_ns):
        raise ValueError(f"timings must be positive and finite, got {list(means_ns)}")
    if rule == "last":
        value = means_ns[-1]
    elif rule == "mean":
        value = sum(means_ns) / len(means_ns)
    elif rule == "geom":
        value = math.exp(sum(math.log(m) for m in means_ns) / len(means_ns))
    else:
        raise ValueError(f"unknown ranking rule {rule!r}")
    return value / NS_PER_SECOND
