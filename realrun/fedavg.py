"""FedAvg across federation groups, as the paper's code runs it.

Every K = aggregate_every steps, after the optimizer and LR-scheduler step, each rank packs all
of its local parameter shards into one flat buffer, all-reduces it (sum) over its `fed` process
group (the ranks with the same (replica, shard) position in every group, one per group), divides
by the number of groups and copies the mean back into its shards. One blocking collective per
rank; parameters only: optimizer moments, step counters and LR schedules stay local to each
group and are never averaged or reset. Groups are equal-sized, so the mean is unweighted.

Dtype: the buffer is `fedavg_dtype` (bf16 by default, as the paper's pure-bf16 runs on GPUs);
fp32 parameters averaged in bf16 are rounded to bf16. The CPU scenario sets fedavg_dtype fp32,
so the average of its fp32 models is exact to float rounding.
Because all-reduce leaves the same sum on every member and every member divides it the same way,
all groups hold bitwise-identical parameters afterwards.

FL variants, one generalised round (`FedAvg.__call__(steps_taken, participate)`, used
whenever a variant is on; the plain round above is kept bit for bit otherwise). Each rank keeps
the global model of the last round (the anchor, fp32) and:
- FedNova-style weights (time-budgeted rounds): group g took n_g local steps; its per-step
  update is d_g = (anchor - theta_g) / n_g; the round's delta is tau_eff * mean_g d_g with
  tau_eff = mean_g n_g (Wang et al. 2020, FedNova, with equal data weights). With every
  n_g = K this is anchor - mean_g theta_g: plain FedAvg.
- partial participation: a group that missed the deadline sends d = 0, n = 0 and does not count
  in the means; every group, late ones included, takes the new global model (re-synchronised).
  A round nobody made leaves the anchor as it was (everyone goes back to it).
- outer optimizer: `average` sets theta = anchor - delta; `nesterov` (DiLoCo, Douillard et al.
  2023) treats delta as a gradient: m = mu m + delta, theta = anchor - lr (delta + mu m).
The deltas are summed over the fed group in `fedavg_dtype`, the counts (n_g, participation) in
fp64 (a second, 2-element all-reduce).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from .model import TORCH_DTYPES


def local_shards(model: nn.Module) -> list[torch.Tensor]:
    """This rank's parameter shards (views into FSDP2's sharded storage), in parameter order."""
    return [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]


def outer_step(anchor: torch.Tensor, delta: torch.Tensor, momentum_buf: torch.Tensor | None,
               *, lr: float = 1.0, momentum: float = 0.0) -> torch.Tensor:
    """The new global parameters from the anchor and the round's delta (fp32, flat), updating
    momentum_buf in place: plain averaging (momentum_buf None: anchor - delta) or Nesterov
    momentum on the delta as DiLoCo's outer SGD (torch.optim.SGD(nesterov=True)'s update)."""
    if momentum_buf is None:
        return anchor - delta
    momentum_buf.mul_(momentum).add_(delta)
    return anchor - lr * (delta + momentum * momentum_buf)


class FedAvg:
    def __init__(self, model: nn.Module, group: dist.ProcessGroup, groups: int, dtype: str,
                 *, outer_optimizer: str = "average", outer_lr: float = 0.7,
                 outer_momentum: float = 0.9, variant: bool = False):
        """`variant`: rounds may take steps_taken / participate (keep the anchor from the
        start; an outer optimizer always does). Every group must be at the same parameters
        here (the same seed builds the same model)."""
        self.model, self.group, self.groups = model, group, groups
        self.dtype = TORCH_DTYPES[dtype]
        self.rounds = 0
        self.outer_optimizer, self.outer_lr, self.outer_momentum = (
            outer_optimizer, outer_lr, outer_momentum)
        self._anchor: torch.Tensor | None = None  # fp32 global model of the last round (flat)
        self._momentum: torch.Tensor | None = None
        if variant or outer_optimizer != "average":
            self._anchor = self._flat(torch.float32)
        if outer_optimizer == "nesterov":
            self._momentum = torch.zeros_like(self._flat(torch.float32))

    def _flat(self, dtype: torch.dtype) -> torch.Tensor:
        return torch.cat([t.detach().reshape(-1).to(dtype) for t in local_shards(self.model)])

    def _write(self, flat: torch.Tensor) -> None:
        offset = 0
        for t in local_shards(self.model):
            n = t.numel()
            t.copy_(flat[offset:offset + n].view_as(t))
            offset += n

    @property
    def nbytes(self) -> int:
        return sum(t.numel() for t in local_shards(self.model)) * self.dtype.itemsize

    @torch.no_grad()
    def __call__(self, steps_taken: int | None = None, participate: bool = True) -> dict:
        """One round. Without arguments and with plain averaging: FedAvg as the paper's code
        runs it. With the local steps this group took and whether it made the deadline: the
        generalised round of the module note. Returns what the round saw (groups in, steps)."""
        if steps_taken is None and participate and self.outer_optimizer == "average":
            self._plain()
            return {"participants": self.groups, "steps_mean": None}
        return self._general(steps_taken, participate)

    def _general(self, steps_taken: int | None, participate: bool) -> dict:
        if self._anchor is None:
            raise RuntimeError("FedAvg: a round with steps_taken / participate needs "
                               "FedAvg(..., variant=True) (the anchor is kept from the start)")
        n = float(steps_taken) if steps_taken is not None else 1.0
        local = self._flat(torch.float32)
        counted = participate and n > 0
        per_step = (self._anchor - local) / n if counted else torch.zeros_like(local)
        buf = per_step.to(self.dtype)
        dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=self.group)
        counts = torch.tensor([n if counted else 0.0, 1.0 if counted else 0.0],
                              dtype=torch.float64, device=buf.device)
        dist.all_reduce(counts, op=dist.ReduceOp.SUM, group=self.group)
        steps_sum, participants = float(counts[0]), round(float(counts[1]))
        if participants > 0:
            tau_eff = steps_sum / participants
            delta = buf.to(torch.float32) * (tau_eff / participants)
            self._anchor = outer_step(self._anchor, delta, self._momentum, lr=self.outer_lr,
                                      momentum=self.outer_momentum)
        self._write(self._anchor)
        self.rounds += 1
        return {"participants": participants,
                "steps_mean": (steps_sum / participants if participants else 0.0)
                if steps_taken is not None else None}

    def _plain(self) -> None:
        shards = local_shards(self.model)
        flat = torch.cat([t.reshape(-1).to(self.dtype) for t in shards])  # (local numel,)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        flat.div_(self.groups)
        offset = 0
        for t in shards:
            n = t.numel()
            t.copy_(flat[offset:offset + n].view_as(t))
            offset += n
        self.rounds += 1
