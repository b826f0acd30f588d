"""`runtime.shared_cores`: ranks that share host cores (the emulated CPU testbed).

The coefficients `simfed.contention.SharedCores` runs on, and one switch per mechanism, so a
calibrated profile's mechanism can be turned off with `--set runtime.shared_cores.NAME=false`
without losing its fitted value. Absent (every coefficient 0), the engine runs without host
contention at no cost. Which cores a rank runs on is the cluster's (`cluster.node.cpu_cores`,
`cluster.host_cores`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .ops import DOMAINS, OPS
from .schema import SpecError, param

MECHANISMS = ("slowdown", "spread", "group_drift", "host_work", "core_stack")


@dataclass(frozen=True, kw_only=True)
class SharedCoresSpec:
    # ---- out-of-step slowdown: ranks beside busy ranks of another federation group
    slowdown: bool = param(True, doc="switch: compute and collectives beside out-of-step ranks "
                           "run slower (compute_slowdown, comm_slowdown)")
    compute_slowdown: float = param(
        0.0, ge=0, doc="compute on a host core shared with busy ranks out of step with it "
        "(another federation group's) takes (1 + this) times as long as beside ranks computing "
        "in step (`realrun bench`'s compute-beside-busy case)")
    comm_slowdown: float = param(
        0.0, ge=0, doc="a collective whose ranks share host cores with busy ranks out of step "
        "with it takes (1 + this) times as long as when those ranks run the same collective in "
        "step (`realrun bench`'s one-group-beside-busy cases). Federation groups on shared "
        "cores are out of step between FedAvg rounds; a collective meets the other group's work "
        "for the share of time that group is busy (independent phases)")
    # ---- out-of-step spread: ranks beside out-of-step ranks finish unevenly
    spread: bool = param(True, doc="switch: beside out-of-step ranks, compute and collective "
                         "times vary from rank to rank (compute_cv, comm_cv), and the group "
                         "waits at its next collective for its latest member")
    compute_cv: float = param(
        0.0, ge=0, doc="relative standard deviation of a rank's compute time beside "
        "out-of-step ranks, beyond that of ranks in step")
    comm_cv: float = param(
        0.0, ge=0, doc="relative standard deviation of a rank's collective time beside "
        "out-of-step ranks, beyond that of ranks in step")
    # ---- group drift: federation groups on cores of their own
    group_drift: bool = param(True, doc="switch: federation groups on cores of their own drift "
                              "apart between FedAvg rounds (group_drift_ms_per_sqrt_s)")
    group_drift_ms_per_sqrt_s: float = param(
        0.0, ge=0, doc="the standard deviation of a rank's progress after 1 s of independent "
        "work, growing as the square root of the time (a random walk); the FedAvg all-reduce "
        "then waits for the group's latest member (`realrun bench`'s drift case)")
    # ---- host work per byte of a collective
    host_work: bool = param(True, doc="switch: collectives pay host_us_per_MB")
    host_us_per_MB: dict[str, float | dict[str, float]] = param(
        None, doc="per collective: host time per MB of its ring bytes that does not scale with "
        "the link rate (CPU ranks: copies, reductions, the kernel's network stack on the node's "
        "cores), times the ranks sharing a core; added to the wire time (gloo does it between "
        "its transfers); a number, or {intra: t, inter: t}; missing: 0")

    # ---- a host core's network stack shared by the nodes it carries
    core_stack: bool = param(True, doc="switch: collectives across nodes pay core_stack_Gbps")
    core_stack_Gbps: float = param(
        0.0, ge=0, doc="what one host core's network stack (veth, TCP) moves for all the "
        "nodes' flows it carries; a collective across nodes whose nodes share cores moves its "
        "bytes at the lower of the link's rate and the core's share (`realrun bench` on 4 nodes "
        "of one rank over 2 cores); 0: never binds")

    def __post_init__(self) -> None:
        for op, f in (self.host_us_per_MB or {}).items():
            where = f"runtime.shared_cores.host_us_per_MB.{op}"
            if op not in OPS:
                raise SpecError(f"{where}: expected all_gather, reduce_scatter or all_reduce")
            for dom, v in (f.items() if isinstance(f, dict) else [("", f)]):
                if dom not in ("", *DOMAINS):
                    raise SpecError(f"{where}.{dom}: expected one of {', '.join(DOMAINS)}")
                if not v >= 0:
                    raise SpecError(f"{where}{'.' + dom if dom else ''}: expected a number "
                                    f">= 0, got {v!r}")

    def host_s_per_byte(self, op: str, intra: bool) -> float:
        """Link-rate-independent host seconds per ring byte of collective `op` (0 when the
        host_work switch is off)."""
        if not self.host_work:
            return 0.0
        f = (self.host_us_per_MB or {}).get(op, 0.0)
        if isinstance(f, dict):
            f = f.get("intra" if intra else "inter", 0.0)
        return float(f) * 1e-12

    @property
    def compute_slowdown_on(self) -> float:
        return self.compute_slowdown if self.slowdown else 0.0

    @property
    def comm_slowdown_on(self) -> float:
        return self.comm_slowdown if self.slowdown else 0.0

    @property
    def compute_cv_on(self) -> float:
        return self.compute_cv if self.spread else 0.0

    @property
    def comm_cv_on(self) -> float:
        return self.comm_cv if self.spread else 0.0

    @property
    def group_drift_s_per_sqrt_s(self) -> float:
        return self.group_drift_ms_per_sqrt_s * 1e-3 if self.group_drift else 0.0
