"""Convergence profiles (what `simfed calibrate --convergence` writes and a scenario's
`convergence.profile` holds), validated before use: every key known, every number finite and in
its physical range; a mistake is one line naming the key and the value.

Two models, two forms:
- noise_progress (schema simfed.convergence_profile/1): params of model.py, fitted on one model
  size, one learning rate and one data set;
- scaling (schema simfed.convergence_profile/2): params of scaling.py, fitted across model sizes,
  learning rates, batches, groups and periods; its fitted range says where."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, StrictBool

from ..spec import SpecError
from ..spec.models import FrozenModel
from . import model as noise_model
from . import scaling

PROFILE_V1 = "simfed.convergence_profile/1"
PROFILE_V2 = "simfed.convergence_profile/2"


def _finite(v: float) -> float:
    if not math.isfinite(v):
        raise ValueError(f"must be a finite number, got {v}")
    return v


Num = Annotated[float, AfterValidator(_finite)]
Matrix = list[list[Num]]
Pair = Annotated[list[Num], Field(min_length=2, max_length=2)]


def _ordered_positive(v: list[float]) -> list[float]:
    if v[0] <= 0 or v[1] < v[0]:
        raise ValueError(f"a range [low, high] with 0 < low <= high, got {v}")
    return v


Range = Annotated[Pair, AfterValidator(_ordered_positive)]  # a fitted range of a quantity


class NoiseProgressParams(FrozenModel):
    log_progress_scale: Num = Field(ge=-20, le=20)
    exponent: Num = Field(gt=0, le=10)
    log_noise_tokens: Num = Field(ge=-20, le=40)
    noise_exponent: Num = Field(ge=0, le=10)
    fl_rho1: Num = Field(ge=0, le=1)
    log_fl_kappa: Num = Field(ge=-20, le=20)
    loss_floor: Num = Field(ge=0, le=100)


class FittedRangeV1(FrozenModel):
    model: str | None = None
    model_params: Num | None = Field(None, gt=0)
    vocab: int | None = Field(None, ge=2)
    data: str | None = None
    seq_len: int | None = Field(None, ge=1)
    lr: Num | None = Field(None, gt=0)
    optimizer: str | None = None
    batch_tokens: Range | None = None
    groups: Range | None = None
    aggregate_every: Range | None = None
    steps: Range | None = None


class ProfileV1(FrozenModel):
    schema_: Literal["simfed.convergence_profile/1"] = Field(PROFILE_V1, alias="schema")
    model: Literal["noise_progress"] = "noise_progress"
    source: str = "inline"
    loss_init: Num | None = Field(None, gt=0, le=100)
    params: NoiseProgressParams
    covariance: Matrix | None = None
    draws: Matrix = Field(default_factory=list)
    residual_sd: Num = Field(0.0, ge=0, le=10)
    rms_error: Num | None = Field(None, ge=0)
    fitted_range: FittedRangeV1 = FittedRangeV1()


class ScalingParams(FrozenModel):
    log_lr_star: Num = Field(ge=math.log(1e-8), le=math.log(100))
    lr_size_exponent: Num = Field(ge=-2, le=3)
    log_noise_star: Num = Field(ge=-10, le=60)
    noise_loss_exponent: Num = Field(ge=0, le=20)
    log_progress_scale: Num = Field(ge=-20, le=30)
    exponent: Num = Field(gt=0, le=10)
    progress_size_exponent: Num = Field(ge=-3, le=3)
    loss_floor: Num = Field(ge=0, le=100)
    log_floor_coef: Num = Field(ge=-30, le=10)
    floor_size_exponent: Num = Field(ge=0, le=3)
    log_fl_kappa: Num = Field(ge=-20, le=20)
    unigram_loss: Num = Field(ge=0, le=100)
    log_unigram_scale: Num = Field(ge=-20, le=20)
    log_unigram_lr_star: Num = Field(ge=math.log(1e-8), le=math.log(100))
    # the learning rate's tail above its optimum (1: the lorentzian of profiles without it)
    lr_tail: Num = Field(1.0, ge=0.55, le=4)
    # its size dependence, gamma(N) = gamma (N / 1e6)^-t (0: the same at every size)
    lr_tail_size_exponent: Num = Field(0.0, ge=-2, le=2)
    # the persistent damage of a step above its optimum (0: none, as profiles without it)
    lr_damage: Num = Field(0.0, ge=0, le=100)


class FittedRangeV2(FrozenModel):
    data: str
    vocab: int = Field(ge=2)
    seq_len: Range
    non_embedding_params: Range
    lr: Range
    batch_tokens: Range
    groups: Range
    aggregate_every: Range
    steps: Range
    loss: Range
    optimizer: str = "adamw"
    outer: list[str] = Field(default_factory=lambda: ["average"])


class Check(FrozenModel):
    """A held-out check of the profile's model (what the "how sure" line reports)."""

    what: str
    fit: str
    check: str
    points: int = Field(ge=0)
    median_abs_error: Num | None = Field(None, ge=0)
    worst_abs_error: Num | None = Field(None, ge=0)
    inside_band: Num | None = Field(None, ge=0, le=1)
    # the same share with a band open above (its p90 never reaches the target) counted outside
    inside_closed_band: Num | None = Field(None, ge=0, le=1)
    # targets the model has a check run reach and the run never reached (not in the median),
    # and the median with each counted at its least error (1 - predicted / the run's steps)
    unreached: int = Field(0, ge=0)
    median_abs_error_with_unreached: Num | None = Field(None, ge=0)
    # the check set had been looked at before the model scored on it was fixed: development
    # data, not a held-out measurement (the "how sure" line says so)
    seen: StrictBool = False


