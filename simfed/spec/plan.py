"""The parallel plan: nodes x GPUs, shard / replicate / federation sizes, and rank -> group maps.

Rank layout (the same in simfed and realrun's DeviceMesh of shape (groups, replicate, shard)):

    rank = group * (replicate * shard) + replica * shard + shard_index
    node = rank // gpus_per_node,  local GPU = rank % gpus_per_node

So a federation group is a contiguous block of nodes; a shard group is `shard` consecutive ranks;
a replica group joins the ranks with the same shard index inside a federation group; an averaging
(FedAvg) group joins the ranks with the same (replica, shard) position in every federation group,
i.e. same-position GPUs of different nodes: one ring per NIC rail.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .algorithms import algorithm_info
from .schema import SpecError

# Process-group kinds, also the mesh dimension names of realrun's DeviceMesh.
SHARD, REPLICATE, FED = "shard", "replicate", "fed"
PG_KINDS = (SHARD, REPLICATE, FED)


@dataclass(frozen=True, kw_only=True)
class ParallelPlan:
    nodes: int
    gpus_per_node: int
    shard: int
    replicate: int = 1
    groups: int = 1

    def __post_init__(self) -> None:
        for name in ("nodes", "gpus_per_node", "shard", "replicate", "groups"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise SpecError(f"plan.{name}: must be a positive integer, got {value!r}")
        world = self.nodes * self.gpus_per_node
        used = self.shard * self.replicate * self.groups
        if used != world:
            raise SpecError(
                f"plan: shard {self.shard} x replicate {self.replicate} x groups {self.groups}"
                f" = {used}, but the cluster has {world} GPUs"
                f" ({self.nodes} nodes x {self.gpus_per_node})"
            )
        gsize = self.group_size
        if gsize % self.gpus_per_node and self.gpus_per_node % gsize:
            raise SpecError(
                f"plan: a federation group of {gsize} GPUs does not align with nodes of "
                f"{self.gpus_per_node} GPUs (groups are contiguous blocks of whole nodes)"
            )

    @classmethod
    def for_algorithm(
        cls,
        algorithm: str,
        *,
        nodes: int,
        gpus_per_node: int,
        group_nodes: int | None = None,
        shard_size: int | None = None,
    ) -> ParallelPlan:
        """The plan an algorithm uses on a cluster (see `algorithms.py`):
        fsdp: shard over the world; hsdp: shard within `shard_size` GPUs (default a node),
        replicate across; fl_*: federation groups of `group_nodes` nodes, each running fsdp/hsdp."""
        info = algorithm_info(algorithm)
        world = nodes * gpus_per_node
        if info.federated:
            if group_nodes is None:
                raise SpecError(f"algorithms.{algorithm}.group_nodes: required for {algorithm}")
            if group_nodes < 1 or nodes % group_nodes:
                raise SpecError(
                    f"algorithms.{algorithm}.group_nodes: {group_nodes} does not divide the "
                    f"cluster's {nodes} nodes"
                )
            groups = nodes // group_nodes
        else:
            groups = 1
        group_gpus = world // groups
        if info.hybrid:
            shard = shard_size or gpus_per_node
            if shard < 1 or group_gpus % shard:
                raise SpecError(
                    f"algorithms.{algorithm}.shard_size: {shard} does not divide the "
                    f"{group_gpus} GPUs of a group"
                )
            replicate = group_gpus // shard
        else:
            shard, replicate = group_gpus, 1
        return cls(
            nodes=nodes, gpus_per_node=gpus_per_node, shard=shard, replicate=replicate,
            groups=groups,
        )

    # ---- sizes --------------------------------------------------------------------------
    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def group_size(self) -> int:
        """GPUs per federation group (one model copy)."""
        return self.shard * self.replicate

    @property
    def mesh_shape(self) -> tuple[int, int, int]:
        """(groups, replicate, shard): realrun's DeviceMesh shape, dims named PG_KINDS reversed."""
        return (self.groups, self.replicate, self.shard)

    # ---- rank maps ----------------------------------------------------------------------
    def coords(self, rank: int) -> tuple[int, int, int]:
        """rank -> (group, replica, shard_index)."""
        if not 0 <= rank < self.world:
            raise SpecError(f"plan: rank {rank} outside 0..{self.world - 1}")
        group, rest = divmod(rank, self.group_size)
        replica, shard_index = divmod(rest, self.shard)
        return group, replica, shard_index

    def rank_of(self, group: int, replica: int, shard_index: int) -> int:
        return group * self.group_size + replica * self.shard + shard_index

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def local_of(self, rank: int) -> int:
        return rank % self.gpus_per_node

    def group_nodes(self, group: int) -> range:
        """The contiguous block of nodes of a federation group (whole-node groups)."""
        first = group * self.group_size // self.gpus_per_node
        count = max(1, self.group_size // self.gpus_per_node)
        return range(first, first + count)

    @cached_property
    def process_groups(self) -> dict[str, tuple[tuple[int, ...], ...]]:
        """Every process group of each kind as a tuple of rank tuples. A kind whose groups have a
        single member does no communication but is listed for completeness."""
        ranks = np.arange(self.world).reshape(self.groups, self.replicate, self.shard)
        shard = _rows(ranks.reshape(-1, self.shard))
        replicate = _rows(ranks.transpose(0, 2, 1).reshape(-1, self.replicate))
        fed = _rows(ranks.transpose(1, 2, 0).reshape(-1, self.groups))
        return {"shard": shard, "replicate": replicate, "fed": fed}

    def group_of(self, kind: str, rank: int) -> tuple[int, ...]:
        """The ranks of `rank`'s process group of a kind (shard, replicate or fed)."""
        g, r, s = self.coords(rank)
        if kind == SHARD:
            return tuple(self.rank_of(g, r, i) for i in range(self.shard))
        if kind == REPLICATE:
            return tuple(self.rank_of(g, i, s) for i in range(self.replicate))
        if kind == FED:
            return tuple(self.rank_of(i, r, s) for i in range(self.groups))
        raise SpecError(f"plan: unknown process-group kind {kind!r}; valid: {', '.join(PG_KINDS)}")

    def describe(self) -> str:
        return (
            f"{self.nodes} nodes x {self.gpus_per_node} GPUs: {self.groups} group(s) x "
            f"replicate {self.replicate} x shard {self.shard}"
        )


def _rows(table: np.ndarray) -> tuple[tuple[int, ...], ...]:
    """A 2-D array's rows as tuples of ints: many short rows are zipped from the columns (the
    tuples are built in C), few long ones converted row by row."""
    n, k = table.shape
    if k <= n:
        return tuple(zip(*(table[:, j].tolist() for j in range(k)), strict=True))
    return tuple(map(tuple, table.tolist()))
