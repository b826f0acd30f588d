"""Convergence: which algorithm reaches a target loss first, in wall-clock time, and how sure
that is. Torch-free; pluggable by name (`convergence.model` in a scenario).

Time to target = the simulated step times summed over the steps the convergence model predicts
(Pollux's goodput: throughput x statistical efficiency, Qiao et al. 2021). The model (see
`model.py`) predicts evaluation loss against optimizer steps from the batch per model copy, the
number of federation groups G, the FedAvg period K and the learning-rate schedule; its profile is
fitted from `realrun converge-study` measurements by `simfed calibrate --convergence`.

Uncertainty: `samples` parameter vectors, the profile's bootstrap refits (the fit repeated on
runs resampled with replacement) or else draws from the fit's covariance (a seeded generator:
deterministic), each shifted by a draw of the fit's residual spread (seed-to-seed and model
error), give a band; steps and time to target are reported as the point prediction and [p10,
p90]. A federated run's model exists only after a FedAvg round, so its steps to target are
rounded up to the next round (every K steps, and the last step).

Extrapolation is never silent: every quantity of the scenario outside the profile's fitted range
(batch, groups, K, steps, sequence length, model, data, learning rate) is listed in the output
and printed with the table.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..spec import Scenario, SpecError
from . import predict
from .model import FLOOR, PARAMS, RunShape, loss_curves
from .profile import parse

MODELS = {"noise_progress": loss_curves}  # name -> loss_curves(theta, loss_init, shape)
QUANTILES = (0.1, 0.5, 0.9)


def _profile_vector(prof: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    where = "convergence.profile"
    params = prof.get("params")
    if not isinstance(params, dict):
        raise SpecError(f"{where}.params: missing (fit one with `simfed calibrate "
                        "--convergence results/convergence/NAME.json`)")
    missing = [p for p in PARAMS if p not in params]
    if missing:
        raise SpecError(f"{where}.params: {missing[0]} missing; a noise_progress profile has "
                        f"{', '.join(PARAMS)}")
    x = np.array([float(params[p]) for p in PARAMS])
    cov = np.array(prof.get("covariance") or np.zeros((len(PARAMS), len(PARAMS))), float)
    if cov.shape != (len(PARAMS), len(PARAMS)) or not np.isfinite(cov).all():
        raise SpecError(f"{where}.covariance: expected a finite {len(PARAMS)} x {len(PARAMS)} "
                        f"matrix, got shape {cov.shape}")
    if not np.isfinite(x).all():
        raise SpecError(f"{where}.params: every parameter must be finite")
    return x, cov


def _draws(prof: dict[str, Any], x: np.ndarray, cov: np.ndarray, n: int,
           rng: np.random.Generator) -> np.ndarray:
    """n parameter vectors: the profile's bootstrap refits (cycled), or else draws from the
    fit's covariance. Floors are shifted with the point estimate's (see `_loss_scale`)."""
    boot = np.array(prof.get("draws") or [], float)
    if boot.ndim == 2 and boot.shape[1] == len(PARAMS) and len(boot):
        if not np.isfinite(boot).all():
            raise SpecError("convergence.profile.draws: every value must be finite")
        raw = float(prof["params"]["loss_floor"])
        out = boot[np.arange(n) % len(boot)].copy()
        out[:, FLOOR] = x[FLOOR] + (out[:, FLOOR] - raw)
        return out
    return rng.multivariate_normal(np.zeros(len(PARAMS)), cov, size=n, method="eigh") + x


def _loss_scale(scn: Scenario, prof: dict[str, Any], x: np.ndarray) -> tuple[float, float]:
    """(loss_init, loss_floor) for this scenario: the profile's own, or with `transfer` the
    scenario model's untrained loss ln(vocab) and the stated floor."""
    c, rng = scn.convergence, prof.get("fitted_range", {})
    if c.transfer:
        if c.loss_floor <= 0:
            raise SpecError("convergence.loss_floor: transfer needs the target data's loss "
                            "floor (nats/token), e.g. 1.8; got 0")
        init = math.log(scn.model.vocab)
        if c.loss_floor >= init:
            raise SpecError(f"convergence.loss_floor: {c.loss_floor} is not below the untrained "
                            f"loss ln(vocab {scn.model.vocab}) = {init:.3f}")
        return init, c.loss_floor
    vocab = rng.get("vocab")
    if vocab is not None and vocab != scn.model.vocab:
        raise SpecError(
            f"convergence.profile: fitted for model {rng.get('model')} (vocab {vocab}) but the "
            f"scenario's model {scn.model.name} has vocab {scn.model.vocab}; fit a profile for "
            "this model, or set convergence.transfer: true and convergence.loss_floor")
    init = prof.get("loss_init")  # absent or null: the untrained loss ln(vocab)
    return float(math.log(scn.model.vocab) if init is None else init), float(x[FLOOR])


def target_loss(scn: Scenario) -> float | None:
    c = scn.convergence  # both targets at once are refused when the scenario loads
    if c.target_perplexity:
        return math.log(c.target_perplexity)
    return c.target_loss or None


