"""The convergence emulator: the optimizer math of FSDP, HSDP, FL+FSDP and FL+HSDP for all
federation groups of a scenario in one process, so a 2-core machine can compare 128 groups x 8
sequences against one model x 1,024.

    realrun converge scenarios/convergence-tiny.yaml --algorithm all --seeds 0,1,2 --out x.json

What it reproduces of `realrun run` (and what it leaves out, because it changes no number):
- Every federation group g has its own model copy, initialised from the scenario's seed exactly
  as realrun does (`torch.manual_seed(seed)`, then `Llama(...)`), and its own AdamW (or SGD) with
  local moments, the scenario's warm-up + cosine/constant schedule (`realrun.optimizer`).
- Sharding does not change the math: FSDP2 averages gradients over the group's shard (and, in
  HSDP, replica) ranks, and every rank's loss is the mean over its micro-batch of equal-length
  sequences, so a group's gradient is the gradient of the mean loss over the concatenation of its
  ranks' micro-batches. FSDP and HSDP are one group of all ranks; FL+FSDP / FL+HSDP are
  `plan.groups` groups of `plan.group_size` ranks.
- The paper's data split: one sampler over all ranks (`realrun.data.Sampler`), rank r of group g
  trains on the same sequences as in a real run.
- FedAvg every K steps and after the last step, after the optimizer and LR step: the mean of the
  groups' parameters computed in `fedavg_dtype` (a sum, then a divide, then a cast back),
  parameters only; moments and schedules stay local.
- Parameters, gradients and optimizer states in the model dtype (pure bf16 when model.dtype is
  bf16, as the paper's runs; fp32 otherwise).
Not reproduced by default: the order of floating-point sums inside a collective, so per-step
losses agree with a real run to float rounding, not bit for bit. `ring_dtype` emulates what a
low-precision reduction does (FSDP1's pure-bf16 reduce-scatter over n ranks: partial sums
rounded to bf16 at each of n - 1 hops, with FSDP1's pre- and post-division), for groups of
ranks that shard one model (FSDP, FL+FSDP; HSDP's two-level reduction is not modelled).

The G groups run batched: their parameters are stacked along a leading dimension (G, ...),
`torch.func.vmap` over `grad` of the model's functional call gives every group's gradient in one
pass, and one optimizer over the stacked tensors is exactly G independent optimizers (AdamW and
SGD are elementwise, and every group takes the same steps with the same schedule).

Evaluation every `eval_every` steps (and after the last step) uses the groups' mean model (the
model a FedAvg round would make at that step; between rounds a "virtual" average that does not
touch the training state) on the held-out evaluation stream.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.func import functional_call, grad_and_value, vmap

from simfed.spec import AlgorithmSpec, Scenario, algorithm_info
from simfed.spec.rounds import ends_round

from .data import EVAL_STREAM, TRAIN_STREAM, Sampler, eval_sequences
from .errors import RealrunError
from .fedavg import outer_step
from .model import TORCH_DTYPES, Llama, next_token_loss
from .optimizer import adamw_kernels, lr_factor

SCHEMA = "realrun.converge/1"


def clip_per_group(grads: tuple[torch.Tensor, ...], max_norm: float) -> tuple[torch.Tensor, ...]:
    """clip_grad_norm_ for each group of stacked gradients (leading dimension G): every
    group's gradients scaled to total norm `max_norm` at most, as its own run would."""
    sq = sum(g.float().reshape(g.shape[0], -1).pow(2).sum(1) for g in grads)
    coef = (max_norm / (sq.sqrt() + 1e-6)).clamp(max=1.0)
    return tuple(g * coef.view(-1, *([1] * (g.dim() - 1))).to(g.dtype) for g in grads)


