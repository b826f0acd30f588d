"""The scaling model: evaluation loss against optimizer steps with model size, tokens per step,
the learning rate's schedule and peak value, federation groups and period as inputs, so that a
profile fitted at some sizes predicts another.

Loss falls in two stages of *progress* P. First the token frequencies: from the untrained loss
L_0 to the data's unigram loss L_u (the loss of the token frequencies alone, a property of the
data). Then the use of context: a power law above a size-dependent floor (Kaplan et al. 2020,
L(N, S_min), with the floor of Hoffmann et al. 2022's approach 3):

    L = L_inf(N) + (L_u - L_inf(N)) (1 + P / P_c(N))^(-alpha) + (L_0 - L_u) exp(-P / P_1)
    L_inf(N) = E + A (N / N_0)^(-a),   P_c(N) = P_c (N / N_0)^(-d),   N_0 = 1e6

Models of a few hundred thousand parameters sit on the unigram solution for a while before
they use context (a saddle: the size study's byte-level models at lr 3e-3 for 30 to over 100
steps, differently from seed to seed and not monotonically in the learning rate). That plateau
is not modelled: its length is measured, and the fit and checks take the two stages apart
(segment "pre": reaching L_u; "post": from where the loss leaves L_u, stage 2 alone); a
scenario's run is both stages from step 0 ("whole"), as for models that have no such plateau.

P counts steps at the noise-free optimal learning rate. One step at learning rate eta makes
(McCandlish et al. 2018, eq. 2.3-2.6: a step's loss decrease is eta |G|^2 - eta^2/2 (G^T H G +
tr(H Sigma)/B), quadratic in eta), written for Adam, whose update has about unit size per
coordinate and whose noisy gradients shrink the part of it along the true gradient:

    dP = 2 x s - x^2,   x = eta / eta*(N),   eta*(N) = eta*_0 (N / N_0)^(-c)
    s^2 = 1 / (1 + B_noise(L) / (G_eff b))      the signal fraction of the update

- b: tokens per optimizer step per model copy; G_eff = 1 for one model, below G for G groups
  averaged (next); B_noise(L) = B* L^(-1/alpha_B): the gradient
  noise scale grows as the loss falls, the same at every size at equal loss (Kaplan et al. 2020,
  eq. 5.3 and fig. 10); B* and alpha_B are fitted (they depend on data and tokenizer).
- One model (FSDP, HSDP, one federation group): G_eff = 1: progress 2 x s - x^2 peaks at
  x = s with s^2 = 1 / (1 + B_noise / b), McCandlish's statistical efficiency (S = S_min (1 +
  B_noise / B)); at a small learning rate progress is 2 x s, and the batch still counts through
  s (Adam's normalisation). Above the optimum the quadratic term costs progress (too high a
  learning rate); below it steps are wasted.
- G groups averaged every K steps (FedAvg of AdamW groups): the average learns as one model on
  G_eff x b tokens a step, G_eff = G^(1 / (1 + kappa ln K)). With K = 1 the copies stay equal
  and their mean step is one step on the G groups' batches together (G_eff = G: FL+FSDP is
  FSDP on G x b); between rounds the copies drift apart along different trajectories and the
  average recovers less (local SGD: Lin et al. 2020; Ortiz et al. 2021; DiLoCo's replica and
  period scaling, Charles et al. 2025), down to one group's batch as K grows. The size study
  identifies kappa in this form (its 95% interval excludes 0 and infinity: averaging every 8
  steps is worth a few-fold larger batch, less than G-fold); a form in which averaging reduced
  only the noise of the update and not its signal fraction (q = s^2 + (1 - s^2) / G_eff) fitted
  the study worse and left kappa on its bound.
- Evaluation is of the groups' mean model (as the emulator and a FedAvg round make it).

Each stage has its own progress and noise-free optimal learning rate (eta*_1 for the token
frequencies, eta* for context; both scale with N^-c): the size study's models learn the
frequencies fastest at a higher learning rate than the one that serves them afterwards.

The step's response to the learning rate is by default the lorentzian r = 2 x s / (1 + x^2 /
s^2)^gamma (`_step`): 2 x s - x^2 to first order, with a tail above the optimum that falls as
x^(1 - 2 gamma), gamma fitted: Adam loses progress more slowly above its best learning rate
than the quadratic (a plain gradient step's) says. gamma depends on size, gamma(N) = gamma
(N / N_0)^(-t) with t fitted (`lr_tail_size_exponent`; 0 in profiles fitted before it), held at
or above TAIL_MIN.

A step above its optimum may also do lasting harm (`lr_damage`, beta >= 0; 0 in the shipped
profile, fitted by the seventh held-out check's variant): the size study's runs far above their
best learning rate progress several times more slowly than those below it long after the
schedule has brought their learning rate down, so the damage D accumulates, D += beta (x / x_pk
- 1)^2 for a step at x above the step's optimum x_pk = s / sqrt(2 gamma - 1) (small batches,
with a smaller s, are harmed at a lower learning rate), and every later step of the context
stage makes exp(-D) of its progress. A "post" segment carries the damage of the steps before
its start (their learning rates against the optimum at its starting loss).

Parameters (in the order of PARAMS): ln eta*_0, c, ln B*, 1/alpha_B, ln P_c, alpha, d, E, ln A,
a, ln kappa, L_u (the data's, measured where the study records it), ln P_1, ln eta*_1, gamma, t,
beta.
L_0 is each run's untrained loss (measured, or ln(vocab)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .runs import Shape

N_REF = 1e6
PARAMS = ("log_lr_star", "lr_size_exponent", "log_noise_star", "noise_loss_exponent",
          "log_progress_scale", "exponent", "progress_size_exponent", "loss_floor",
          "log_floor_coef", "floor_size_exponent", "log_fl_kappa", "unigram_loss",
          "log_unigram_scale", "log_unigram_lr_star", "lr_tail", "lr_tail_size_exponent",
          "lr_damage")
IDX = {p: i for i, p in enumerate(PARAMS)}
# what each parameter means, for reports and profiles
DESCRIBE = {
    "log_lr_star": "ln of the noise-free optimal learning rate eta* at 1e6 non-embedding params",
    "lr_size_exponent": "c in eta*(N) = eta*_0 (N / 1e6)^-c",
    "log_noise_star": "ln B* (tokens) in the gradient noise scale B_noise(L) = B* L^-(1/alpha_B)",
    "noise_loss_exponent": "1/alpha_B: how fast the noise scale grows as the loss falls",
    "log_progress_scale": "ln P_c: progress (optimal steps) at which the power law bends",
    "exponent": "alpha: the loss's power in progress",
    "progress_size_exponent": "d in P_c(N) = P_c (N / 1e6)^-d",
    "loss_floor": "E: the data's irreducible loss (nats/token)",
    "log_floor_coef": "ln A in L_inf(N) = E + A (N / 1e6)^-a",
    "floor_size_exponent": "a in L_inf(N) = E + A (N / 1e6)^-a",
    "log_fl_kappa": "ln kappa in G_eff = G^(1 / (1 + kappa ln K)): averaging's loss with K",
    "unigram_loss": "L_u: the loss of the data's token frequencies alone (nats/token)",
    "log_unigram_scale": "ln P_1: progress that learns the token frequencies",
    "log_unigram_lr_star": "ln eta*_1 at 1e6 params: stage 1's noise-free optimal lr",
    "lr_tail": "gamma in r = 2 x s / (1 + x^2 / s^2)^gamma: how slowly progress falls above "
               "the optimal learning rate (1: as fast as 1 / x), at 1e6 non-embedding params",
    "lr_tail_size_exponent": "t in gamma(N) = gamma (N / 1e6)^-t (held at or above 0.55)",
    "lr_damage": "beta: each step at x above its optimum x_pk = s / sqrt(2 gamma - 1) "
                 "multiplies the progress of every later context step by exp(-beta (x / x_pk "
                 "- 1)^2) (0: none)",
}
TAIL_MIN = 0.55  # lr_tail's lower bound: at 0.5 progress no longer falls above an optimum
# parameters that belong to the data and tokenizer rather than to the optimizer's dynamics:
# a scenario on other data replaces them (convergence.data_constants) and says so
DATA_PARAMS = ("loss_floor", "log_floor_coef", "floor_size_exponent", "log_noise_star",
               "noise_loss_exponent", "unigram_loss")


@dataclass(frozen=True)
class Bounds:
    lo: np.ndarray
    hi: np.ndarray
    x0: np.ndarray


def bounds(floor_min: float, best_loss: float, loss_init: float) -> Bounds:
    """Physical ranges of the parameters (the fit's box) and a starting point inside it."""
    top = max(floor_min + 1e-3, best_loss - 1e-3)
    lo = np.array([math.log(1e-6), -1.0, math.log(1.0), 0.0, math.log(1e-3), 0.02, -2.0,
                   floor_min, math.log(1e-4), 0.0, math.log(1e-4), floor_min, math.log(1e-3),
                   math.log(1e-6), TAIL_MIN, -1.0, 0.0])
    hi = np.array([math.log(10.0), 2.0, math.log(1e12), 12.0, math.log(1e6), 4.0, 2.0,
                   top, math.log(1e2), 2.0, math.log(1e3), loss_init, math.log(1e3),
                   math.log(10.0), 4.0, 1.0, 1.0])
    x0 = np.array([math.log(3e-3), 0.3, math.log(1e4), 2.0, math.log(10.0), 0.5, 0.0,
                   floor_min + 0.5 * (best_loss - floor_min), math.log(0.3), 0.3, 0.0,
                   0.5 * (loss_init + best_loss), math.log(1.0), math.log(3e-3), 1.0, 0.0, 0.01])
    return Bounds(lo, hi, np.clip(x0, lo + 1e-6, hi - 1e-6))


def loss_curves_many(theta: np.ndarray, shapes: list[Shape]) -> list[np.ndarray]:
    """Loss after 0..steps optimizer steps for each shape, each (n, steps + 1), for n parameter
    vectors theta (n, len(PARAMS)); all shapes advance together, step by step."""
    bounds = [np.arange(s.length + 1) for s in shapes]
    out = _integrate(theta, shapes, bounds)
    return [out[:, j, : s.length + 1] for j, s in enumerate(shapes)]


def loss_at(theta: np.ndarray, shapes: list[Shape], at: list[np.ndarray],
            max_blocks: int = 2048) -> list[np.ndarray]:
    """Loss at the given steps of each shape, each (n, len(at[j])), integrating long runs in
    at most about `max_blocks` blocks of steps: within a block the noise scale and so s
    are those of its start, and the learning rate's sum and sum of squares are exact. A run of
    at most `max_blocks` steps is integrated step by step, as loss_curves_many."""
    bounds = []
    for s, a in zip(shapes, at, strict=True):
        grid = np.linspace(0, s.length, min(s.length, max_blocks) + 1).round().astype(int)
        bounds.append(np.unique(np.concatenate([grid, np.asarray(a, int), [0, s.length]])))
    out = _integrate(theta, shapes, bounds)
    return [out[:, j, np.searchsorted(bd, np.asarray(a, int))]
            for j, (bd, a) in enumerate(zip(bounds, at, strict=True))]


def _integrate(theta: np.ndarray, shapes: list[Shape], bounds: list[np.ndarray]) -> np.ndarray:
    """Loss at every block boundary (n, m, most blocks + 1); bounds[j] are the step counts
    0 = b_0 < b_1 < ... < b_B = steps of shape j (shorter lists padded with empty blocks)."""
    theta = np.atleast_2d(np.asarray(theta, float))
    col = {p: theta[:, i][:, None] for p, i in IDX.items()}  # (n, 1) each
    n_rel = np.array([s.params / N_REF for s in shapes])[None, :]  # (1, m)
    b = np.array([s.batch_tokens for s in shapes])[None, :]
    l0 = np.array([s.loss_init for s in shapes])[None, :]
    lr_star = np.exp(col["log_lr_star"]) * n_rel ** (-col["lr_size_exponent"])  # (n, m)
    lr_star1 = np.exp(col["log_unigram_lr_star"]) * n_rel ** (-col["lr_size_exponent"])
    pc = np.exp(col["log_progress_scale"]) * n_rel ** (-col["progress_size_exponent"])
    floor = col["loss_floor"] + np.exp(col["log_floor_coef"]) * n_rel ** (
        -col["floor_size_exponent"])
    post = np.array([s.segment == "post" for s in shapes])[None, :]
    pre = np.array([s.segment == "pre" for s in shapes])[None, :]
    # a "post" segment starts below L_u (at its loss_init); the others start above it
    unigram = np.where(post, np.maximum(col["unigram_loss"], l0),
                       np.minimum(col["unigram_loss"], l0))
    floor = np.minimum(floor, np.minimum(unigram, l0) - 1e-6)
    span2, span1 = unigram - floor, l0 - unigram
    p1 = np.exp(col["log_unigram_scale"])
    alpha = col["exponent"]
    b_star, nexp = np.exp(col["log_noise_star"]), col["noise_loss_exponent"]
    kappa = np.exp(col["log_fl_kappa"])
    tail = tail_at(col["lr_tail"], col["lr_tail_size_exponent"], n_rel)
    groups = np.array([float(s.groups) if s.federated else 1.0 for s in shapes])[None, :]
    log_k = np.array([math.log(max(1, s.aggregate_every)) for s in shapes])[None, :]
    g_eff = groups ** (1.0 / (1.0 + kappa * log_k))  # (n, m)
    # segments: "pre" is stage 1 alone (towards L_u), "post" stage 2 alone (from below L_u)
    span1 = np.where(post, 0.0, span1)
    span2 = np.where(pre, 0.0, span2)
    floor_pre = np.where(pre, unigram, floor)  # stage 1 alone tends to L_u
    blocks = max(len(bd) - 1 for bd in bounds)
    sum_lr = np.zeros((len(shapes), blocks))  # per block: sum of lr, sum of lr^2
    sum_lr2 = np.zeros((len(shapes), blocks))
    for j, (s, bd) in enumerate(zip(shapes, bounds, strict=True)):
        vals = s.lr_values()[s.start_step:]  # steps counted from the segment's start
        lr = np.concatenate([[0.0], np.cumsum(vals)])
        lr2 = np.concatenate([[0.0], np.cumsum(np.square(vals))])
        sum_lr[j, : len(bd) - 1] = np.diff(lr[bd])
        sum_lr2[j, : len(bd) - 1] = np.diff(lr2[bd])
    width = _widths(bounds, blocks)
    out = np.empty((theta.shape[0], len(shapes), blocks + 1))
    # a "post" segment starts where its loss is loss_init (below L_u): the progress of stage 2
    # that gives it
    start = np.clip((l0 - floor) / np.maximum(unigram - floor, 1e-9), 1e-9, 1.0)
    progress = np.where(post, pc * (np.power(start, -1.0 / alpha) - 1.0), 0.0)
    progress = np.broadcast_to(progress, (theta.shape[0], len(shapes))).copy()
    progress1 = np.zeros_like(progress)  # stage 1's own progress (its own optimal lr)
    loss = np.broadcast_to(l0, progress.shape).copy()
    out[:, :, 0] = loss
    tokens = b * g_eff  # the groups' average learns as one model on G_eff x b tokens a step
    beta = col["lr_damage"]
    hurt = bool(np.any(beta > 0))  # without damage its bookkeeping is skipped
    ratio = optimum_ratio(tail)  # x_pk = s / ratio
    damage = (_damage_before(shapes, lr_star, l0, b_star, nexp, tokens, ratio, beta)
              if hurt else np.zeros_like(progress))
    for i in range(blocks):
        b_noise = b_star * np.power(np.maximum(loss, 1e-3), -nexp)
        s1 = np.sqrt(tokens / (tokens + b_noise))
        step2 = _step(sum_lr[:, i], sum_lr2[:, i], lr_star, s1, width[i], tail)
        if hurt:
            step2 = np.exp(-damage) * step2
            over = np.maximum(sum_lr[None, :, i] / (lr_star * width[i]) * ratio / s1 - 1.0, 0.0)
            damage = damage + beta * width[i] * over * over
        progress = np.maximum(progress + step2, 0.0)
        progress1 = np.maximum(progress1 + _step(sum_lr[:, i], sum_lr2[:, i], lr_star1, s1,
                                                 width[i], tail), 0.0)
        loss = (floor_pre + span2 * np.power(1.0 + progress / pc, -alpha)
                + span1 * np.exp(-progress1 / p1))
        out[:, :, i + 1] = loss
    return out


def _damage_before(shapes: list[Shape], lr_star: np.ndarray, l0: np.ndarray,
                   b_star: np.ndarray, nexp: np.ndarray, tokens: np.ndarray, ratio: np.ndarray,
                   beta: np.ndarray) -> np.ndarray:
    """The damage a "post" segment carries from the steps before its start (n, m): those steps'
    learning rates against the optimum at the segment's starting loss."""
    out = np.zeros_like(lr_star)
    for j, s in enumerate(shapes):
        if s.segment != "post" or s.start_step <= 0:
            continue
        lr = s.lr_values()[: s.start_step][None, :]
        noise = b_star[:, 0] * max(l0[0, j], 1e-3) ** (-nexp[:, 0])
        sig = np.sqrt(tokens[:, j] / (tokens[:, j] + noise))[:, None]
        over = np.maximum(lr / lr_star[:, j:j + 1] * ratio[:, j:j + 1] / sig - 1.0, 0.0)
        out[:, j] = beta[:, 0] * np.sum(over * over, axis=1)
    return out


RESPONSE = "lorentzian"  # how a step's progress depends on x = lr / eta*


def _widths(bounds: list[np.ndarray], blocks: int) -> np.ndarray:
    """Steps per block, (blocks, m) (1 for the padding)."""
    w = np.ones((blocks, len(bounds)))
    for j, bd in enumerate(bounds):
        w[: len(bd) - 1, j] = np.maximum(np.diff(bd), 1)
    return w


def _step(sum_lr: np.ndarray, sum_lr2: np.ndarray, lr_star: np.ndarray, s: np.ndarray,
          steps: np.ndarray, tail: np.ndarray | float = 1.0) -> np.ndarray:
    """A block's progress: the sum over its steps of r(x) with x = lr / eta*. quadratic:
    r = 2 x s - x^2 (McCandlish et al. 2018's second-order step); lorentzian: r = 2 x s /
    (1 + x^2 / s^2)^gamma (gamma = `tail`, fitted), equal to it to first order in x, with a
    flatter top and a tail above the optimum that falls as x^(1 - 2 gamma) (the size study's
    runs lose far less at 3x their best learning rate than the quadratic says, and less than
    1 / x: gamma < 1); its optimum is at x = s / sqrt(2 gamma - 1). In a block
    of n steps the lorentzian takes the block's mean x."""
    sx = sum_lr[None, :] / lr_star
    if RESPONSE == "quadratic":
        return 2.0 * sx * s - sum_lr2[None, :] / (lr_star * lr_star)
    n = steps[None, :]
    x = sx / n
    return n * 2.0 * x * s / np.power(1.0 + x * x / (s * s), tail)


def optimal_lr(theta: np.ndarray, params: float) -> float:
    """The noise-free optimal learning rate of a parameter vector for N params: where r peaks
    at s = 1, eta*(N) / sqrt(2 gamma(N) - 1)."""
    n_rel = params / N_REF
    return float(math.exp(theta[IDX["log_lr_star"]]) * n_rel ** (-theta[IDX["lr_size_exponent"]])
                 / peak_ratio(theta, n_rel))


def peak_ratio(theta: np.ndarray, n_rel: float) -> np.ndarray:
    """eta*(N) over the learning rate where a noise-free step's progress peaks, sqrt(2 gamma(N)
    - 1), for a parameter vector (or the rows of a matrix of them) at N = n_rel x 1e6."""
    theta = np.asarray(theta, float)
    return optimum_ratio(tail_at(theta[..., IDX["lr_tail"]],
                                 theta[..., IDX["lr_tail_size_exponent"]], n_rel))


def tail_at(tail: float | np.ndarray, exponent: float | np.ndarray,
            n_rel: float | np.ndarray) -> np.ndarray:
    """gamma(N) = gamma (N / 1e6)^-t, held at or above TAIL_MIN (below 0.5 progress would
    grow without bound with the learning rate)."""
    return np.maximum(np.asarray(tail, float) * np.power(n_rel, -np.asarray(exponent, float)),
                      TAIL_MIN)


def optimum_ratio(tail: float | np.ndarray) -> float | np.ndarray:
    """eta* over the learning rate where r peaks at s = 1: sqrt(2 gamma - 1)."""
    return np.sqrt(np.maximum(2.0 * np.asarray(tail, float) - 1.0, 1e-12))


def shift_progress(thetas: np.ndarray, log_factor: np.ndarray | float) -> np.ndarray:
    """Parameter vectors whose runs make exp(log_factor) times the progress at every step, in
    both stages: the progress scales P_c and P_1 divided by it (a "post" segment's starting
    progress, counted in P_c, moves with it, so its starting loss does not)."""
    out = np.array(thetas, float, copy=True, ndmin=2)
    out[:, IDX["log_progress_scale"]] -= log_factor
    out[:, IDX["log_unigram_scale"]] -= log_factor
    return out


def spread_draws(thetas: np.ndarray, shift: np.ndarray, progress_sd: float | None,
                 seed: Any) -> tuple[np.ndarray, np.ndarray]:
    """A band's draws and loss shifts: with a progress spread, each draw's progress scaled by
    exp(ln f), ln f ~ N(0, progress_sd) (seeded by `seed`), and no loss shift; without one
    (profiles fitted before it), the draws and the residual spread's loss shifts as given."""
    if not progress_sd:
        return thetas, shift
    factor = np.random.default_rng(seed).normal(0.0, progress_sd, size=len(thetas))
    return shift_progress(thetas, factor), np.zeros_like(shift)


def noise_scale(theta: np.ndarray, loss: float) -> float:
    """B_noise (tokens) at an evaluation loss."""
    return float(math.exp(theta[IDX["log_noise_star"]])
                 * max(loss, 1e-3) ** (-theta[IDX["noise_loss_exponent"]]))
