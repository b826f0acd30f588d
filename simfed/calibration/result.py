"""A calibration fit's result: its parameters with 95% intervals, whether the samples identify
each (`simfed.calibration.fit` uses only those), the covariance for prediction intervals."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_Z95 = 1.96


@dataclass
class Param:
    name: str
    value: float
    ci95: tuple[float, float]
    unit: str

    def __post_init__(self) -> None:  # plain floats (YAML/JSON), never numpy scalars
        self.value = float(self.value)
        self.ci95 = (float(self.ci95[0]), float(self.ci95[1]))

    def as_dict(self) -> dict[str, Any]:
        return {"value": self.value, "ci95": list(self.ci95), "unit": self.unit}


# A parameter is used for prediction only if the samples identify it: its 95% interval's
# half-width is at most this share of its value (a wider interval, an undefined one, or one the
# samples leave unconstrained: it stays at its physical or configured value, and the report's
# `not_used` says so). One rule for every fit, chosen before the held-out check set was run.
MAX_REL_HALF_WIDTH = 0.5
# the least relative scatter a timing is taken to have when computing intervals (a fit that
# happens to go through its points exactly still cannot tell apart what the samples confound)
MIN_REL_SCATTER = 0.01


@dataclass
class FitResult:
    kind: str
    params: list[Param] = field(default_factory=list)
    residuals: list[dict[str, Any]] = field(default_factory=list)  # label, measured, predicted
    note: str = ""
    # parameters the samples do not identify: name -> {value, ci95, unit, reason, kept}, left
    # out of `params` (so out of the profile: the scenario's own value stands)
    not_used: dict[str, dict[str, Any]] = field(default_factory=dict)
    # covariance of the used parameters (in their units, ordered as `cov_names`); parameters
    # without one are drawn independently from their 95% intervals (`draw`)
    cov: np.ndarray | None = None
    cov_names: list[str] = field(default_factory=list)

    def drop_unidentified(self, kept: dict[str, str] | None = None,
                          force: tuple[str, ...] = ()) -> None:
        """Move every parameter whose interval is wide or undefined to `not_used` (but those
        whose name starts with one of `force`: used whatever their interval)."""
        for p in list(self.params):
            why = "" if p.name.startswith(force) and force else unidentified(p)
            if why:
                self.leave_out(p, why, (kept or {}).get(p.name, "the scenario's value"))

    def leave_out(self, p: Param, reason: str, kept: str) -> None:
        self.params = [q for q in self.params if q.name != p.name]
        self.not_used[p.name] = {**p.as_dict(), "reason": reason, "kept": kept}
        if p.name in self.cov_names and self.cov is not None:
            i = self.cov_names.index(p.name)
            self.cov = np.delete(np.delete(self.cov, i, 0), i, 1)
            self.cov_names.pop(i)

    def draw(self, rng: np.random.Generator) -> FitResult:
        """A copy with its used parameters drawn from the fit's uncertainty: jointly from
        `cov` where the fit has one, else each from a normal whose 95% interval is its own;
        a draw never crosses zero (rates, times and factors are positive: folded at 1% of the
        value)."""
        vals = {p.name: p.value for p in self.params}
        if self.cov is not None and self.cov_names:
            mean = np.array([vals[n] for n in self.cov_names])
            got = rng.multivariate_normal(mean, self.cov, method="eigh")
            vals.update(zip(self.cov_names, (float(v) for v in got), strict=True))
        for p in self.params:
            if p.name in self.cov_names:
                continue
            sd = (p.ci95[1] - p.ci95[0]) / (2 * _Z95)
            if math.isfinite(sd) and sd > 0:
                vals[p.name] = p.value + sd * float(rng.standard_normal())
        out = dataclasses.replace(self, params=[
            Param(p.name, max(vals[p.name], 0.01 * p.value) if p.value > 0 else vals[p.name],
                  p.ci95, p.unit) for p in self.params])
        return out

    @property
    def rms_rel_error(self) -> float:
        if not self.residuals:
            return float("nan")
        errs = [r["rel_error"] for r in self.residuals]
        return math.sqrt(sum(e * e for e in errs) / len(errs))

    def as_dict(self) -> dict[str, Any]:
        return {
            "params": {p.name: p.as_dict() for p in self.params},
            "not_used": self.not_used,
            "n": len(self.residuals),
            "rms_rel_error": self.rms_rel_error,
            "max_abs_rel_error": max((abs(r["rel_error"]) for r in self.residuals), default=None),
            "residuals": self.residuals,
            "note": self.note,
        }


def ci95(value: float, se: float) -> tuple[float, float]:
    if not math.isfinite(se):
        return (float("nan"), float("nan"))
    return (value - _Z95 * se, value + _Z95 * se)


def unidentified(p: Param) -> str:
    """Why the samples do not identify `p` ("" if they do)."""
    lo, hi = p.ci95
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "no 95% interval (the samples do not constrain it, or too few cases)"
    half = (hi - lo) / 2
    if p.value == 0 and half == 0:
        return ""
    if p.value == 0 and hi < 0:
        return f"the samples put it below 0 (95% interval {lo:.4g}..{hi:.4g}): none"
    if half > MAX_REL_HALF_WIDTH * abs(p.value):
        return (f"95% interval {lo:.4g}..{hi:.4g} {p.unit} is wider than "
                f"+-{MAX_REL_HALF_WIDTH:.0%} of {p.value:.4g}")
    return ""


def covariance(jac: np.ndarray, s2: float) -> np.ndarray:
    """(J^T J)^-1 s2, with an infinite variance for every parameter with weight in a direction
    the samples do not constrain (J^T J singular there: pinv would hide it as 0)."""
    jtj = jac.T @ jac
    w, v = np.linalg.eigh(jtj)
    tol = max(float(np.max(w)), 0.0) * 1e-10
    null = w <= tol
    inv_w = np.where(null, 0.0, 1.0 / np.where(null, 1.0, w))
    cov = (v * inv_w) @ v.T * s2
    loose = np.any((v[:, null] ** 2) > 1e-6, axis=1) if np.any(null) else \
        np.zeros(len(w), dtype=bool)
    cov[loose, :] = np.inf
    cov[:, loose] = np.inf
    return cov
