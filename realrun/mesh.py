"""The device mesh: backend and device of this rank, and a DeviceMesh of shape
(groups, replicate, shard) named ("fed", "replicate", "shard") built from the `ParallelPlan`.

The mesh's row-major rank order is the plan's layout,
rank = group * (replicate * shard) + replica * shard + shard_index, so the process group of each
mesh dimension is exactly `plan.group_of(kind, rank)`; `Mesh.kind_of` maps a torch process group
back to its kind for tracing ("world" for the default group). Every dimension's group gets the
run's collective timeout (new groups would otherwise get torch's 30-minute default).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from simfed.spec import FED, REPLICATE, SHARD, ParallelPlan

from .errors import RealrunError

MESH_DIMS = (FED, REPLICATE, SHARD)


@dataclass(frozen=True)
class Placement:
    """Where this process runs: torchrun's rank variables, backend and device."""

    rank: int
    local_rank: int
    world: int
    backend: str
    device: torch.device

    @classmethod
    def from_env(cls, device: str = "auto") -> Placement:
        try:
            rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
            world = int(os.environ["WORLD_SIZE"])
        except KeyError as exc:
            raise RealrunError(
                f"environment variable {exc.args[0]} is not set: launch with torchrun or "
                "`realrun run`"
            ) from None
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda":
            if not torch.cuda.is_available():
                raise RealrunError(f"rank {rank}: --device cuda but CUDA is not available")
            count = torch.cuda.device_count()
            if local_rank >= count:
                raise RealrunError(
                    f"rank {rank}: local rank {local_rank} has no GPU (this node has {count})"
                )
            torch.cuda.set_device(local_rank)
            return cls(rank, local_rank, world, "nccl", torch.device("cuda", local_rank))
        if device != "cpu":
            raise RealrunError(f"--device: must be auto, cpu or cuda, got {device!r}")
        return cls(rank, local_rank, world, "gloo", torch.device("cpu"))


def init_process_group(placement: Placement, timeout_s: float) -> None:
    """The default process group; `timeout_s` bounds every collective, so a dead peer ends the
    run with an error instead of a hang."""
    kwargs = {"device_id": placement.device} if placement.backend == "nccl" else {}
    dist.init_process_group(placement.backend, timeout=timedelta(seconds=timeout_s), **kwargs)


def _group_options(backend: str, timeout_s: float) -> tuple[str, Any]:
    """(backend, options) of a mesh dimension's process group, carrying the timeout."""
    timeout = timedelta(seconds=timeout_s)
    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return backend, opts
    return backend, dist.ProcessGroupGloo.Options(backend, timeout)


class Mesh:
    """The 3-D DeviceMesh of a plan and the process group of each of its dimensions."""

    def __init__(self, plan: ParallelPlan, placement: Placement, timeout_s: float):
        if placement.world != plan.world:
            raise RealrunError(
                f"world size {placement.world} (torchrun) does not match the plan: "
                f"{plan.describe()} = {plan.world} ranks"
            )
        self.plan, self.rank = plan, placement.rank
        self.device_mesh: DeviceMesh = init_device_mesh(
            placement.device.type, plan.mesh_shape, mesh_dim_names=MESH_DIMS,
            backend_override={d: _group_options(placement.backend, timeout_s) for d in MESH_DIMS},
        )
        self._kinds: dict[str, str] = {}
        for kind in MESH_DIMS:
            pg = self.device_mesh.get_group(kind)
            ranks = tuple(dist.get_process_group_ranks(pg))
            expected = plan.group_of(kind, self.rank)
            if ranks != expected:
                raise RealrunError(
                    f"rank {self.rank}: mesh dimension {kind} holds ranks {ranks}, the plan says "
                    f"{expected}"
                )
            self._kinds.setdefault(pg.group_name, kind)
        # A mesh dimension that spans the world may reuse the default group: name it by the dim.
        self._kinds.setdefault(dist.group.WORLD.group_name, "world")

    @property
    def coords(self) -> tuple[int, int, int]:
        return self.plan.coords(self.rank)

    def group(self, kind: str) -> dist.ProcessGroup:
        return self.device_mesh.get_group(kind)

    def model_mesh(self) -> DeviceMesh:
        """The sub-mesh one model copy is sharded over: (replicate, shard) for HSDP, else
        (shard,). DeviceMesh slicing keeps the slice that holds this rank's group."""
        if self.plan.replicate > 1:
            return self.device_mesh[REPLICATE, SHARD]
        return self.device_mesh[SHARD]

    def kind_of(self, group: dist.ProcessGroup | None) -> str:
        """The mesh dimension ("shard", "replicate", "fed") or "world" of a process group."""
        if group is None:
            return "world"
        kind = self._kinds.get(group.group_name)
        if kind is not None:
            return kind
        ranks = tuple(dist.get_process_group_ranks(group))
        for k in MESH_DIMS:
            if ranks == self.plan.group_of(k, self.rank):
                return k
        return "world" if len(ranks) == self.plan.world else "other"
