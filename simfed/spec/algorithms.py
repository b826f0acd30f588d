"""The catalogue of training algorithms, as data shared by the simulator and realrun."""

from __future__ import annotations

from dataclasses import dataclass

from .schema import SpecError


@dataclass(frozen=True, kw_only=True)
class AlgorithmInfo:
    name: str
    title: str
    federated: bool  # several model copies averaged every K steps (FedAvg)
    hybrid: bool  # HSDP inside a model copy: shard within a node, replicate across nodes
    summary: str


ALGORITHMS: dict[str, AlgorithmInfo] = {
    a.name: a
    for a in (
        AlgorithmInfo(
            name="fsdp", title="FSDP", federated=False, hybrid=False,
            summary="one model fully sharded over every GPU",
        ),
        AlgorithmInfo(
            name="hsdp", title="HSDP", federated=False, hybrid=True,
            summary="shard within a node, replicate across nodes, gradient all-reduce per unit",
        ),
        AlgorithmInfo(
            name="fl_fsdp", title="FL+FSDP", federated=True, hybrid=False,
            summary="one fully sharded model per group of nodes, FedAvg every K steps",
        ),
        AlgorithmInfo(
            name="fl_hsdp", title="FL+HSDP", federated=True, hybrid=True,
            summary="one HSDP model per group of nodes, FedAvg every K steps",
        ),
    )
}


def algorithm_info(name: str) -> AlgorithmInfo:
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise SpecError(
            f"algorithm {name!r} is unknown; valid: {', '.join(ALGORITHMS)}"
        ) from None
