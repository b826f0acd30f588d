"""Time to target with the scaling model (scaling.py): the scenario's model size, tokens per step,
learning-rate schedule, groups and period are the model's inputs; the profile holds what was
fitted (and where); the scenario may replace the data's constants (another corpus and
tokenizer: convergence.data_constants) and says so.

When a federated run reaches the target: the model of a run that averages every K steps is
evaluated as the groups' mean, so it reaches the target at the step where that mean does. A user
stops there: if the step is not a scheduled FedAvg round, the groups are averaged once more
before evaluation, so the time to target is the step times up to that step plus one FedAvg
(`aggregation_per_event_s`). Every algorithm's steps, tokens and time to target, its band, the
winner and the figure's markers come from that one rule."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..spec import Scenario, SpecError
from . import scaling
from .profile import ProfileV2, ScalingParams, parse
from .runs import Shape, crossing

QUANTILES = (0.1, 0.5, 0.9)
# convergence.data_constants: name -> (parameter, transform from the value given)
DATA_CONSTANTS = {
    "loss_floor": ("loss_floor", float),
    "floor_coef": ("log_floor_coef", math.log),
    "floor_size_exponent": ("floor_size_exponent", float),
    "noise_star_tokens": ("log_noise_star", math.log),
    "noise_loss_exponent": ("noise_loss_exponent", float),
    "unigram_loss": ("unigram_loss", float),
}
RULE = ("a federated run reaches the target at the step where the groups' mean model does; "
        "off a FedAvg round it pays one extra FedAvg to make that model")


def band_text(prof: ProfileV2, samples: int) -> str:
    """How a profile's band is drawn, for the output."""
    draws = f"p10..p90 of {samples} parameter draws (bootstrap refits, or the fit's covariance)"
    if not prof.progress_sd:
        return f"{draws} plus its residual spread"
    spread = (f"the spread {prof.progress_sd_from} met" if prof.progress_sd_from
              else "the fit runs' spread")
    return f"{draws}, each run's progress scaled by a draw of {spread} (ln f sd " \
           f"{prof.progress_sd:.3g})"


def non_embedding_params(scn: Scenario) -> float:
    """N as Kaplan et al. 2020 count it: without the token embedding (and an untied head)."""
    m = scn.model
    emb = m.vocab * m.hidden * (1 if m.tied_embeddings else 2)
    return float(max(1, m.total_params - emb))


def _vector(prof: Any) -> np.ndarray:
    return np.array([getattr(prof.params, p) for p in scaling.PARAMS], float)


def constant_range(name: str) -> tuple[float, float]:
    """The range a data constant is held to: that of the profile parameter it replaces
    (profile.ScalingParams; a log parameter's range exponentiated), optimal_lr that of the
    optimal learning rate (log_lr_star)."""
    param = "log_lr_star" if name == "optimal_lr" else DATA_CONSTANTS[name][0]
    lo, hi = -math.inf, math.inf
    for m in ScalingParams.model_fields[param].metadata:
        lo = getattr(m, "ge", getattr(m, "gt", lo))
        hi = getattr(m, "le", hi)
    return (math.exp(lo), math.exp(hi)) if param.startswith("log_") else (lo, hi)


def _apply_data_constants(scn: Scenario, x: np.ndarray, draws: np.ndarray) -> list[str]:
    given = scn.convergence.data_constants or {}
    notes = []
    for name, value in given.items():
        lo, hi = constant_range(name)
        if not lo <= value <= hi:  # (a profile with that parameter would be refused)
            raise SpecError(f"convergence.data_constants.{name}: {value:g} is outside "
                            f"{lo:.3g}..{hi:.3g}, the range of the profile parameter it "
                            "replaces")
        if name == "optimal_lr":
            # eta*(N) of the scenario's model as given (each draw keeps its own size exponent),
            # and stage 1's eta*_1 in the fitted ratio to it
            c, s2, s1 = (scaling.IDX[k] for k in ("lr_size_exponent", "log_lr_star",
                                                   "log_unigram_lr_star"))
            n_rel = non_embedding_params(scn) / scaling.N_REF
            for v in (x[None, :], draws):
                ratio = v[:, s1] - v[:, s2]
                # eta* sits sqrt(2 gamma(N) - 1) above where progress peaks (scaling.optimal_lr)
                v[:, s2] = (math.log(value) + np.log(scaling.peak_ratio(v, n_rel))
                            + v[:, c] * math.log(n_rel))
                v[:, s1] = v[:, s2] + ratio
            notes.append(f"optimal_lr {value:g}")
            continue
        param, tf = DATA_CONSTANTS[name]
        j = scaling.IDX[param]
        x[j] = tf(value)
        draws[:, j] = x[j]
        notes.append(f"{name} {value:g}")
    return notes


