"""The collective operations, named once: the scenario's per-op keys, the simulator's collective
implementations and realrun's benchmarks all take their names from here."""

from __future__ import annotations

from typing import Literal, get_args

CollectiveOp = Literal["all_gather", "reduce_scatter", "all_reduce"]
OPS: tuple[str, ...] = get_args(CollectiveOp)
ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE = OPS
# where a per-collective factor applies: inside one node or across nodes, and the same for
# rings of two ranks ("_pair": one exchange each way with a single peer)
Domain = Literal["intra", "inter", "intra_pair", "inter_pair"]
DOMAINS: tuple[str, ...] = get_args(Domain)
