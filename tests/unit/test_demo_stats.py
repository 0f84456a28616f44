"""The demo's statistics over seeds against hand-worked values: mean ± sd, the paired
difference's 95% t interval, and compute to match (the interpolation rule)."""

import math

import pytest

from distil.demo.stats import T975, compute_to_match, match_ratio, mean_sd, paired, t975


def test_mean_and_sample_sd():
    assert mean_sd([1.0, 2.0, 3.0]) == (2.0, 1.0)
    mean, sd = mean_sd([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0])
    assert mean == 5.0 and sd == pytest.approx(math.sqrt(32 / 7))
    assert mean_sd([0.4]) == (0.4, None)  # one seed: no spread


def test_paired_difference_interval_by_hand():
    # differences [1, 2, 3]: mean 2, sd 1, half width t_{0.975,2} / sqrt(3) = 4.303 / 1.732
    d = paired([1.5, 2.5, 3.5], [0.5, 0.5, 0.5])
    assert d.mean == pytest.approx(2.0) and d.sd == pytest.approx(1.0) and d.n == 3
    assert d.half_width == pytest.approx(2.484, abs=5e-4)
    assert d.low == pytest.approx(-0.484, abs=5e-4) and d.high == pytest.approx(4.484, abs=5e-4)
    assert d.significant is False and d.verdict == "not significant"


def test_paired_difference_significant_both_ways():
    ahead = paired([3.0, 4.0, 5.0], [1.0, 1.0, 1.0])  # [2, 3, 4]: 3 ± 2.484
    assert ahead.low == pytest.approx(0.516, abs=5e-4) and ahead.verdict == "significant, ahead"
    behind = paired([1.0, 1.0, 1.0], [3.0, 4.0, 5.0])
    assert behind.high == pytest.approx(-0.516, abs=5e-4)
    assert behind.verdict == "significant, behind"
    # two seeds: t_{0.975,1} = 12.706; differences [1, 3]: mean 2, sd sqrt(2)
    two = paired([1.0, 3.0], [0.0, 0.0])
    assert two.half_width == pytest.approx(12.706 * math.sqrt(2) / math.sqrt(2))


def test_one_seed_has_no_interval():
    d = paired([0.6], [0.5])
    assert d.mean == pytest.approx(0.1) and d.half_width is None and d.low is None
    assert d.significant is None and d.verdict == "one seed: no interval"


def test_paired_needs_equal_lengths():
    with pytest.raises(ValueError, match="equal non-empty"):
        paired([1.0, 2.0], [1.0])


def test_t_quantiles_table_and_expansion():
    assert t975(2) == 4.303 and t975(1) == 12.706 and len(T975) == 30
    assert list(T975) == sorted(T975, reverse=True)
    # beyond the table: the expansion against the textbook 40, 60 and 120 dof values
    assert t975(40) == pytest.approx(2.021, abs=1e-3)
    assert t975(60) == pytest.approx(2.000, abs=1e-3)
    assert t975(120) == pytest.approx(1.980, abs=1e-3)
    assert 1.96 < t975(10_000) < 1.961
    with pytest.raises(ValueError):
        t975(0)


CURVE = [(0.0, 0.10), (10.0, 0.30), (20.0, 0.50), (30.0, 0.40)]


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (0.40, 15.0),  # between 10 (0.30) and 20 (0.50): 10 + 0.10 * 10 / 0.20
        (0.30, 10.0),  # exactly on a point: that point
        (0.50, 20.0),
        (0.05, 0.0),  # the start is already there
        (0.10, 0.0),
        (0.51, None),  # never reached
    ],
)
def test_compute_to_match_interpolates_linearly_at_the_first_crossing(target, expected):
    assert compute_to_match(CURVE, target) == (
        None if expected is None else pytest.approx(expected)
    )


def test_compute_to_match_takes_the_first_crossing_not_the_last():
    curve = [(0.0, 0.1), (10.0, 0.5), (20.0, 0.3), (30.0, 0.6)]
    assert compute_to_match(curve, 0.4) == pytest.approx(7.5)  # 0 + 0.3 * 10 / 0.4


def test_match_ratio():
    assert match_ratio(30.0, 15.0) == 2.0  # > 1: distillation needed half the compute
    assert match_ratio(30.0, 60.0) == 0.5
    assert match_ratio(30.0, None) is None
    assert match_ratio(30.0, 0.0) == math.inf
