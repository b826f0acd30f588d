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
# Bytes per activation value of a step's tokens (see converge_cost), measured as peak RSS on the
# size study's Llama: one model (FSDP, 128 sequences of 32 tokens) at hidden 512 / 768, 3 steps:
# 22 / 23; at hidden 1536 over a whole 128-step run: 34 (12.5 GiB, where 16 estimated 6.2 and
# a second process beside it was killed for memory). Groups stacked under vmap (FL+FSDP 8 x 4 at
# hidden 1536: 9.2 GiB, 16 estimated 9.4) keep 16.
ACT_BYTES_ONE_MODEL = 34
ACT_BYTES_GROUPS = 16
MAX_CONVERGE_FLOPS = 1e15  # about two days at 5 GFLOP/s (the study's longest run: 4e13)


def max_converge_bytes() -> int:
    """HOST_SHARE of the host's physical memory (FALLBACK_BYTES where it cannot be read)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return FALLBACK_BYTES
    return int(HOST_SHARE * total) if total > 0 else FALLBACK_BYTES


def free_bytes() -> int | None:
    """The memory the kernel can give a new process now (MemAvailable), None where unknown:
    another process (a second study) may hold part of the host."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def converge_cost(sc: Any, algo: Any) -> tuple[int, int, int, float]:
    """(groups, tokens a step, estimated bytes, FLOPs) of emulating `algo` of `sc`: 20 bytes
    per parameter per group (fp32 parameters, gradients, Adam's two moments, the FedAvg mean)
    and ACT_BYTES_* per activation value of the step's tokens (layers x (16 hidden + 4 ffn + 3
    heads x seq_len) + 4 vocab values a token: the model's tensors, with autograd's and vmap's
    copies as measured)."""
    m, t = sc.model, sc.training
    plan = algo.plan(sc.cluster)
    tokens = plan.world * t.micro_batch * t.seq_len
    per_token = m.layers * (16 * m.hidden + 4 * m.ffn_hidden + 3 * m.heads * t.seq_len) \
        + 4 * m.vocab
    act = ACT_BYTES_ONE_MODEL if plan.groups == 1 else ACT_BYTES_GROUPS
    nbytes = 20 * plan.groups * m.total_params + act * tokens * per_token
    return plan.groups, tokens, nbytes, 6.0 * m.total_params * tokens * t.steps


def check_converge_cost(sc: Any, algos: list[Any]) -> None:
    """A RealrunError naming the limit when emulating `algos` would not fit or not end."""
    limit, why = max_converge_bytes(), f"{HOST_SHARE:.0%} of this host's memory"
    free = free_bytes()
    if free is not None and free < limit:
        limit, why = free, "the memory free now: other processes hold the rest"
    for a in algos:
        groups, tokens, nbytes, flops = converge_cost(sc, a)
        what = (f"{a.display}: {groups:,} group{'' if groups == 1 else 's'} x "
                f"{sc.model.total_params:,} parameters, {tokens:,} tokens a step, "
                f"{sc.training.steps:,} steps")
        if nbytes > limit:
            raise RealrunError(f"{what} need about {nbytes / 2**30:,.1f} GiB in the emulator; "
                               f"the limit is {limit / 2**30:.0f} GiB ({why}; fewer "
                               "cluster.nodes or a smaller model)")
        if flops > MAX_CONVERGE_FLOPS:
            raise RealrunError(f"{what} are {flops:.2g} FLOPs; the limit is "
                               f"{MAX_CONVERGE_FLOPS:.0e} (about two days at the emulator's "
                               "5 GFLOP/s; fewer steps)")
