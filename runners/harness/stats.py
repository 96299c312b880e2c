"""Pure statistics for timing samples: summaries, confidence intervals, the stopping rule, ranking scores.

No torch, no I/O: everything here is a function of its arguments so it can be tested with tables.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

# Two-sided 95 % Student t quantiles t(0.975, df) for small df; larger df use a Cornish-Fisher expansion.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)
_Z975 = 1.959964


def t975(df: int) -> float:
    """The 97.5 % quantile of Student's t with `df` degrees of freedom (half-width factor of a 95 % CI)."""
    if df < 1:
        return math.inf
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclasses.dataclass(frozen=True)
class Summary:
    runs: int
    mean: float
    std: float  # sample standard deviation (n - 1)
    err: float  # standard error of the mean
    best: float
    worst: float
    ci_low: float  # 95 % confidence interval of the mean
    ci_high: float

    @property
    def half_width(self) -> float:
        return (self.ci_high - self.ci_low) / 2


def summarize(samples: Sequence[float]) -> Summary:
    n = len(samples)
    if n == 0:
        nan = math.nan
        return Summary(0, nan, nan, nan, nan, nan, nan, nan)
    mean = math.fsum(samples) / n
    std = math.sqrt(math.fsum((s - mean) ** 2 for s in samples) / (n - 1)) if n > 1 else 0.0
    err = std / math.sqrt(n)
    half = t975(n - 1) * err if n > 1 else math.inf
    return Summary(n, mean, std, err, min(samples), max(samples), mean - half, mean + half)


def stop_reason(
    samples: Sequence[float], elapsed_s: float, *, rel_ci: float, min_samples: int, max_samples: int,
    budget_s: float,
) -> str | None:
    """Why timing should stop now (`ci`, `max_samples`, `budget`), or None to keep sampling.

    `ci`: the 95 % CI half-width of the mean is within `rel_ci` of the mean (after `min_samples`).
    The budget only stops once at least two samples exist, so there is always an interval to report.
    """
    n = len(samples)
    if n >= max_samples:
        return "max_samples"
    if n >= max(min_samples, 2):
        s = summarize(samples)
        if s.mean > 0 and s.half_width <= rel_ci * s.mean:
            return "ci"
    if elapsed_s >= budget_s and n >= 2:
        return "budget"
    return None


def geometric_mean(values: Sequence[float]) -> float:
    if not values or any(v <= 0 for v in values):
        return math.nan
    return math.exp(math.fsum(math.log(v) for v in values) / len(values))


def score(means: Sequence[float], ranking_by: str) -> float:
    """The single number a leaderboard ranks by (lower is better), from the ranked cases' means."""
    if not means:
        return math.nan
    if ranking_by == "last":
        return means[-1]
    if ranking_by == "mean":
        return math.fsum(means) / len(means)
    if ranking_by == "geom":
        return geometric_mean(means)
    raise ValueError(f"unknown ranking_by {ranking_by!r}")


# Plausibility of a timed batch, judged by the trusted parent from the wall time it watched itself.
# Each call's wall time covers: sending the input, the child deserialising it, the timed call, sending
# the sample and serialising + sending the output. `overhead_ns` is the parent's own estimate of the
# (de)serialisation part. Work hidden outside the timed interval (background threads, a patched clock)
# shows up as wall time the samples and the overhead do not explain.
HIDDEN_FRACTION = 0.5  # flag when more than half the watched wall time is unexplained ...
HIDDEN_SLACK_NS = 2_000_000  # ... and it exceeds this much per call (IPC jitter, GC, scheduler noise)


def implausible(samples_ns: Sequence[float], walls_ns: Sequence[float], overhead_ns: float) -> str | None:
    """A reason why the reported samples cannot be true, or None. Pure; see the constants above."""
    for i, (s, w) in enumerate(zip(samples_ns, walls_ns, strict=True)):
        if not (0 <= s <= w):
            return f"call {i}: reported {s:.0f} ns outside the {w:.0f} ns wall time the harness watched"
    n = len(samples_ns)
    total_s, total_w = math.fsum(samples_ns), math.fsum(walls_ns)
    hidden = total_w - total_s - n * overhead_ns
    if hidden > HIDDEN_FRACTION * total_w and hidden > n * HIDDEN_SLACK_NS:
        return (
            f"reported {total_s / 1e6:.3f} ms over {n} calls but the harness watched {total_w / 1e6:.3f} ms: "
            "work was done outside the timed interval"
        )
    return None
