"""The demo's statistics over seeds against hand-worked values: mean ± sd, the paired
difference's 95% t interval, and compute to match (the interpolation rule)."""

import math

import pytest

from distil.demo.stats import (
    T975,
    compute_to_match,
    holm,
    incomplete_beta,
    match_ratio,
    mean_sd,
    paired,
    t975,
    t_two_sided_p,
)


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


@pytest.mark.parametrize("t", [0.0, 0.3, 1.0, 2.5, 4.303, 12.7, 80.0])
def test_two_sided_p_in_closed_form_for_one_and_two_dof(t):
    """P(|T| >= t): 1 - (2/pi) atan(t) with 1 dof (Cauchy), 1 - t / sqrt(2 + t^2) with 2."""
    assert t_two_sided_p(t, 1) == pytest.approx(1 - 2 / math.pi * math.atan(t), abs=1e-12)
    assert t_two_sided_p(t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), abs=1e-12)
    assert t_two_sided_p(-t, 2) == t_two_sided_p(t, 2)


def test_two_sided_p_at_the_tables_quantiles_is_five_percent():
    for dof in (1, 2, 3, 4, 5, 10, 30):
        assert t_two_sided_p(t975(dof), dof) == pytest.approx(0.05, abs=2e-4), dof


def test_incomplete_beta_limits_and_symmetry():
    assert incomplete_beta(0.0, 2, 3) == 0.0 and incomplete_beta(1.0, 2, 3) == 1.0
    # I_x(1, 1) = x; I_x(a, b) = 1 - I_{1-x}(b, a); I_x(2, 1) = x^2
    assert incomplete_beta(0.37, 1, 1) == pytest.approx(0.37, abs=1e-12)
    assert incomplete_beta(0.3, 2.5, 0.5) == pytest.approx(1 - incomplete_beta(0.7, 0.5, 2.5))
    assert incomplete_beta(0.6, 2, 1) == pytest.approx(0.36, abs=1e-12)


def test_paired_p_value_and_its_edge_cases():
    # differences [1, 2, 3]: t = 2 / (1 / sqrt 3) with 2 dof
    d = paired([1.5, 2.5, 3.5], [0.5, 0.5, 0.5])
    assert d.p_value == pytest.approx(1 - math.sqrt(12 / 14), rel=1e-9)
    assert paired([1.0], [0.5]).p_value is None  # one seed
    assert paired([1.0, 1.0], [1.0, 1.0]).p_value == 1.0  # no difference at all
    assert paired([2.0, 2.0], [1.0, 1.0]).p_value == 0.0  # the same difference every seed


def test_holm_by_hand():
    # sorted 0.01 (x3), 0.03 (x2), 0.04 (x1) -> 0.03, 0.06, 0.06 (monotone), in input order
    assert holm([0.04, 0.01, 0.03]) == pytest.approx([0.06, 0.03, 0.06])
    assert holm([0.5, 0.6]) == [1.0, 1.0]  # capped at 1
    assert holm([0.02]) == [0.02]