def extrapolation(scn: Scenario, prof: dict[str, Any], shapes: list[RunShape]) -> list[str]:
    """One line per quantity outside the profile's fitted range."""
    r = prof.get("fitted_range", {})
    t, m = scn.training, scn.model
    out = []

    def span(name: str, values: list[float], rng: list[float] | None, fmt: str = "g") -> None:
        if not rng:
            return
        lo, hi = rng
        bad = [v for v in values if v < lo or v > hi]
        if bad:
            out.append(f"{name} {format(max(bad, key=lambda v: abs(v)), fmt)} outside the "
                       f"fitted {format(lo, fmt)}..{format(hi, fmt)}")

    span("tokens per step (all groups)", [s.batch_tokens * s.groups for s in shapes],
         r.get("batch_tokens"))
    span("groups", [s.groups for s in shapes], r.get("groups"))
    span("K", [s.aggregate_every for s in shapes if s.groups > 1], r.get("aggregate_every"))
    span("steps", [t.steps], r.get("steps"))
    if r.get("seq_len") and r["seq_len"] != t.seq_len:
        out.append(f"sequence length {t.seq_len} (fitted at {r['seq_len']})")
    if r.get("model_params") and r["model_params"] != m.total_params:
        out.append(f"model {m.name} ({m.total_params:.3g} params; fitted on {r.get('model')}, "
                   f"{r['model_params']:.3g})")
    if r.get("data") and r["data"] != scn.data.source and not scn.convergence.transfer:
        out.append(f"data {scn.data.source} (fitted on {r['data']})")
    if scn.convergence.transfer:
        out.append(f"losses transferred from {r.get('model')} on {r.get('data')} data: untrained "
                   f"ln(vocab), floor {scn.convergence.loss_floor} as stated")
    if r.get("lr") and not math.isclose(r["lr"], t.lr):
        out.append(f"learning rate {t.lr:g} (fitted at {r['lr']:g})")
    if r.get("optimizer") and r["optimizer"] != t.optimizer:
        out.append(f"optimizer {t.optimizer} (fitted with {r['optimizer']})")
    return out


def attach(scn: Scenario, out: dict[str, Any]) -> None:
    """Add time to target and loss predictions to `out` (simfed.engine.simulate's result)."""
    c = scn.convergence
    if c.model == "none":
        return
    if c.model == "scaling":
        predict.attach(scn, out, target_loss(scn))
        return
    if c.model not in MODELS:
        raise SpecError(f"convergence.model: {c.model!r}; expected none, scaling or "
                        f"{', '.join(MODELS)}")
    curves_of = MODELS[c.model]
    # the values as checked (pydantic's lax mode reads "12" as 12), only the keys given
    prof = parse(c.profile or {}, c.model).model_dump(by_alias=True, exclude_unset=True)
    x, cov = _profile_vector(prof)
    loss_init, floor = _loss_scale(scn, prof, x)
    x = x.copy()
    x[FLOOR] = floor
    target = target_loss(scn)
    predict.check_target(target, floor, loss_init)
    rng = np.random.default_rng([scn.seed, 0xC0])
    draws = _draws(prof, x, cov, c.samples, rng)
    draws[:, FLOOR] = np.minimum(draws[:, FLOOR], loss_init - 1e-3)
    for name, lo, hi in (("exponent", 1e-3, np.inf), ("noise_exponent", 0.0, np.inf),
                         ("fl_rho1", 0.0, 1.0)):
        j = PARAMS.index(name)
        draws[:, j] = np.clip(draws[:, j], lo, hi)
    shift = rng.normal(0.0, float(prof.get("residual_sd", 0.0)), size=(c.samples, 1))
    t = scn.training
    shapes = []
    for a in out["algorithms"]:
        shape = RunShape(batch_tokens=a["global_batch_sequences"] * t.seq_len,
                         groups=a["models"], aggregate_every=a["aggregate_every"],
                         steps=t.steps, warmup_steps=t.warmup_steps, schedule=t.lr_schedule)
        shapes.append(shape)
        curves = curves_of(np.vstack([x, draws]), loss_init, shape)  # one integration
        point, band = curves[0], curves[1:] + shift
        q = np.quantile(band, QUANTILES, axis=0)
        res: dict[str, Any] = {
            "loss_final": float(point[-1]), "perplexity_final": math.exp(point[-1]),
            "loss_final_interval": [float(q[0, -1]), float(q[2, -1])],
            "batch_tokens_per_model": shape.batch_tokens,
            "loss_curve": [round(float(v), 5) for v in point],  # after 0..steps steps
            "loss_curve_p10": [round(float(v), 5) for v in q[0]],
            "loss_curve_p90": [round(float(v), 5) for v in q[2]],
        }
        k = shape.aggregate_every if shape.groups > 1 else 0
        tokens_step = out["tokens_per_step"]
        if target is not None:
            predict.targets_into(a, point, band, target, k, t.steps, tokens_step, res)
        a["convergence"] = res
    first = predict.first_to_target(out["algorithms"]) if target is not None else None
    out["convergence"] = {
        "model": c.model, "target_loss": target,
        "target_perplexity": math.exp(target) if target is not None else None,
        "loss_init": loss_init, "loss_floor": floor,
        "profile_source": prof.get("source", "inline"),
        "first_to_target": first,
        "band": f"p10..p90 of {c.samples} parameter draws (bootstrap refits, or the fit's "
                "covariance) plus its residual spread",
        "rule": predict.RULE,
        "extrapolation": extrapolation(scn, prof, shapes),
    }