def extrapolation(scn: Scenario, prof: Any, shapes: list[Shape]) -> list[str]:
    """One line per input outside the profile's fitted range."""
    r = prof.fitted_range
    t = scn.training
    out = []

    def span(name: str, values: list[float], rng: list[float], fmt: str = "g") -> None:
        lo, hi = rng
        bad = [v for v in values if v < lo * (1 - 1e-9) or v > hi * (1 + 1e-9)]
        if bad:
            v = max(bad, key=lambda v: max(v / hi, lo / v) if v > 0 else math.inf)
            fold = max(v / hi, lo / v) if v > 0 else math.inf
            out.append(f"{name} {format(v, fmt)} outside the fitted {format(lo, fmt)}.."
                       f"{format(hi, fmt)} ({fold:.3g}x beyond)")

    span("model size (non-embedding params)", [shapes[0].params], r.non_embedding_params,
         ".3g")
    span("learning rate", [t.lr], r.lr)
    span("tokens per step per model", [s.batch_tokens for s in shapes], r.batch_tokens, ".4g")
    span("groups", [s.groups for s in shapes if s.federated], r.groups)
    span("K", [s.aggregate_every for s in shapes if s.federated], r.aggregate_every)
    span("steps", [t.steps], r.steps)
    span("sequence length", [t.seq_len], r.seq_len)
    outer = sorted({s.outer for s in shapes if s.federated} - set(r.outer))
    if outer:
        out.append(f"outer optimizer {outer[0]} (fitted with {', '.join(r.outer)} only; its "
                   "outer step is not in the model)")
    if t.optimizer != r.optimizer:
        out.append(f"optimizer {t.optimizer} (fitted with {r.optimizer})")
    return out


def _time_at(a: dict[str, Any], steps: float, k: int, total: int) -> float | None:
    """Wall time to take `steps` optimizer steps and have the model to evaluate: a federated
    run off a FedAvg round pays one more FedAvg."""
    if not math.isfinite(steps):
        return None
    n = int(steps)
    times = a.get("step_times_s") or []
    t = float(sum(times[:n])) if len(times) >= n else float(n * a["step_time_s"])
    if k > 0 and n % k and n < total:
        t += float(a.get("aggregation_per_event_s") or 0.0)
    return t


def _first_step(curve: np.ndarray, target: float) -> np.ndarray:
    """The first whole step whose loss is <= target, per row; inf where never."""
    hit = curve <= target
    first = np.argmax(hit, axis=1).astype(float)
    first[~hit.any(axis=1)] = np.inf
    return first


def first_to_target(algorithms: list[dict[str, Any]]) -> str | None:
    """The label of the algorithm with the shortest time to the target among those that reach
    it and fit their GPUs' memory (one that does not fit cannot run); None if none does."""
    reached = [a for a in algorithms
               if a.get("time_to_target_s") is not None and a.get("fits", True)]
    return min(reached, key=lambda a: a["time_to_target_s"])["label"] if reached else None


