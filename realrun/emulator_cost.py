"""What emulating a run costs (`realrun converge`, `realrun converge-study`), checked before
anything is allocated: a run that would not fit in memory or not end is refused in one line."""

from __future__ import annotations

import os
from typing import Any

from .errors import RealrunError

# Measured with
# scenarios/convergence-tiny.yaml on one core of a shared 2-core host: 128 FL groups x 108,864
# parameters with 16,384 tokens per step peaked at 2.1 GB, 1,024 groups with 131,072 tokens at
# 11.7 GB; about 5 GFLOP/s (6 x parameters x tokens per step).
# The memory limit is a share of the host's memory: on a 24 GiB host the size study's FL+FSDP 32
# x 4 at hidden 1024 (17.7 GiB by the estimate below) ran, and at hidden 1280 (26.5 GiB) it was
# killed for memory. ASSUMPTION: 80% of the host, the rest for the system and the study's files.
HOST_SHARE = 0.8
FALLBACK_BYTES = 16 * 2**30  # where the host's memory cannot be read
MAX_CONVERGE_FLOPS = 1e15  # about two days at 5 GFLOP/s (the study's longest run: 4e13)


def max_converge_bytes() -> int:
    """HOST_SHARE of the host's physical memory (FALLBACK_BYTES where it cannot be read)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return FALLBACK_BYTES
    return int(HOST_SHARE * total) if total > 0 else FALLBACK_BYTES


def converge_cost(sc: Any, algo: Any) -> tuple[int, int, int, float]:
    """(groups, tokens a step, estimated bytes, FLOPs) of emulating `algo` of `sc`: 20 bytes
    per parameter per group (fp32 parameters, gradients, Adam's two moments, the FedAvg mean)
    and 16 bytes per activation value of the step's tokens (layers x (16 hidden + 4 ffn + 3
    heads x seq_len) + 4 vocab values a token: the model's tensors, x 4 for autograd and vmap
    as measured)."""
    m, t = sc.model, sc.training
    plan = algo.plan(sc.cluster)
    tokens = plan.world * t.micro_batch * t.seq_len
    per_token = m.layers * (16 * m.hidden + 4 * m.ffn_hidden + 3 * m.heads * t.seq_len) \
        + 4 * m.vocab
    nbytes = 20 * plan.groups * m.total_params + 16 * tokens * per_token
    return plan.groups, tokens, nbytes, 6.0 * m.total_params * tokens * t.steps


def check_converge_cost(sc: Any, algos: list[Any]) -> None:
    """A RealrunError naming the limit when emulating `algos` would not fit or not end."""
    for a in algos:
        groups, tokens, nbytes, flops = converge_cost(sc, a)
        what = (f"{a.display}: {groups:,} group{'' if groups == 1 else 's'} x "
                f"{sc.model.total_params:,} parameters, {tokens:,} tokens a step, "
                f"{sc.training.steps:,} steps")
        if nbytes > (limit := max_converge_bytes()):
            raise RealrunError(f"{what} need about {nbytes / 2**30:,.1f} GiB in the emulator; "
                               f"the limit is {limit / 2**30:.0f} GiB ({HOST_SHARE:.0%} of this "
                               "host's memory; fewer cluster.nodes or a smaller model)")
        if flops > MAX_CONVERGE_FLOPS:
            raise RealrunError(f"{what} are {flops:.2g} FLOPs; the limit is "
                               f"{MAX_CONVERGE_FLOPS:.0e} (about two days at the emulator's "
                               "5 GFLOP/s; fewer steps)")
