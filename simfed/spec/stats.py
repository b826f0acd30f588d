"""Small statistics shared by the simulator and realrun (realrun may import only `simfed.spec`)."""

from __future__ import annotations

import math
from functools import cache

import numpy as np
from scipy import special


@cache
def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normal draws] (0 for one; 0.5642 for two, 1.0294 for
    four), by quadrature of n x phi(x) Phi(x)^(n-1)."""
    if n < 2:
        return 0.0
    x = np.linspace(-12.0, 12.0, 24001)
    pdf = np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1.0 + special.erf(x / math.sqrt(2)))
    return float(np.sum(x * n * pdf * cdf ** (n - 1)) * (x[1] - x[0]))


def expected_range_normal(n: int) -> float:
    """E[max - min of n independent standard normal draws] (Tippett's d2: 1.128 for two, 2.059
    for four): twice the expected maximum, by symmetry."""
    return 2.0 * expected_max_normal(n)
