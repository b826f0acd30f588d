"""Stragglers and heterogeneity in a scenario (`stragglers:`): slow nodes and GPUs, degraded
NICs, per-step jitter, and how the engine simulates them."""

from __future__ import annotations

from dataclasses import dataclass

from .schema import param


@dataclass(frozen=True, kw_only=True)
class SlowNode:
    node: int = param(ge=0)
    factor: float = param(gt=0, doc="compute time multiplier (2.0 = half speed)")


@dataclass(frozen=True, kw_only=True)
class SlowGpu:
    rank: int = param(ge=0)
    factor: float = param(gt=0)


@dataclass(frozen=True, kw_only=True)
class DegradedNic:
    node: int = param(ge=0)
    factor: float = param(gt=0, le=1, doc="fraction of the rails' bandwidth left")


@dataclass(frozen=True, kw_only=True)
class JitterSpec:
    distribution: str = param("lognormal", choices=("lognormal", "uniform"))
    sigma: float = param(0.0, ge=0, doc="lognormal sigma, or uniform half-width")
    level: str = param("node", choices=("node", "gpu"), doc="one draw per node or per GPU")


@dataclass(frozen=True, kw_only=True)
class StragglerSpec:
    slow_nodes: tuple[SlowNode, ...] = ()
    slow_gpus: tuple[SlowGpu, ...] = ()
    degraded_nics: tuple[DegradedNic, ...] = ()
    jitter: JitterSpec = JitterSpec()
    method: str = param(
        "order_stats", choices=("order_stats", "per_rank"),
        doc="order_stats: the run's pace from the order statistics of the factor table (the "
        "slowest shard group per step, the slowest federation group per FedAvg round), fast "
        "at any size; per_rank: every distinct rank simulated (the exact reference)")

    @property
    def any(self) -> bool:
        return bool(self.slow_nodes or self.slow_gpus or self.degraded_nics or self.jitter.sigma)