def attach(scn: Scenario, out: dict[str, Any], target: float | None) -> None:
    """Add loss predictions and time to target to `out` (simfed.engine.simulate's result)."""
    c = scn.convergence
    prof = parse(c.profile, "scaling")
    rng_vocab = prof.fitted_range.vocab
    missing = [k for k in DATA_CONSTANTS if k not in (c.data_constants or {})]
    if rng_vocab != scn.model.vocab and missing:
        raise SpecError(
            f"convergence.data_constants: the profile was fitted on {prof.fitted_range.data} "
            f"(vocab {rng_vocab}) but {scn.model.name} has vocab {scn.model.vocab}: give this "
            f"data's constants (missing: {', '.join(missing)}), or fit a profile on it")
    loss_init = math.log(scn.model.vocab)
    x = _vector(prof)
    boot = np.array(prof.draws, float) if prof.draws else np.empty((0, len(x)))
    samples = c.samples
    rng = np.random.default_rng([scn.seed, 0xC0])
    if len(boot):
        draws = boot[np.arange(samples) % len(boot)].copy()
    else:
        cov = np.array(prof.covariance, float)
        draws = rng.multivariate_normal(x, cov, size=samples, method="eigh")
    constants = _apply_data_constants(scn, x, draws)
    for name, low in (("noise_loss_exponent", 0.0), ("exponent", 1e-3), ("loss_floor", 0.0),
                      ("floor_size_exponent", 0.0), ("unigram_loss", 0.0)):
        j = scaling.IDX[name]
        draws[:, j] = np.maximum(draws[:, j], low)
    shift = rng.normal(0.0, prof.residual_sd, size=(samples, 1))
    draws, shift = scaling.spread_draws(draws, shift, prof.progress_sd, [scn.seed, 0xC1])
    floor = x[scaling.IDX["loss_floor"]]
    check_target(target, floor, loss_init)
    t = scn.training
    n_params = non_embedding_params(scn)
    shapes = []
    for a in out["algorithms"]:
        shapes.append(Shape(
            params=n_params, batch_tokens=float(a["global_batch_sequences"] * t.seq_len),
            steps=t.steps, lr=t.lr, warmup_steps=t.warmup_steps, schedule=t.lr_schedule,
            groups=int(a["models"]), aggregate_every=int(a["aggregate_every"] or 0),
            outer=_outer(scn, a["name"]), loss_init=loss_init))
    uniq = list(dict.fromkeys(shapes))
    point_curves = scaling.loss_curves_many(x, uniq)
    band_curves = scaling.loss_curves_many(draws, uniq)
    for a, shape in zip(out["algorithms"], shapes, strict=True):
        j = uniq.index(shape)
        point, band = point_curves[j][0], band_curves[j] + shift
        q = np.quantile(band, QUANTILES, axis=0)
        res: dict[str, Any] = {
            "loss_final": float(point[-1]), "perplexity_final": math.exp(point[-1]),
            "loss_final_interval": [float(q[0, -1]), float(q[2, -1])],
            "batch_tokens_per_model": shape.batch_tokens,
            "loss_curve": [round(float(v), 5) for v in point],
            "loss_curve_p10": [round(float(v), 5) for v in q[0]],
            "loss_curve_p90": [round(float(v), 5) for v in q[2]],
        }
        k = shape.aggregate_every if shape.federated else 0
        tokens_step = out["tokens_per_step"]
        if target is not None:
            targets_into(a, point, band, target, k, t.steps, tokens_step, res)
        a["convergence"] = res
    first = first_to_target(out["algorithms"]) if target is not None else None
    xs = dict(zip(scaling.PARAMS, (float(v) for v in x), strict=True))
    out["convergence"] = {
        "model": "scaling", "target_loss": target,
        "target_perplexity": math.exp(target) if target is not None else None,
        "loss_init": loss_init, "loss_floor": float(floor),
        "profile_source": prof.source,
        "first_to_target": first,
        "band": band_text(prof, samples),
        "rule": RULE,
        "inputs": {"non_embedding_params": n_params, "lr": t.lr, "steps": t.steps,
                   "warmup_steps": t.warmup_steps, "schedule": t.lr_schedule},
        "optimal_lr": scaling.optimal_lr(x, n_params),
        "noise_scale_tokens_at_target": (scaling.noise_scale(x, target)
                                         if target is not None else None),
        "data_constants": constants,
        "params": xs,
        "on_bound": list(prof.on_bound),
        "checks": [ck.model_dump() for ck in prof.checks],
        "extrapolation": extrapolation(scn, prof, shapes),
    }


def check_target(target: float | None, floor: float, loss_init: float) -> None:
    """A target loss must lie between the floor and the untrained loss."""
    if target is not None and target <= floor:
        raise SpecError(f"convergence.target_loss: {target:.4f} nats (perplexity "
                        f"{math.exp(target):.3g}) is at or below the loss floor {floor:.4f} "
                        f"(perplexity {math.exp(floor):.3g}): never reached")
    if target is not None and target >= loss_init:
        raise SpecError(f"convergence.target_loss: {target:.4f} is not below the untrained "
                        f"loss {loss_init:.4f}")


def targets_into(a: dict[str, Any], point: np.ndarray, band: np.ndarray, target: float,
                 k: int, total: int, tokens_step: float, res: dict[str, Any]) -> None:
    """Steps, tokens and time to `target` with their [p10, p90] bands (the rule in RULE) from
    the point curve (steps + 1,) and the band's curves (n, steps + 1), into `a` and `res`."""
    s_point = float(_first_step(point[None, :], target)[0])
    s_draws = _first_step(band, target)
    s_lo, s_hi = np.quantile(s_draws, [0.1, 0.9], method="inverted_cdf")
    finite = math.isfinite(s_point)
    a["steps_to_target"] = int(s_point) if finite else None
    a["steps_to_target_interval"] = [_int_or_none(s_lo), _int_or_none(s_hi)]
    a["tokens_to_target"] = int(s_point * tokens_step) if finite else None
    a["tokens_to_target_interval"] = [int(v * tokens_step) if math.isfinite(v) else None
                                      for v in (s_lo, s_hi)]
    a["time_to_target_s"] = _time_at(a, s_point, k, total)
    a["time_to_target_interval_s"] = [_time_at(a, s_lo, k, total), _time_at(a, s_hi, k, total)]
    a["fedavg_to_reach_target"] = bool(finite and k and int(s_point) % k
                                       and int(s_point) < total)
    res["reached_probability"] = float(np.isfinite(s_draws).mean())


def _int_or_none(v: float) -> int | None:
    return int(v) if math.isfinite(v) else None


def _outer(scn: Scenario, name: str) -> str:
    for alg in scn.algorithms:
        if alg.name == name:
            return getattr(alg, "outer_optimizer", "average")
    return "average"


def steps_to_loss(x: np.ndarray, shape: Shape, target: float) -> float:
    """Predicted steps (interpolated) at which the point model reaches `target`."""
    curve = scaling.loss_curves_many(x, [shape])[0][0]
    return crossing(np.arange(shape.steps + 1), curve, target)
