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


# Interleaved batches. A timed case alternates batches of the submission's calls (timed in the sandboxed
# child) with batches of as many reference calls (timed by the trusted parent while the child's whole process
# tree is stopped). A batch is summarised by its minimum, the call a loaded host disturbed least (load only
# ever adds time; bench/fairness.py compares this with medians and means); the ranked figure is the median
# over batches of submission / reference, so a host that runs everything slower for a while moves both and
# cancels out. Its interval is distribution-free (order statistics of the
# batch ratios), widened in quadrature by `run_spread`, the relative between-run spread of identical code
# that a single run cannot see (process placement, memory layout), measured by bench/fairness.py.
MIN_BATCHES = 6  # the fewest batches whose median has a 95 % order-statistics interval


@dataclasses.dataclass(frozen=True)
class Estimate:
    value: float
    low: float  # 95 % interval
    high: float

    @property
    def rel_half_width(self) -> float:
        """The larger of the two relative (log-space) half-widths; inf when there is no interval."""
        if not (0 < self.low <= self.value <= self.high < math.inf):
            return math.inf
        return max(math.log(self.high / self.value), math.log(self.value / self.low))


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return math.nan
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def median_rank(n: int) -> int:
    """The largest j with P(Binomial(n, 1/2) < j) <= 2.5 %: [x_(j), x_(n+1-j)] covers the median with >= 95 %
    probability whatever the distribution (1-based order statistics); 0 when n is too small for that."""
    cumulative, j = 0, 0
    while j < n and (cumulative + math.comb(n, j)) / 2**n <= 0.025:
        cumulative += math.comb(n, j)
        j += 1
    return j


def estimate(values: Sequence[float], run_spread: float = 0.0) -> Estimate:
    """The median of positive per-batch values and its 95 % interval, widened by `run_spread` (relative)."""
    n = len(values)
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan)
    ordered = sorted(values)
    mid, j = median(ordered), median_rank(n)
    if j == 0 or ordered[0] <= 0:
        return Estimate(mid, 0.0, math.inf)
    below, above = math.log(mid / ordered[j - 1]), math.log(ordered[n - j] / mid)
    return Estimate(mid, mid * math.exp(-math.hypot(below, run_spread)), mid * math.exp(math.hypot(above, run_spread)))


# How tight a case's interval needs to be. What a result reports is the within-run interval of the batch ratios
# widened in quadrature by `run_spread` (the between-run spread that more batches cannot shrink) and by the clock's
# resolution relative to the time measured (which they cannot shrink either). Once the within-run half-width is a
# third of the larger of those, the reported interval is within ~5 % of what endless sampling would give
# (hypot(1/3, 1) = 1.054): more batches cost time and buy nothing a ranking can use, and fewer leave the interval
# wider than the runner allows. So the measured spread sets where timing stops (a GPU's ~1 %: 0.3 %, within the case
# budget), not a fixed half-width; `rel_ci` is a floor an operator may raise to stop sooner (none by default).
SPREAD_SHARE = 1 / 3


def needed_rel_ci(rel_ci: float, run_spread: float = 0.0, resolution: float = 0.0) -> float:
    """The within-run relative half-width at which timing stops (see SPREAD_SHARE)."""
    return max(rel_ci, SPREAD_SHARE * math.hypot(run_spread, resolution))


def batch_stop_reason(
    ratios: Sequence[float], samples: int, elapsed_s: float, *, rel_ci: float, max_samples: int, budget_s: float,
    run_spread: float = 0.0, resolution: float = 0.0,
) -> str | None:
    """Why interleaved timing should stop now (`ci`, `max_samples`, `budget`), or None to keep going.

    `ci`: the batch ratios' 95 % interval (without the between-run spread and the clock's resolution, which more
    batches cannot shrink) is within `needed_rel_ci` of the median. Nothing stops before MIN_BATCHES batches, so
    there is an interval.
    """
    if len(ratios) < MIN_BATCHES:
        return None
    if estimate(ratios).rel_half_width <= needed_rel_ci(rel_ci, run_spread, resolution):
        return "ci"
    if samples >= max_samples:
        return "max_samples"
    if elapsed_s >= budget_s:
        return "budget"
    return None


