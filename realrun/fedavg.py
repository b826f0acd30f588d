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
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from .model import TORCH_DTYPES


def local_shards(model: nn.Module) -> list[torch.Tensor]:
    """This rank's parameter shards (views into FSDP2's sharded storage), in parameter order."""
    return [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]


class FedAvg:
    def __init__(self, model: nn.Module, group: dist.ProcessGroup, groups: int, dtype: str):
        self.model, self.group, self.groups = model, group, groups
        self.dtype = TORCH_DTYPES[dtype]
        self.rounds = 0

    @property
    def nbytes(self) -> int:
        return sum(t.numel() for t in local_shards(self.model)) * self.dtype.itemsize

    @torch.no_grad()
    def __call__(self) -> None:
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
