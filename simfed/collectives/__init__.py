"""Collectives as alpha-beta phases over ring loads, behind a name-keyed registry.

Ring (Thakur, Rabenseifner & Gropp 2005; NCCL bus bandwidth, nccl-tests PERFORMANCE.md): over p
ranks, all-gather and reduce-scatter of an S-byte (gathered / unreduced) buffer move E = (p-1)/p S
per rank in p-1 steps; all-reduce moves E = 2(p-1)/p S in 2(p-1) steps. Time alone on the
network: launch + steps x (hop latency + per-step software latency) + max over links of
(bytes on that link / its bandwidth).

Hierarchical: intra-node first, then across nodes among same-local-index ranks (one ring per
rail), then intra-node again (all-reduce = RS in node, AR across, AG in node; all-gather = AG
across of the node's shard, then AG in node; reduce-scatter the mirror image).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..spec.ops import ALL_GATHER, ALL_REDUCE, OPS, REDUCE_SCATTER
from ..spec.schema import SpecError


@dataclass(frozen=True, slots=True)
class Phase:
    """One ring pass: instances (rank tuples), per-rank bytes E = e_factor x S, ring steps."""

    instances: tuple[tuple[int, ...], ...]
    e_factor: float
    steps: int
    op: str

    @property
    def pair(self) -> bool:
        """A ring of two ranks (its own bandwidth factor: one exchange each way with a peer)."""
        return max(map(len, self.instances)) == 2


def _ring_factor(op: str, p: int) -> tuple[float, int]:
    if p < 2:
        return 0.0, 0
    if op == ALL_REDUCE:
        return 2.0 * (p - 1) / p, 2 * (p - 1)
    if op in (ALL_GATHER, REDUCE_SCATTER):
        return (p - 1) / p, p - 1
    raise SpecError(f"collective op {op!r} is unknown; valid: {', '.join(OPS)}")


def ring(op: str, instances: Sequence[tuple[int, ...]], gpus_per_node: int) -> list[Phase]:
    p = max(map(len, instances))
    e, steps = _ring_factor(op, p)
    return [Phase(tuple(instances), e, steps, op)] if steps else []


def hierarchical(op: str, instances: Sequence[tuple[int, ...]], gpus_per_node: int) -> list[Phase]:
    """Split every instance by node (intra) and by local index (inter)."""
    intra: list[tuple[int, ...]] = []
    inter: list[tuple[int, ...]] = []
    for inst in instances:
        by_node: dict[int, list[int]] = defaultdict(list)
        by_local: dict[int, list[int]] = defaultdict(list)
        for r in inst:
            by_node[r // gpus_per_node].append(r)
            by_local[r % gpus_per_node].append(r)
        intra.extend(tuple(v) for v in by_node.values())
        inter.extend(tuple(v) for v in by_local.values())
    q = max(len(i) for i in intra)
    n = max(len(i) for i in inter)
    if n < 2 or q < 2:
        return ring(op, instances, gpus_per_node)

    def phase(kind: str, parts: list[tuple[int, ...]], scale: float) -> Phase:
        e, steps = _ring_factor(kind, max(len(x) for x in parts))
        return Phase(tuple(parts), e * scale, steps, kind)

    if op == ALL_REDUCE:
        return [phase(REDUCE_SCATTER, intra, 1.0), phase(ALL_REDUCE, inter, 1.0 / q),
                phase(ALL_GATHER, intra, 1.0)]
    if op == ALL_GATHER:
        return [phase(ALL_GATHER, inter, 1.0 / q), phase(ALL_GATHER, intra, 1.0)]
    if op == REDUCE_SCATTER:
        return [phase(REDUCE_SCATTER, intra, 1.0), phase(REDUCE_SCATTER, inter, 1.0 / q)]
    raise SpecError(f"collective op {op!r} is unknown; valid: {', '.join(OPS)}")


CollectiveImpl = Callable[[str, Sequence[tuple[int, ...]], int], list[Phase]]
COLLECTIVES: dict[str, CollectiveImpl] = {"ring": ring, "hierarchical": hierarchical}


def collective_impl(name: str) -> CollectiveImpl:
    try:
        return COLLECTIVES[name]
    except KeyError:
        raise SpecError(
            f"runtime.comm.collective: {name!r} is unknown; valid: {', '.join(COLLECTIVES)}"
        ) from None