def combine(estimates: Sequence[Estimate], ranking_by: str, weights: Sequence[float] | None = None) -> Estimate:
    """One figure over cases by the ranking rule. Bounds are combined like values (as if the cases' errors
    were fully correlated), which never understates the interval. `mean` weighs by `weights` when given
    (the reference's times, so the ratio of summed times is approximated), else equally."""
    if not estimates:
        return Estimate(math.nan, math.nan, math.nan)
    if ranking_by == "last":
        return estimates[-1]
    if ranking_by == "geom":
        lows = [e.low for e in estimates]
        return Estimate(geometric_mean([e.value for e in estimates]),
                        0.0 if min(lows) <= 0 else geometric_mean(lows), geometric_mean([e.high for e in estimates]))
    if ranking_by == "mean":
        w = list(weights) if weights else [1.0] * len(estimates)
        total = math.fsum(w)
        return Estimate(*(math.fsum(wi * getattr(e, f) for wi, e in zip(w, estimates, strict=True)) / total
                          for f in ("value", "low", "high")))
    raise ValueError(f"unknown ranking_by {ranking_by!r}")


def geometric_mean(values: Sequence[float]) -> float:
    if not values or any(v <= 0 for v in values):
        return math.nan
    if any(v == math.inf for v in values):
        return math.inf
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
# shows up as wall time the samples and the overhead do not explain. On a loaded host so does waiting for
# a CPU: `waited_ns` is that wait during the calls (the kernel's schedstat for the parent's thread and the
# child's main thread, which the child cannot touch), so it is explained and left out of the fraction;
# sleeping or computing outside the timed interval is not.
HIDDEN_FRACTION = 0.5  # flag when more than half the watched wall time not spent waiting is unexplained ...
HIDDEN_SLACK_NS = 2_000_000  # ... and it exceeds this much per call (IPC jitter, GC, scheduler noise)


def implausible(
    samples_ns: Sequence[float], walls_ns: Sequence[float], overhead_ns: float, waited_ns: float = 0.0,
) -> str | None:
    """A reason why the reported samples cannot be true, or None. Pure; see the constants above."""
    for i, (s, w) in enumerate(zip(samples_ns, walls_ns, strict=True)):
        if not (0 <= s <= w):
            return f"call {i}: reported {s:.0f} ns outside the {w:.0f} ns wall time the harness watched"
    n = len(samples_ns)
    total_s, total_w = math.fsum(samples_ns), math.fsum(walls_ns)
    hidden = total_w - total_s - n * overhead_ns - waited_ns
    if hidden > HIDDEN_FRACTION * (total_w - waited_ns) and hidden > n * HIDDEN_SLACK_NS:
        return (
            f"reported {total_s / 1e6:.3f} ms over {n} calls but the harness watched {total_w / 1e6:.3f} ms "
            f"({waited_ns / 1e6:.3f} ms of it waiting for a CPU): work was done outside the timed interval"
        )
    return None


def charge_late(samples_ns: Sequence[int], late_ns: Sequence[int], baseline_ns: float) -> list[int]:
    """Each sample with what its call's device stayed busy past the baseline (child.Yardstick's `late`) added: the
    one rule for the submission's samples and the reference's, so identical code scores 1x."""
    return [int(s + max(0.0, late - baseline_ns)) for s, late in zip(samples_ns, late_ns, strict=True)]


def outside_stream(samples_ns: Sequence[int], late_ns: Sequence[int], baseline_ns: float,
                   allowance_ns: float) -> tuple[list[int], str | None]:
    """(the samples charged, a reason to refuse the batch or None). `late_ns`: per call, how long the device stayed
    busy after the call's end mark (child.Yardstick); `baseline_ns`: that figure for a call whose work is all on its
    stream (a synchronize's round trip). What is beyond the baseline is work the call left on other streams (or host
    noise, which the batch minima shed) and is charged to the call. A batch in which every call was later than
    `allowance_ns` is refused: its figures would say when the launches returned, not when the work was done."""
    charged = charge_late(samples_ns, late_ns, baseline_ns)
    if late_ns and min(late_ns) > allowance_ns:
        return charged, (f"work outside the timed stream: the device stayed busy {median(late_ns) / 1e3:.1f} µs "
                         f"after each call's end mark (allowed {allowance_ns / 1e3:.1f} µs); join every stream the "
                         "kernel uses to the current one before returning")
    return charged, None