@dataclass(frozen=True)
class Curve:
    """One emulated run: per-step training loss (mean over groups) and evaluation points."""

    algorithm: str
    label: str
    seed: int
    groups: int
    group_size: int
    batch_per_model: int  # sequences per optimizer step per model copy
    aggregate_every: int | None
    train_loss: list[float]  # per step, mean over groups of each group's batch-mean loss
    train_loss_per_group: list[list[float]]  # [group][step]
    eval_steps: list[int]  # number of optimizer steps taken before each evaluation
    eval_loss: list[float]  # nats per token of the groups' mean model
    noise: list[dict[str, float]]  # gradient noise scale at evaluation points (one group only)
    wall_s: float

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


class GroupedTrainer:
    """All federation groups of one algorithm, stacked; `run()` trains them and returns a Curve."""

    def __init__(self, scenario: Scenario, algo: AlgorithmSpec, corpus: Any, *, seed: int,
                 eval_every: int, keep_group_losses: bool = True, ring_dtype: str = ""):
        self.sc, self.algo, self.corpus = scenario, algo, corpus
        self.info = algorithm_info(algo.name)
        self.plan = plan = algo.plan(scenario.cluster)
        self.t = t = scenario.training
        self.groups = plan.groups  # 1 for FSDP and HSDP
        self.group_size = plan.world // self.groups
        self.k = algo.aggregate_every if self.info.federated else None
        self.seed, self.eval_every, self.keep_group_losses = seed, eval_every, keep_group_losses
        self.sampler = Sampler(world=plan.world, micro_batch=t.micro_batch,
                               dataset_sequences=scenario.dataset_sequences)
        self.n_eval = eval_sequences(scenario)
        device = torch.device("cpu")
        torch.manual_seed(seed)  # as realrun.train: every group starts from the same model
        self.model = Llama(scenario.model, t.seq_len, device)
        self.buffers = dict(self.model.named_buffers())
        names, tensors = zip(*self.model.named_parameters(), strict=True)
        self.names: tuple[str, ...] = names
        g = self.groups
        # (G, ...) leaves: one slice per group
        self.params = [p.detach().unsqueeze(0).repeat(g, *([1] * p.dim())).requires_grad_()
                       for p in tensors]
        self.opt = self._optimizer()
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: lr_factor(s, t))
        self.fedavg_dtype = TORCH_DTYPES[algo.fedavg_dtype]
        # DiLoCo's outer step (algorithms.fl_*.outer_optimizer: nesterov), as realrun.fedavg:
        # the fp32 global model of the last round, and the outer momentum
        for key in ("round_budget_s", "round_deadline_s"):
            if getattr(algo, key, 0):
                raise RealrunError(
                    f"algorithms.{algo.name}.{key}: the convergence emulator runs K local steps "
                    "in every group; time-budgeted and deadline rounds are not emulated")
        self.outer = getattr(algo, "outer_optimizer", "average")
        self.anchor = self.momentum = None
        if self.outer == "nesterov":
            self.anchor = [p[0].detach().float().clone() for p in self.params]
            self.momentum = [torch.zeros_like(a) for a in self.anchor]
        self._grad = vmap(grad_and_value(self._loss))
        # the gradient reduction as a ring in a low precision (see ring_reduce), or exact
        self.ring_dtype = TORCH_DTYPES[ring_dtype] if ring_dtype else None
        self._rank_grads = vmap(vmap(grad_and_value(self._loss), in_dims=(None, 0, 0)))

    def _optimizer(self) -> torch.optim.Optimizer:
        t = self.t
        if t.optimizer == "adamw":
            return torch.optim.AdamW(self.params, lr=t.lr, betas=t.betas,
                                     weight_decay=t.weight_decay,
                                     **adamw_kernels(t, torch.device("cpu")))
        return torch.optim.SGD(self.params, lr=t.lr, weight_decay=t.weight_decay)

    def _loss(self, params: tuple[torch.Tensor, ...], inputs: torch.Tensor,
              targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token loss of one group's batch: inputs, targets (b, T)."""
        logits = functional_call(self.model, ({**dict(zip(self.names, params, strict=True)),
                                               **self.buffers}), (inputs,))
        return next_token_loss(logits, targets)

    def batch(self, step: int) -> torch.Tensor:
        """Token ids (G, b, T + 1): group g's ranks' micro-batches, concatenated in rank order."""
        gs = self.group_size
        seqs = [[self.corpus.sequence(TRAIN_STREAM, i)
                 for r in range(g * gs, (g + 1) * gs)
                 for i in self.sampler.train_indices(step, r)]
                for g in range(self.groups)]
        return torch.from_numpy(np.stack([np.stack(s) for s in seqs]))

    def ring_grads(self, tok: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Gradients as a ring reduce-scatter in `ring_dtype` makes them: each rank's own
        gradient of its micro-batch's mean loss, pre-divided by FSDP1's factor f (the largest
        power of two with f^2 <= n dividing n: torch's `_get_gradient_predivide_factor`), summed
        rank after rank with every partial sum rounded to `ring_dtype` (a ring's hops carry the
        partial sums in the reduction dtype; here in rank order), then divided by n / f.
        tok (G, b, T + 1) -> per-parameter gradients (G, ...) and the groups' losses (G,)."""
        n, mb = self.group_size, self.t.micro_batch
        ranks = tok.view(self.groups, n, mb, -1)  # (G, n, mb, T + 1)
        grads, losses = self._rank_grads(tuple(self.params), ranks[..., :-1], ranks[..., 1:])
        pre = 1
        while n % pre == 0 and n / pre > pre:
            pre *= 2
        out = []
        for g, p in zip(grads, self.params, strict=True):  # g (G, n, ...)
            parts = (g / pre).to(self.ring_dtype)
            acc = parts[:, 0].clone()
            for r in range(1, n):
                acc = acc + parts[:, r]  # rounded to ring_dtype at every hop
            out.append((acc.to(torch.float32) / (n / pre)).to(p.dtype))
        return out, losses.mean(dim=1)

    @torch.no_grad()
    def fedavg(self) -> None:
        """Every group's parameters <- the mean over groups, computed in fedavg_dtype; with the
        Nesterov outer optimizer, the outer step on the mean delta from the last round's model
        (`realrun.fedavg.outer_step`: the delta summed in fedavg_dtype, then divided)."""
        if self.anchor is not None:
            for p, a, m in zip(self.params, self.anchor, self.momentum, strict=True):
                delta = (a - p.float()).to(self.fedavg_dtype).sum(dim=0).float() / self.groups
                new = outer_step(a, delta, m, lr=self.algo.outer_lr,
                                 momentum=self.algo.outer_momentum)
                a.copy_(new)
                p.copy_(new.to(p.dtype).unsqueeze(0).expand_as(p))
            return
        for p in self.params:
            mean = p.to(self.fedavg_dtype).sum(dim=0).div_(self.groups)
            p.copy_(mean.to(p.dtype).unsqueeze(0).expand_as(p))

    @torch.no_grad()
    def evaluate(self) -> float:
        """Loss (nats/token) of the groups' mean model on the evaluation set."""
        mean = {n: p.float().mean(dim=0).to(p.dtype) for n, p in zip(self.names, self.params,
                                                                     strict=True)}
        loss_sum, tokens = 0.0, 0
        chunk = 64
        for lo in range(0, self.n_eval, chunk):
            seqs = np.stack([self.corpus.sequence(EVAL_STREAM, i)
                             for i in range(lo, min(lo + chunk, self.n_eval))])
            tok = torch.from_numpy(seqs)
            logits = functional_call(self.model, ({**mean, **self.buffers}), (tok[:, :-1],))
            loss_sum += float(next_token_loss(logits, tok[:, 1:], reduction="sum"))
            tokens += tok[:, 1:].numel()
        return loss_sum / tokens

    def gradient_noise(self, step: int, small: int) -> dict[str, float]:
        """The gradient noise scale B_simple = tr(Sigma) / |G|^2 at the current parameters of
        group 0, by McCandlish et al. (2018, appendix A.1)'s two-batch estimator: the batch of
        `step` is split into n chunks of `small` sequences; |G_small|^2 is the chunks' mean
        squared gradient norm, G_big their mean. In tokens (batch sizes counted in tokens)."""
        tok = self.batch(step)[0]  # (b, T + 1)
        n = tok.shape[0] // small
        if n < 2:
            raise ValueError(f"gradient noise needs >= 2 chunks of {small}, batch {tok.shape[0]}")
        chunks = tok[: n * small].view(n, small, -1)
        params = tuple(p[0].detach() for p in self.params)
        grads = vmap(torch.func.grad(self._loss), in_dims=(None, 0, 0))(
            params, chunks[..., :-1], chunks[..., 1:])  # each (n, ...)
        flat = torch.cat([g.reshape(n, -1).double() for g in grads], dim=1)  # (n, numel)
        small_sq = float(flat.pow(2).sum(dim=1).mean())
        big_sq = float(flat.mean(dim=0).pow(2).sum())
        t = self.t.seq_len
        b_small, b_big = small * t, n * small * t
        g2 = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
        trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
        return {"grad_sq": g2, "trace_sigma": trace,
                "b_simple_tokens": trace / g2 if g2 > 0 else float("inf")}

    def run(self, noise_chunk: int = 0) -> Curve:
        steps = self.t.steps
        start = time.perf_counter()
        train: list[float] = []
        per_group: list[list[float]] = [[] for _ in range(self.groups)]
        eval_steps, eval_loss = [0], [self.evaluate()]
        noise: list[dict[str, float]] = []
        measure_noise = noise_chunk > 0 and self.groups == 1
        if measure_noise:
            noise.append({"step": 0, "eval_loss": eval_loss[0],
                          **self.gradient_noise(0, noise_chunk)})
        for step in range(steps):
            tok = self.batch(step)  # (G, b, T + 1)
            if self.ring_dtype is not None:
                grads, losses = self.ring_grads(tok)
            else:
                grads, losses = self._grad(tuple(self.params), tok[..., :-1], tok[..., 1:])
            if self.t.grad_clip > 0:
                grads = clip_per_group(grads, self.t.grad_clip)
            for p, g in zip(self.params, grads, strict=True):
                p.grad = g
            self.opt.step()
            self.sched.step()
            self.opt.zero_grad(set_to_none=True)
            if self.k and self.groups > 1 and ends_round(step, steps=steps, every=self.k):
                self.fedavg()
            values = losses.tolist()
            train.append(float(np.mean(values)))
            if self.keep_group_losses:
                for g, v in enumerate(values):
                    per_group[g].append(v)
            done = step + 1
            if done % self.eval_every == 0 or done == steps:
                eval_steps.append(done)
                eval_loss.append(self.evaluate())
                if measure_noise and done < steps:
                    noise.append({"step": done, "eval_loss": eval_loss[-1],
                                  **self.gradient_noise(done, noise_chunk)})
        return Curve(
            algorithm=self.algo.name, label=self.algo.display, seed=self.seed,
            groups=self.groups, group_size=self.group_size,
            batch_per_model=self.group_size * self.t.micro_batch,
            aggregate_every=self.k, train_loss=train,
            train_loss_per_group=per_group if self.keep_group_losses else [],
            eval_steps=eval_steps, eval_loss=eval_loss, noise=noise,
            wall_s=time.perf_counter() - start,
        )


def emulate(scenario: Scenario, algo: AlgorithmSpec, corpus: Any, *, seed: int | None = None,
            eval_every: int = 0, keep_group_losses: bool = True, noise_chunk: int = 0,
            ring_dtype: str = "") -> Curve:
    """One algorithm of `scenario`, emulated; seed (of the model's initialisation) defaults to
    the scenario's; noise_chunk > 0 measures the gradient noise scale at evaluation points;
    ring_dtype (e.g. bf16) reduces gradients as a ring in that dtype (`ring_grads`)."""
    seed = scenario.seed if seed is None else seed
    every = eval_every or max(1, scenario.training.steps)
    return GroupedTrainer(scenario, algo, corpus, seed=seed, eval_every=every,
                          keep_group_losses=keep_group_losses,
                          ring_dtype=ring_dtype).run(noise_chunk)


def perplexity(loss_nats: float) -> float:
    return math.exp(min(loss_nats, 700.0))
