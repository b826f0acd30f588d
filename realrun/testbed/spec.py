"""What a testbed is: nodes x ranks per node, the per-node link rate, the host cores they share,
and the names and addresses that follow from its prefix."""

from __future__ import annotations

import os
import re
from typing import ClassVar

from pydantic import Field, field_validator

from simfed.spec import Scenario
from simfed.spec.models import FrozenModel

DEFAULT_PREFIX = "sfb"
SUBNET_FMT = "10.213.{subnet}"  # private; exists only inside the testbed's namespaces
MAX_NODES = 64
MAX_RATE_GBPS = 40.0
PREFIX_RE = re.compile(r"[a-z][a-z0-9]{0,7}")


class TestbedError(RuntimeError):
    """A testbed that cannot be built, used or removed; the message is one line."""

    __test__ = False  # not a pytest test class


def check_prefix(prefix: str) -> None:
    if not PREFIX_RE.fullmatch(prefix):
        raise TestbedError(
            f"prefix {prefix!r}: use 1-8 lowercase letters or digits, starting with a letter"
        )


class TestbedSpec(FrozenModel):
    """What to build: nodes x ranks per node, the per-node link rate, the host cores they share."""

    __test__: ClassVar[bool] = False
    error: ClassVar[type[Exception]] = TestbedError

    nodes: int = Field(ge=1, le=MAX_NODES, strict=True, description="emulated nodes")
    rate_Gbps: float = Field(gt=0, le=MAX_RATE_GBPS, allow_inf_nan=False,
                             description="each node's link rate (a veth on this host)")
    ranks_per_node: int = Field(1, ge=1, strict=True, description="processes per node")
    cpu_cores: int = Field(0, ge=0, description="host cores per node (0 = no pinning: every "
                           "rank may use every core)")
    latency_us: float = Field(0.0, ge=0, allow_inf_nan=False,
                              description="added one-way per link with netem; 0 = the bridge's "
                              "own latency")
    prefix: str = Field(DEFAULT_PREFIX, description="name prefix of namespaces and links")
    subnet: int = Field(0, ge=0, le=255, description="third octet of 10.213.S.0/24")
    scenario: str = Field("", description="the scenario file it was built from")

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        if not PREFIX_RE.fullmatch(v):
            raise ValueError(f"{v!r}: use 1-8 lowercase letters or digits, starting with a "
                             "letter")
        return v

    @classmethod
    def from_scenario(cls, scenario: Scenario, *, prefix: str = DEFAULT_PREFIX,
                      emulate_latency: bool = False, source: str = "") -> TestbedSpec:
        """nodes, node.gpus ranks per node, node.nics.bw_Gbps x count as each node's link rate,
        node.cpu_cores; node.nics.latency_us only with `emulate_latency` (needs netem)."""
        c = scenario.cluster
        return cls(
            nodes=c.nodes, ranks_per_node=c.node.gpus,
            rate_Gbps=c.node.nics.bw_Gbps * c.node.nics.count, cpu_cores=c.node.cpu_cores,
            latency_us=c.node.nics.latency_us if emulate_latency else 0.0, prefix=prefix,
            scenario=source,
        )

    def replace(self, **changes: object) -> TestbedSpec:
        """A copy with `changes`, validated again."""
        return type(self)(**{**self.model_dump(), **changes})

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def switch_ns(self) -> str:
        return f"{self.prefix}-sw"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br"

    def node_ns(self, node: int) -> str:
        return f"{self.prefix}-n{node}"

    def node_ifname(self, node: int) -> str:
        """The veth inside node `node`'s namespace (what GLOO_SOCKET_IFNAME names)."""
        return f"{self.prefix}-e{node}"

    def port_ifname(self, node: int) -> str:
        return f"{self.prefix}-p{node}"

    def node_ip(self, node: int) -> str:
        return f"{SUBNET_FMT.format(subnet=self.subnet)}.{node + 1}"

    def cpu_set(self, node: int) -> tuple[int, ...]:
        """Host cores node `node`'s ranks are pinned to: `cpu_cores` per node, handed out in turn
        over the cores this process may use (nodes share cores when there are too few)."""
        avail = sorted(os.sched_getaffinity(0))
        if self.cpu_cores == 0:
            return tuple(avail)
        count = min(self.cpu_cores, len(avail))
        return tuple(sorted({avail[(node * self.cpu_cores + j) % len(avail)]
                             for j in range(count)}))

    @property
    def host_cores(self) -> int:
        """Distinct host cores all ranks together may run on."""
        return len({c for i in range(self.nodes) for c in self.cpu_set(i)})

    def tbf_args(self) -> list[str]:
        """tbf: the rate, a burst of ~1 ms of traffic (>= 32 KiB, so a full-size segment always
        fits) and a queue of ~20 ms (>= 256 KiB) before drops make TCP back off."""
        rate_Bps = self.rate_Gbps * 1e9 / 8
        burst_nbytes = max(int(rate_Bps * 1e-3), 32 * 1024)
        limit_nbytes = max(int(rate_Bps * 20e-3), 256 * 1024)
        return ["rate", f"{int(self.rate_Gbps * 1e9)}bit", "burst", str(burst_nbytes),
                "limit", str(limit_nbytes)]
