"""Small, dependency-free statistics for evaluation results.

* :func:`wilson_interval`: confidence interval of a success rate (Wilson 1927), which stays
  inside [0, 1] and behaves at 0/n and n/n, unlike the normal approximation.
* :func:`mean_interval`: Student-t 95% interval of a mean (episode returns of envs without a
  success signal).
* :func:`mcnemar`: paired test of two policies evaluated on the same (task, trial) pairs
  (McNemar 1947): exact two-sided binomial test on the discordant pairs when they are few,
  chi-square with continuity correction (Edwards 1948) otherwise.

Only :mod:`math` is used, so importing this module is free.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Dict, Sequence, Tuple

__all__ = ["Z_95", "wilson_interval", "t_quantile", "mean_interval", "McNemarResult", "mcnemar",
           "EXACT_BELOW"]

Z_95 = 1.959963984540054
"""Two-sided 95% standard-normal quantile."""

EXACT_BELOW = 25
"""McNemar uses the exact binomial test when the discordant count b + c is below this
(the usual rule of thumb; the chi-square approximation is poor for small b + c)."""


def wilson_interval(successes: int, n: int, z: float = Z_95) -> Tuple[float, float]:
    """Wilson score interval of a binomial proportion.

    Args:
        successes: k, number of successes (0 <= k <= n).
        n: number of trials.
        z: standard-normal quantile (default: 95% two-sided).

    Returns:
        ``(low, high)`` in [0, 1]; ``(0.0, 1.0)`` when ``n == 0`` (nothing is known).

    Raises:
        ValueError: if ``successes`` is outside [0, n].
    """
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"wilson_interval needs 0 <= successes <= n (got {successes} and {n}).")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    # k = 0 and k = n give exactly 0 and 1 analytically; clamp the float noise so that
    # ``rate - low`` and ``high - rate`` are never negative.
    low = 0.0 if successes == 0 else min(p, max(0.0, centre - half))
    high = 1.0 if successes == n else max(p, min(1.0, centre + half))
    return low, high


def t_quantile(p: float, df: int) -> float:
    """Quantile of Student's t distribution with ``df`` degrees of freedom.

    Exact closed forms for df = 1 (Cauchy) and df = 2; for df >= 3 the Cornish-Fisher
    expansion around the normal quantile (Abramowitz & Stegun 26.7.5), within 0.2% of the
    exact value at p = 0.975 (12.706, 4.303, 3.182, ... 1.960).

    Raises:
        ValueError: ``p`` outside (0, 1) or ``df < 1``.
    """
    if not 0.0 < p < 1.0 or df < 1:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df >= 1 (got p={p}, df={df}).")
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    from statistics import NormalDist

    z = NormalDist().inv_cdf(p)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


def mean_interval(values: Sequence[float], level: float = 0.95) -> Tuple[float, float, float]:
    """Mean and two-sided Student-t confidence interval of i.i.d. values.

    Args:
        values: n numbers (e.g. episode returns).
        level: confidence level.

    Returns:
        ``(mean, low, high)``; ``(mean, mean, mean)`` for one value or identical values,
        ``(0.0, 0.0, 0.0)`` for none.
    """
    n = len(values)
    if n == 0:
        return 0.0, 0.0, 0.0
    mean = math.fsum(values) / n
    if n == 1:
        return mean, mean, mean
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    half = t_quantile(0.5 + level / 2, n - 1) * math.sqrt(var / n)
    return mean, mean - half, mean + half


@dataclass(frozen=True)
class McNemarResult:
    """Outcome of :func:`mcnemar`.

    Attributes:
        b: pairs where A succeeded and B failed.
        c: pairs where A failed and B succeeded.
        statistic: the chi-square statistic (continuity-corrected), or ``min(b, c)`` for the
            exact test.
        p_value: two-sided p-value.
        method: ``"exact"`` (binomial) or ``"chi2"`` (continuity-corrected).
    """

    b: int
    c: int
    statistic: float
    p_value: float
    method: str

    def to_dict(self) -> Dict[str, object]:
        """Plain-data view for JSON."""
        return asdict(self)


def _binom_cdf_half(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2), exact in integers before the one division."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2.0**n


def mcnemar(b: int, c: int, exact: bool | None = None) -> McNemarResult:
    """McNemar's paired test on the discordant counts of two evaluations.

    Under the null hypothesis (both policies succeed equally often on the shared pairs) each
    discordant pair is a fair coin flip, so ``b ~ Binomial(b + c, 1/2)``.

    Args:
        b: pairs where A succeeded and B failed.
        c: pairs where A failed and B succeeded.
        exact: force the exact binomial test (True) or the chi-square approximation (False);
            None picks exact when ``b + c < EXACT_BELOW``.

    Returns:
        A :class:`McNemarResult`; with no discordant pairs the p-value is 1.

    Raises:
        ValueError: for negative counts.
    """
    if b < 0 or c < 0:
        raise ValueError(f"mcnemar needs non-negative counts (got b={b}, c={c}).")
    n = b + c
    if exact is None:
        exact = n < EXACT_BELOW
    if n == 0:
        return McNemarResult(b, c, 0.0, 1.0, "exact" if exact else "chi2")
    if exact:
        k = min(b, c)
        p = min(1.0, 2.0 * _binom_cdf_half(k, n))
        return McNemarResult(b, c, float(k), p, "exact")
    stat = (abs(b - c) - 1.0) ** 2 / n if abs(b - c) >= 1 else 0.0
    # Survival function of chi-square with one degree of freedom.
    p = math.erfc(math.sqrt(stat / 2.0))
    return McNemarResult(b, c, stat, p, "chi2")
