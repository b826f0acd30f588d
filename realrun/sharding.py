"""FSDP2 wrapping of one model copy: `fully_shard` per decoder block plus the root, over the
group's sub-mesh, with the algorithm's prefetch settings.

- fsdp, fl_fsdp: 1-D mesh (shard): parameters sharded over the group, all-gather before forward
  and backward, reduce-scatter of gradients.
- hsdp, fl_hsdp: 2-D mesh (replicate, shard): sharded within `shard` ranks, replicated across
  `replicate`; FSDP2 adds an all-reduce of the gradient shard over the replicate dimension.
Parameters keep the model dtype for compute and gradient reduction (pure bf16 as in the paper
when model.dtype is bf16; fp32 for the CPU tiny model). Activation checkpointing, when the
scenario asks for it, runs inside each checkpointed block's forward (realrun.model), below
the block's FSDP2 hooks.

Prefetch (FSDP2 has no "post" backward prefetch): forward_prefetch=true prefetches the next
block's all-gather explicitly; backward_prefetch "pre" keeps FSDP2's default (one block ahead)
and "post" maps to it; "none" sets each block's prefetch list to itself, which disables the
default and issues nothing extra, like FSDP1's backward_prefetch=None.
"""

from __future__ import annotations

import itertools
from typing import Any

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from simfed.spec import AlgorithmSpec

from .model import Llama


def shard_model(model: Llama, mesh: DeviceMesh, algo: AlgorithmSpec) -> dict[str, Any]:
    """Wrap `model` in place; returns the settings used (for the trace meta and summary)."""
    blocks: list[FSDPModule] = []
    last = len(model.layers) - 1
    for i, block in enumerate(model.layers):
        # reshard_last_layer_after_forward false: torchtitan's wrap policy (apply_fsdp at
        # eef8bb2), the last block stays unsharded until its backward
        keep = i == last and not algo.reshard_last_layer_after_forward
        fully_shard(block, mesh=mesh, reshard_after_forward=not keep)
        blocks.append(block)  # type: ignore[arg-type]
    # the root unit (embedding, norm, head): kept unsharded from forward to backward as FSDP1
    # does, unless the scenario asks to reshard it (then backward all-gathers it again)
    fully_shard(model, mesh=mesh, reshard_after_forward=algo.reshard_root_after_forward)
    if algo.forward_prefetch:
        for this, nxt in itertools.pairwise(blocks):
            this.set_modules_to_forward_prefetch([nxt])
    backward = algo.backward_prefetch
    if backward == "none":
        for unit in [model, *blocks]:
            unit.set_modules_to_backward_prefetch([unit])  # type: ignore[operator]
    return {
        "units": 1 + len(blocks),
        "mesh": dict(zip(mesh.mesh_dim_names or (), mesh.shape, strict=True)),
        "forward_prefetch": algo.forward_prefetch,
        "backward_prefetch": backward,
        "fsdp2_backward_prefetch": "none" if backward == "none" else "pre (one block ahead)",
        "reshard_after_forward": True,
        "reshard_last_layer_after_forward": algo.reshard_last_layer_after_forward,
        "reshard_root_after_forward": algo.reshard_root_after_forward,
    }
