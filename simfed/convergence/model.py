"""The noise-limited progress model: evaluation loss against optimizer steps for any batch per
model, number of federation groups G and FedAvg period K.

Loss is a power law in *progress* P (Kaplan et al. 2020's L(S_min) with a floor; Hoffmann et al.
2022's irreducible term):

    L(P) = L_inf + (L_0 - L_inf) (1 + P / P_c)^(-alpha)

and each optimizer step i makes the progress of a noise-free step scaled by the learning-rate
multiplier and by the statistical efficiency of its batch (McCandlish et al. 2018, eq. 2.7-2.8:
a step on a batch of B tokens achieves 1 / (1 + B_noise / B) of the noise-free improvement;
Pollux, Qiao et al. 2021, uses the same factor as "statistical efficiency"):

    P_{i+1} = P_i + f(i) * B_eff / (B_eff + B_noise(L_i))

- f(i): the schedule's multiplier of the learning rate (warm-up from 0, cosine to 0).
- B_noise(L) = B_0 * u^(-beta), u = (L - L_inf) / (L_0 - L_inf): the gradient noise scale grows
  as the loss falls (McCandlish et al. 2018, fig. 4; Kaplan et al. 2020 eq. 5.3:
  B_crit proportional to L^(-1/alpha_B)).
- B_eff: the batch whose gradient noise one step of the algorithm averages out. One model
  (FSDP, HSDP, or one federation group): its own batch b (tokens per optimizer step per model).
  G groups averaged every K steps: b * G^rho(K) with rho(K) = rho_1 / (1 + kappa ln K). With
  SGD, rho_1 = 1: averaging models after one SGD step from a common start is one step on the
  mean gradient, a step on all G batches. With Adam it is less (each group's update is
  normalised by its own moments before the average; measured, not assumed: rho_1 is fitted,
  0..1), and the benefit of averaging fades as K grows (local
  SGD's drift: Lin et al. 2020, "Don't use large mini-batches, use local SGD"; DiLoCo's
  replica/sync-period scaling, Charles et al. 2025, fits a power law in the number of replicas).

Fitted parameters (in the transformed space the fit and the uncertainty work in):
log P_c, alpha, log B_0, beta, rho_1, log kappa, L_inf. L_0 is measured (the untrained loss).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..spec.schedule import lr_factor

PARAMS = ("log_progress_scale", "exponent", "log_noise_tokens", "noise_exponent",
          "fl_rho1", "log_fl_kappa", "loss_floor")
FLOOR = PARAMS.index("loss_floor")


@dataclass(frozen=True)
class RunShape:
    """What the model needs to know of a run: the batch per model copy, groups, K, schedule."""

    batch_tokens: float  # tokens per optimizer step per model copy
    groups: int = 1
    aggregate_every: int = 0  # K; 0: no federation
    steps: int = 64
    warmup_steps: int = 0
    schedule: str = "cosine"

    def lr_factors(self) -> np.ndarray:
        return _lr_factors(self.steps, self.warmup_steps, self.schedule)

    def effective_batch(self, rho1: np.ndarray, log_kappa: np.ndarray) -> np.ndarray:
        """B_eff per parameter sample (the averaged groups' batch)."""
        if self.groups <= 1:
            return np.full_like(log_kappa, float(self.batch_tokens))
        k = max(1, self.aggregate_every)
        rho = rho1 / (1.0 + np.exp(log_kappa) * np.log(k))
        return self.batch_tokens * np.power(float(self.groups), rho)


@functools.lru_cache(maxsize=256)
def _lr_factors(steps: int, warmup_steps: int, schedule: str) -> np.ndarray:
    f = np.array([lr_factor(i, steps=steps, warmup_steps=warmup_steps, schedule=schedule)
                  for i in range(steps)])
    f.setflags(write=False)
    return f


def loss_curves_many(theta: np.ndarray, loss_init: float, shapes: list[RunShape]
                     ) -> list[np.ndarray]:
    """Loss after 0..steps optimizer steps for each shape, each (n, steps + 1), for n parameter
    vectors theta (n, len(PARAMS)) in the order of PARAMS; all shapes advance together."""
    theta = np.atleast_2d(theta)
    log_pc, alpha, log_b0, beta, rho1, log_kappa, floor = (c[:, None] for c in theta.T)
    pc, b0 = np.exp(log_pc), np.exp(log_b0)
    span = loss_init - floor  # (n, 1)
    b_eff = np.stack([s.effective_batch(rho1[:, 0], log_kappa[:, 0]) for s in shapes],
                     axis=1)  # (n, m)
    most = max(s.steps for s in shapes)
    f = np.zeros((len(shapes), most))
    for j, s in enumerate(shapes):
        f[j, : s.steps] = s.lr_factors()
    out = np.empty((theta.shape[0], len(shapes), most + 1))
    progress = np.zeros_like(b_eff)
    out[:, :, 0] = loss_init
    for i in range(most):
        u = np.power(1.0 + progress / pc, -alpha)  # (L - L_inf) / (L_0 - L_inf)
        b_noise = b0 * np.power(np.maximum(u, 1e-12), -beta)
        progress = progress + f[:, i] * b_eff / (b_eff + b_noise)
        out[:, :, i + 1] = floor + span * np.power(1.0 + progress / pc, -alpha)
    return [out[:, j, : s.steps + 1] for j, s in enumerate(shapes)]


def loss_curves(theta: np.ndarray, loss_init: float, shape: RunShape) -> np.ndarray:
    """Loss after 0..steps optimizer steps, (n, steps + 1), for n parameter vectors theta."""
    return loss_curves_many(theta, loss_init, [shape])[0]


def steps_to(curve: np.ndarray, target: float) -> np.ndarray:
    """First step count whose loss is <= target, per row of `curve` (n, steps + 1); inf where
    it is never reached."""
    hit = curve <= target
    first = np.argmax(hit, axis=1).astype(float)
    first[~hit.any(axis=1)] = np.inf
    return first
