"""Small, dependency-free statistics for evaluation results.

* :func:`wilson_interval`: confidence interval of a success rate (Wilson 1927), which stays
  inside [0, 1] and behaves at 0/n and n/n, unlike the normal approximation.
* :func:`mcnemar`: paired test of two policies evaluated on the same (task, trial) pairs
  (McNemar 1947): exact two-sided binomial test on the discordant pairs when they are few,
  chi-square with continuity correction (Edwards 1948) otherwise.

Only :mod:`math` is used, so importing this module is free.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Dict, Tuple

__all__ = ["Z_95", "wilson_interval", "McNemarResult", "mcnemar", "EXACT_BELOW"]

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
    # Clamp float noise at the ends (k = 0 or k = n give exactly 0 or 1 analytically).
    return max(0.0, centre - half), min(1.0, centre + half)


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
