"""The demo's statistics over seeds: mean and standard deviation per row, the paired
difference of a distilled student to a control of the same seed with its 95% confidence
interval and two-sided p-value (Student's t, N-1 degrees of freedom), Holm's correction of
several such p-values, and the student compute at which a distilled student's curve first
reaches an accuracy (compute to match). Pure functions, no scipy."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# t_{0.975, dof}: the two-sided 95% quantile of Student's t, dof 1..30 (standard tables)
T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
Z975 = 1.959964


def t975(dof: int) -> float:
    """t_{0.975, dof}: the table up to 30 dof, beyond it the Cornish-Fisher expansion
    z + (z^3 + z) / (4 dof) + (5 z^5 + 16 z^3 + 3 z) / (96 dof^2) (within 0.001 there)."""
    if dof < 1:
        raise ValueError(f"a t quantile needs at least 1 degree of freedom, got {dof}")
    if dof <= len(T975):
        return T975[dof - 1]
    z = Z975
    return z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)


def mean_sd(values: Sequence[float]) -> tuple[float, float | None]:
    """The mean and the sample standard deviation (n - 1); sd None for one value."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_sd of no values")
    mean = sum(values) / n
    if n == 1:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


@dataclass(frozen=True)
class Paired:
    """a - b over the seeds: mean, sd, n and the 95% interval mean ± half_width (None for one
    seed). `significant`: the interval excludes 0."""

    mean: float
    sd: float | None
    n: int
    half_width: float | None

    @property
    def low(self) -> float | None:
        return None if self.half_width is None else self.mean - self.half_width

    @property
    def high(self) -> float | None:
        return None if self.half_width is None else self.mean + self.half_width

    @property
    def significant(self) -> bool | None:
        if self.half_width is None:
            return None
        return self.low > 0 or self.high < 0

    @property
    def p_value(self) -> float | None:
        """Two-sided p of the paired t test of mean 0 (None for one seed)."""
        if self.sd is None:
            return None
        if self.sd == 0:
            return 1.0 if self.mean == 0 else 0.0
        return t_two_sided_p(self.mean / (self.sd / math.sqrt(self.n)), self.n - 1)

    @property
    def verdict(self) -> str:
        if self.significant is None:
            return "one seed: no interval"
        if not self.significant:
            return "not significant"
        return "significant, ahead" if self.mean > 0 else "significant, behind"


def paired(a: Sequence[float], b: Sequence[float]) -> Paired:
    """The paired difference a_i - b_i (same seed i) with its 95% t interval."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired differences need equal non-empty lists, got {len(a)}, {len(b)}")
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    mean, sd = mean_sd(diffs)
    n = len(diffs)
    half = None if sd is None else t975(n - 1) * sd / math.sqrt(n)
    return Paired(mean, sd, n, half)


def compute_to_match(curve: Sequence[tuple[float, float]], target: float) -> float | None:
    """The compute at which `curve` ((compute, accuracy) points in order of compute) first
    reaches `target`. Rule: the first point i with accuracy >= target; if i is the first point,
    its compute; else linear interpolation between points i-1 (below target) and i:
    x_{i-1} + (target - y_{i-1}) (x_i - x_{i-1}) / (y_i - y_{i-1}). None: never reached."""
    for i, (x, y) in enumerate(curve):
        if y >= target:
            if i == 0:
                return float(x)
            x0, y0 = curve[i - 1]
            return x0 + (target - y0) * (x - x0) / (y - y0)
    return None


def match_ratio(control_compute: float, distilled_compute: float | None) -> float | None:
    """control / distilled compute (> 1: distillation needed less); None: never reached,
    inf: reached at its start (no compute)."""
    if distilled_compute is None:
        return None
    if distilled_compute <= 0:
        return math.inf
    return control_compute / distilled_compute


def t_two_sided_p(t: float, dof: int) -> float:
    """P(|T| >= |t|) for Student's t with `dof` degrees of freedom: the regularized incomplete
    beta I_x(dof/2, 1/2) at x = dof / (dof + t^2)."""
    if dof < 1:
        raise ValueError(f"a t test needs at least 1 degree of freedom, got {dof}")
    return incomplete_beta(dof / (dof + t * t), dof / 2, 0.5)


def incomplete_beta(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (modified
    Lentz), on the side of x where it converges fast (I_x(a, b) = 1 - I_{1-x}(b, a))."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"incomplete_beta needs 0 <= x <= 1, got {x}")
    if x in (0.0, 1.0):
        return x
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
        + a * math.log(x) + b * math.log1p(-x)
    )  # fmt: skip
    if x > (a + 1) / (a + b + 2):
        return 1.0 - incomplete_beta(1.0 - x, b, a)
    return math.exp(log_front) * _beta_fraction(x, a, b) / a


def _beta_fraction(x: float, a: float, b: float, eps: float = 1e-15) -> float:
    # 1 / (1 + d1 / (1 + d2 / (1 + ...))), d_{2m+1} = -(a+m)(a+b+m) x / ((a+2m)(a+2m+1)),
    # d_{2m} = m (b-m) x / ((a+2m-1)(a+2m))
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= c * d
        if abs(c * d - 1.0) < eps:
            break
    return h


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error rate): sorted ascending, the i-th
    smallest (from 0) times (m - i), made monotone, capped at 1; returned in the input order."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
