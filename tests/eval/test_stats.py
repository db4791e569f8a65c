"""Wilson intervals and McNemar's test against published / independently computed values."""

import math

import pytest
from rlinf_embodied.eval.stats import mcnemar, wilson_interval


@pytest.mark.parametrize("k,n,low,high", [
    # Newcombe (1998), Statistics in Medicine 17:857, Table I, method 3 (Wilson, no correction).
    (81, 263, 0.2553, 0.3662),
    (15, 148, 0.0624, 0.1605),
    (0, 20, 0.0, 0.1611),
    (1, 29, 0.0061, 0.1718),
    # statsmodels proportion_confint(8, 10, method="wilson")
    (8, 10, 0.4902, 0.9433),
])
def test_wilson_known_values(k, n, low, high):
    lo, hi = wilson_interval(k, n)
    assert lo == pytest.approx(low, abs=1e-4)
    assert hi == pytest.approx(high, abs=1e-4)


def test_wilson_edges_and_scipy():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert wilson_interval(50, 50)[1] == 1.0
    scipy_stats = pytest.importorskip("scipy.stats")
    for k, n in [(3, 7), (49, 50), (12, 40)]:
        ci = scipy_stats.binomtest(k, n).proportion_ci(0.95, method="wilson")
        assert wilson_interval(k, n) == pytest.approx((ci.low, ci.high), abs=1e-9)
    with pytest.raises(ValueError, match="0 <= successes <= n"):
        wilson_interval(5, 3)


def test_mcnemar_exact_small_counts():
    r = mcnemar(2, 8)
    assert r.method == "exact"
    assert r.p_value == pytest.approx(2 * (1 + 10 + 45) / 1024)  # 0.109375
    assert mcnemar(1, 5).p_value == pytest.approx(2 * 7 / 64)
    assert mcnemar(3, 3).p_value == 1.0
    assert mcnemar(0, 0).p_value == 1.0
    scipy_stats = pytest.importorskip("scipy.stats")
    for b, c in [(0, 6), (4, 11), (9, 3)]:
        assert mcnemar(b, c, exact=True).p_value == pytest.approx(
            scipy_stats.binomtest(b, b + c, 0.5).pvalue, rel=1e-12)


def test_mcnemar_chi2_large_counts():
    # Agresti, Categorical Data Analysis: presidential approval, b=150, c=86.
    r = mcnemar(150, 86)
    assert r.method == "chi2"
    assert r.statistic == pytest.approx(63 ** 2 / 236)
    assert r.p_value == pytest.approx(math.erfc(math.sqrt(63 ** 2 / 236 / 2)))
    assert r.p_value == pytest.approx(4.1e-5, rel=0.05)
    with pytest.raises(ValueError):
        mcnemar(-1, 2)
