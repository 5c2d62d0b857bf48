"""95% confidence intervals for the experiment's figures (pure Python and numpy; no Ray, no torch).

* :func:`wilson` and :func:`clopper_pearson`: a proportion k of n (PIPP, linkage rates). Both stay inside
  [0, 1], and 0 of n gets a positive upper bound (Wilson 3.85%, Clopper-Pearson 3.77% at n = 96).
* :func:`cluster_bootstrap`: the mean of per-item scores where items share an input (outputs made for the
  same target, records of the same note attacked in several seeds): whole clusters are resampled.
* :func:`cluster_bootstrap_diff`: the difference of two such means from independent samples (a
  score against its chance level).
* :func:`t_interval`: Student's t over replicate values (seeds).

Example:
    >>> lo, hi = wilson(0, 96)
    >>> lo, round(100 * hi, 2)
    (0.0, 3.85)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any

__all__ = ["Z95", "clopper_pearson", "cluster_bootstrap", "cluster_bootstrap_diff", "t_interval", "wilson"]

#: The two-sided 95% normal quantile.
Z95 = 1.959963984540054

_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def _check_counts(k: int, n: int) -> None:
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"a proportion needs 0 <= k <= n and n >= 1; got k={k}, n={n}")


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of the proportion k / n (default 95%)."""
    _check_counts(k, n)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (0.0 if k == 0 else max(0.0, centre - half)), (1.0 if k == n else min(1.0, centre + half))


def _binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    lp, lq = math.log(p), math.log1p(-p)
    return min(1.0, sum(math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp
                                 + (n - i) * lq) for i in range(k + 1)))  # fmt: skip


def _solve(f: Callable[[float], float], target: float) -> float:
    """The p in [0, 1] where the decreasing function f(p) crosses target (bisection to 1e-12)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if f(mid) > target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def clopper_pearson(k: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Exact (Clopper-Pearson) interval of k / n: the p with P(X >= k) = alpha/2 and P(X <= k) = alpha/2."""
    _check_counts(k, n)
    # P(X <= j | p) decreases with p: the upper bound solves P(X <= k) = alpha/2, the lower P(X <= k-1) = 1 - alpha/2
    lo = 0.0 if k == 0 else _solve(lambda p: _binom_cdf(k - 1, n, p), 1.0 - alpha / 2)
    hi = 1.0 if k == n else _solve(lambda p: _binom_cdf(k, n, p), alpha / 2)
    return lo, hi


def t_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, lower, upper) of the two-sided 95% Student's t interval; bounds NaN for fewer than 2 values."""
    xs = [float(v) for v in values if v is not None and not math.isnan(v)]
    if not xs:
        return float("nan"), float("nan"), float("nan")
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, float("nan"), float("nan")
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
    h = _T975.get(len(xs) - 1, 1.96) * sd / math.sqrt(len(xs))
    return m, m - h, m + h


def _cluster_sums(values: Sequence[float], clusters: Sequence[Hashable]) -> tuple[Any, Any]:
    """Per-cluster sums and counts of the values (clusters numbered in order of first appearance)."""
    import numpy as np

    if len(values) != len(clusters):
        raise ValueError(f"{len(values)} values but {len(clusters)} cluster ids")
    ids: dict[Hashable, int] = {}
    idx = np.array([ids.setdefault(c, len(ids)) for c in clusters], dtype=np.int64)
    sums = np.bincount(idx, weights=np.asarray(values, dtype=np.float64), minlength=len(ids))
    counts = np.bincount(idx, minlength=len(ids)).astype(np.float64)
    return sums, counts


def _resampled_means(values: Sequence[float], clusters: Sequence[Hashable], rng: Any, resamples: int) -> Any:
    """``resamples`` means of the values of clusters drawn with replacement (as many as there are)."""

    sums, counts = _cluster_sums(values, clusters)
    draw = rng.integers(0, len(sums), size=(resamples, len(sums)))  # [resamples, clusters]
    return sums[draw].sum(axis=1) / counts[draw].sum(axis=1)


def cluster_bootstrap(
    values: Sequence[float], clusters: Sequence[Hashable], seed: int = 0, resamples: int = 2000
) -> tuple[float, float, float]:
    """(mean, lower, upper): the mean of ``values`` and the 2.5-97.5 percentiles of its bootstrap in which
    whole clusters (``clusters[i]`` is the cluster of ``values[i]``) are drawn with replacement; bounds NaN
    with fewer than 2 clusters."""
    import numpy as np

    if not len(values):
        return float("nan"), float("nan"), float("nan")
    mean = float(np.mean(np.asarray(values, dtype=np.float64)))
    if len(set(clusters)) < 2:
        _cluster_sums(values, clusters)  # the length check
        return mean, float("nan"), float("nan")
    means = _resampled_means(values, clusters, np.random.default_rng(seed), resamples)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return mean, float(lo), float(hi)


def cluster_bootstrap_diff(
    a: Sequence[float],
    a_clusters: Sequence[Hashable],
    b: Sequence[float],
    b_clusters: Sequence[Hashable],
    seed: int = 0,
    resamples: int = 2000,
) -> tuple[float, float, float]:
    """(mean(a) - mean(b), lower, upper): two independent samples, each resampled by cluster; bounds NaN
    when either sample has fewer than 2 clusters."""
    import numpy as np

    if not len(a) or not len(b):
        return float("nan"), float("nan"), float("nan")
    d = float(np.mean(np.asarray(a, dtype=np.float64)) - np.mean(np.asarray(b, dtype=np.float64)))
    if len(set(a_clusters)) < 2 or len(set(b_clusters)) < 2:
        return d, float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    diffs = _resampled_means(a, a_clusters, rng, resamples) - _resampled_means(b, b_clusters, rng, resamples)
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    return d, float(lo), float(hi)
