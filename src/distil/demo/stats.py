"""The demo's statistics over seeds: mean and standard deviation per row, the paired
difference of a distilled student to a control of the same seed with its 95% confidence
interval (Student's t, N-1 degrees of freedom), and the student compute at which a distilled
student's curve first reaches an accuracy (compute to match). Pure functions, no scipy."""

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