def closed_note(c: dict[str, Any]) -> str:
    """A check's inside share with bands open above counted outside, where it differs."""
    closed = c.get("inside_closed_band")
    if closed is None or closed == c.get("inside_band"):
        return ""
    return f" ({closed:.0%} with a band open above counted outside)"


def unreached_note(check: dict[str, Any]) -> str:
    """What a check's median leaves out, for its report line: '' when nothing."""
    n = check.get("unreached") or 0
    if not n:
        return ""
    with_them = check.get("median_abs_error_with_unreached")
    return (f"; {n} target{'s' if n > 1 else ''} the model has reached and the run never "
            "reached, not scored" + (f" (counted at their least error: median "
                                     f"{with_them:.0%})" if with_them is not None else ""))


class ProfileV2(FrozenModel):
    schema_: Literal["simfed.convergence_profile/2"] = Field(PROFILE_V2, alias="schema")
    model: Literal["scaling"] = "scaling"
    source: str
    params: ScalingParams
    covariance: Matrix
    draws: Matrix = Field(default_factory=list)
    residual_sd: Num = Field(ge=0, le=10)
    # the sd of ln f, f the factor on a run's progress that fits it best
    # (fitting.progress_factors): the band draws it; without it (profiles fitted before it)
    # the band draws a constant loss shift of residual_sd
    progress_sd: Num | None = Field(None, ge=0, le=10)
    # where progress_sd is the spread held-out checks met (their check runs' ln f), the fit
    # runs' own spread and which checks it came from
    fit_progress_sd: Num | None = Field(None, ge=0, le=10)
    progress_sd_from: str | None = None
    rms_error: Num = Field(ge=0, le=10)
    on_bound: list[str] = Field(default_factory=list)
    fitted_range: FittedRangeV2
    checks: list[Check] = Field(default_factory=list)


# parameters added to the scaling model after profiles were shipped, last in PARAMS: a profile
# fitted before them has shorter covariance and draw rows and reads as their defaults
OPTIONAL_SCALING = ("lr_tail", "lr_tail_size_exponent", "lr_damage")


def padded_length(n: int, cov_rows: list[int], draw_rows: list[int]) -> int | None:
    """The row length of a profile fitted before the trailing optional parameters (every row
    that long, the covariance square), or None."""
    rows = set(cov_rows + draw_rows)
    if len(rows) != 1:
        return None
    have = rows.pop()
    ok = n - len(OPTIONAL_SCALING) <= have < n and len(cov_rows) in (0, have)
    return have if ok else None


def _pad_optional(p: ProfileV2, n: int) -> ProfileV2:
    """Covariance and draws of a profile fitted before the trailing optional parameters:
    the missing ones at their default, without variance."""
    have = padded_length(n, [len(r) for r in p.covariance], [len(r) for r in p.draws])
    if have is None:
        return p
    fill = [ScalingParams.model_fields[k].default for k in scaling.PARAMS[have:]]
    cov = [[*r, *([0.0] * (n - have))] for r in p.covariance]
    cov += [[0.0] * n for _ in range(n - have)] if cov else []
    draws = [[*r, *fill] for r in p.draws]
    return p.model_copy(update={"covariance": cov, "draws": draws})


def parse(prof: Any, model: str, where: str = "convergence.profile") -> Any:
    """A profile for `model`, validated (SpecError naming the key on a mistake)."""
    if not isinstance(prof, dict):
        raise SpecError(f"{where}: expected a mapping (a fitted profile), got "
                        f"{type(prof).__name__}")
    cls = ProfileV2 if model == "scaling" else ProfileV1
    if model == "scaling" and prof.get("model", "scaling") != "scaling":
        raise SpecError(f"{where}: a {prof.get('model')!r} profile, but convergence.model is "
                        "scaling (fit one with `simfed calibrate --convergence` on size-study "
                        "files)")
    if model == "noise_progress" and prof.get("model", "noise_progress") != "noise_progress":
        raise SpecError(f"{where}: a {prof.get('model')!r} profile, but convergence.model is "
                        "noise_progress")
    try:
        p = cls.parse(prof)
    except SpecError as exc:  # "params.exponent: ..." -> "convergence.profile.params.exponent"
        raise SpecError(f"{where}.{exc}" if where else str(exc)) from None
    n = len(scaling.PARAMS) if model == "scaling" else len(noise_model.PARAMS)
    if model == "scaling":
        p = _pad_optional(p, n)
    for key in ("covariance", "draws"):
        m = getattr(p, key)
        if m and any(len(row) != n for row in m):
            raise SpecError(f"{where}.{key}: every row must have {n} values (one per parameter)")
    if p.covariance is not None and p.covariance and len(p.covariance) != n:
        raise SpecError(f"{where}.covariance: expected {n} x {n}, got {len(p.covariance)} rows")
    if model == "scaling":
        unknown = [k for k in p.on_bound if k not in scaling.IDX]
        if unknown:
            raise SpecError(f"{where}.on_bound: unknown parameter {unknown[0]!r}")
    return p
