"""NCCL's own cost model: algorithm and protocol choice, latency per hop by link class, bandwidth
per protocol (NVIDIA/nccl src/graph/tuning.cc, ncclTopoTuneModel; constants per release in
`nccl_tuning.yaml`, with their commits).

For a collective of S bytes (nccl-tests' "size": the gathered buffer of an all-gather, the input of
a reduce-scatter, the buffer of an all-reduce) over n ranks on N nodes (q = n / N per node), every
enabled (algorithm, protocol) gets a time t = latency + S / algbw and NCCL runs the fastest:
- ring (all ops): latency = base + (nsteps - nInter) x intraLat + nInter x interLat, nsteps =
  2(n-1) (all-reduce) or n-1, nInter = 2(N-1) or N-1: each hop is charged by its link class.
  Bus bandwidth: the ring's slowest link class (NVLink egress, or the node's rails that carry its
  ring traffic) x that class's efficiency; LL takes the release's share of it (v2.18-v2.20: 1/4
  for all-reduce or across nodes, 1/3 otherwise; from v2.22: 1/2; capped at llMaxBw), LL128 0.92
  (0.7 with one GPU per node before v2.23; capped per channel).
- tree (all-reduce across nodes): latency = base + 2((q-1) intraLat + log2(N) interLat); bus
  bandwidth 0.92 x the link's (capped per channel), algbw = busbw / 2.
- PAT (all-gather, reduce-scatter with one GPU per node, NCCL >= 2.23): latency = base +
  log2(N) interLat / 3.5 + 2.8 n; bandwidth the ring's x pat_bw_factor, no ring conversion.
- NVLS (NVSwitch with multicast, Hopper and later): latency = NVLS intraLat (+ interLat across
  nodes); all-reduce bus bandwidth `nvls_allreduce_gain` x the ring's (NCCL: 2 x nvlsEfficiency
  x (nc-1)/nc of the NVLS graph's bandwidth; NVIDIA's maintainer: ~480 GB/s busbw against ring's
  ~370 GB/s on 8 H100, nccl-tests issue #212); all-gather / reduce-scatter inside one node only.
nccl-tests' bus bandwidth is algbw x 2(n-1)/n (all-reduce) or (n-1)/n (all-gather, reduce-scatter).

Calibrated (`runtime.comm.nccl_bw_curve`, fitted from a cluster's own nccl-tests output by
`simfed.calibration.nccl_tests`): NCCL picks as above, then the chosen (algorithm, protocol)'s
bandwidth is multiplied by a size-dependent efficiency for its op and domain (one node or
several); the latency is kept. Without a curve nothing changes.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..hardware import Hardware
from ..spec.nccl_channels import gpu_arch
from ..spec.schema import SpecError

PROTOCOLS = ("LL", "LL128", "Simple")
_TUNING = Path(__file__).with_name("nccl_tuning.yaml")


@functools.lru_cache(maxsize=1)
def tuning_table() -> dict:
    return yaml.safe_load(_TUNING.read_text(encoding="utf-8"))


def version_constants(version: str) -> dict:
    """The tuning constants of the newest listed release at or below `version` ("2.21.5")."""
    table = tuning_table()["versions"]
    try:
        want = tuple(int(x) for x in version.split(".")[:2])
    except ValueError:
        raise SpecError(f"runtime.comm.nccl_version: expected a version like 2.23, "
                        f"got {version!r}") from None
    listed = sorted((tuple(int(x) for x in k.split(".")), k) for k in table)
    chosen = [k for v, k in listed if v <= want]
    if not chosen:
        raise SpecError(f"runtime.comm.nccl_version: {version} is older than the oldest "
                        f"modelled release {listed[0][1]}")
    return table[chosen[-1]]


@dataclass(frozen=True, slots=True)
class Choice:
    algorithm: str
    protocol: str
    time_s: float
    latency_s: float
    algbw_Bps: float

    def busbw_Bps(self, op: str, n: int) -> float:
        return self.algbw_Bps * bus_factor(op, n)


def _ring_steps(op: str, k: int) -> int:
    """A ring's steps over k participants: all-reduce 2(k - 1), the others k - 1; none for one.
    Over its ranks, tuning.cc's nsteps; over its nodes, its inter-node nInterSteps."""
    if k <= 1:
        return 0
    return 2 * (k - 1) if op == "all_reduce" else k - 1


def bus_factor(op: str, n: int) -> float:
    """nccl-tests: busbw = algbw x factor (PERFORMANCE.md)."""
    if n < 2:
        return 0.0
    return 2.0 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


@dataclass(frozen=True, kw_only=True)
class NcclModel:
    hw: Hardware
    version: str = "2.23"
    channels: int = 16
    nvls_allreduce_gain: float = 1.30
    algorithms: tuple[str, ...] = ("ring", "tree", "pat", "nvls")
    protocols: tuple[str, ...] = PROTOCOLS
    # {op: {"algorithm/protocol": {intra|inter: ((size bytes, factor), ...)}}}: the bandwidth
    # efficiency applied to NCCL's choice (runtime.comm.nccl_bw_curve); None: NCCL's bandwidth
    bw_curve: dict | None = None
    # false: every ring's latency as over two nodes (runtime.comm.latency_growth; to measure
    # what the growth of latency with the ranks costs)
    latency_growth: bool = True

    def ring_busbw_Bps(self, q: int, nodes: int) -> float:
        """The ring's bus bandwidth: its slowest link class (efficiencies included)."""
        hw = self.hw
        nvl = hw.nvlink_Bps * hw.nvlink_efficiency * hw.nvlink_usable_fraction(q)
        if nodes <= 1:
            return nvl
        # the node's ring bytes E leave over the rails its GPUs use; NVLink carries (q-1)/q E
        net = (hw.rails_used(q) * hw.rail_Bps * hw.nic_efficiency
               * hw.shared_bandwidth_share(nodes))  # other jobs' traffic on a shared fabric
        return min(net, nvl * q / (q - 1)) if q > 1 else net

    def candidates(self, op: str, nbytes: float, n: int, nodes: int) -> list[Choice]:
        if n < 2:
            return [Choice("none", "none", 0.0, 0.0, float("inf"))]
        c = version_constants(self.version)
        arch = tuning_table()["arch"][gpu_arch(self.hw.gpu_name)]
        q = max(1, n // max(1, nodes))
        base, hwlat = c["base_lat_us"], c["hw_lat_us"]
        intra_kind = "nvlink"
        ring_bw = self.ring_busbw_Bps(q, nodes)
        ar = op == "all_reduce"
        # the ranks and nodes the latency terms count (all of them, or two nodes' worth)
        lnodes = self._latency_nodes(nodes)
        ln = self._latency_ranks(n, nodes)
        nsteps = _ring_steps(op, ln)
        n_inter = _ring_steps(op, lnodes)
        ll_max = arch["ll_max_bw_GBps"] * 1e9
        if gpu_arch(self.hw.gpu_name) == "hopper" and "ll_max_bw_hopper_GBps" in c:
            ll_max = c["ll_max_bw_hopper_GBps"] * 1e9
        # ring LL's share of the link by release (tuning.cc; nccl_tuning.yaml ring_ll_factor)
        ll = c.get("ring_ll_factor", {"allreduce_or_multinode": 0.5, "other": 0.5})
        ll_factor = ll["allreduce_or_multinode" if ar or nodes > 1 else "other"]
        ll128_factor = 0.92 if q >= 2 else c.get("ring_ll128_ppn1_factor", 0.92)
        out: list[Choice] = []
        for pi, proto in enumerate(PROTOCOLS):
            if proto not in self.protocols:
                continue
            # ---- ring ----
            if "ring" in self.algorithms:
                intra = hwlat[intra_kind]["ring"][pi]
                inter = hwlat["net"]["ring"][pi] if q > 1 else hwlat["net"]["tree"][pi]
                lat = base["ring"][pi] + (nsteps - n_inter) * intra + n_inter * inter
                bus = ring_bw
                if proto == "LL":
                    bus = min(ll_max, bus * ll_factor)
                elif proto == "LL128":
                    bus = min(bus * ll128_factor,
                              self.channels * arch["ring_ll128_per_ch_GBps"] * 1e9)
                out.append(self._choice("ring", proto, lat, bus / bus_factor(op, n), nbytes))
            # ---- tree: all-reduce across nodes ----
            if "tree" in self.algorithms and ar and nodes > 1:
                intra = hwlat[intra_kind]["tree"][pi]
                inter = hwlat["net"]["tree"][pi]
                lat = base["tree"][pi] + 2 * ((q - 1) * intra + math.log2(lnodes) * inter)
                bus = min(ring_bw * 0.92, self.channels * arch["tree_per_ch_GBps"] * 1e9)
                if proto == "LL":
                    bus = min(bus / 3.8, ll_max)
                elif proto == "LL128":
                    bus = bus * 120.0 / 128.0
                out.append(self._choice("tree", proto, lat, bus * 0.5, nbytes))
            if proto != "Simple":
                continue
            # ---- PAT: all-gather / reduce-scatter with one GPU per node ----
            if ("pat" in self.algorithms and c.get("pat") and not ar and q == 1
                    and nodes > 1):
                inter = hwlat["net"]["tree"][pi]
                lat = base["pat"][pi] + math.log2(lnodes) * inter / 3.5 + 2.8 * ln
                bus = ring_bw * c["pat_bw_factor"]
                out.append(self._choice("pat", proto, lat, bus, nbytes))
            # ---- NVLS: NVSwitch multicast (Hopper and later) ----
            if ("nvls" in self.algorithms and arch["nvls_efficiency"] > 0
                    and self.hw.nvlink_topology == "switch" and q > 1
                    and (ar or nodes == 1) and self.channels >= 2):
                lat = base["nvls"][pi] + hwlat["nvlink"]["nvls"][pi] + (
                    hwlat["net"]["nvls"][pi] if nodes > 1 else 0.0)
                nvl = self.hw.nvlink_Bps * self.hw.nvlink_efficiency
                # across nodes (NVLS tree) the network still bounds it: at most the ring's
                bus = (nvl * self.nvls_allreduce_gain if nodes == 1 else ring_bw) if ar else nvl
                out.append(self._choice("nvls", proto, lat, bus / bus_factor(op, n), nbytes))
        if not out:
            raise SpecError("runtime.comm.nccl_algorithms: no algorithm is enabled for "
                            f"{op} over {n} ranks on {nodes} nodes")
        return out

    @staticmethod
    def _choice(algo: str, proto: str, lat_us: float, algbw: float, nbytes: float) -> Choice:
        lat = lat_us * 1e-6
        return Choice(algo, proto, lat + nbytes / algbw, lat, algbw)

    def nccl_choice(self, op: str, nbytes: float, n: int, nodes: int) -> Choice:
        """NCCL's pick by its own cost model: the fastest enabled (algorithm, protocol); ties
        in listing order."""
        return min(self.candidates(op, nbytes, n, nodes), key=lambda ch: ch.time_s)

    def loaded_steps(self, ch: Choice, op: str, n: int, nodes: int) -> float:
        """The steps of a chosen algorithm that pay the fabric's loaded-step latency
        (fabric.loaded_step_us, from where Hardware.loaded_step_s says): every step of a ring
        over its n ranks (n - 1, all-reduce 2(n - 1)), since in each step every rank sends to
        the next at once and the step ends with its slowest, inter-node hop; tree, PAT and
        NVLS across nodes their 2 log2 n over the n nodes."""
        lnodes = self._latency_nodes(nodes)
        if lnodes <= 1 or n < 2:
            return 0.0
        if ch.algorithm == "ring":
            return float(_ring_steps(op, self._latency_ranks(n, nodes)))
        return 2.0 * math.log2(lnodes)

    def _latency_ranks(self, n: int, nodes: int) -> int:
        """The ranks the ring latency terms count: all n, or the ranks of two nodes' worth where
        runtime.comm.latency_growth is off."""
        return n if self.latency_growth else max(1, n // max(1, nodes)) * self._latency_nodes(nodes)

    def _latency_nodes(self, nodes: int) -> int:
        """The nodes the latency terms count: all of them, or two nodes' worth where
        runtime.comm.latency_growth is off."""
        return nodes if self.latency_growth else min(nodes, 2)

    def best(self, op: str, nbytes: float, n: int, nodes: int) -> Choice:
        """NCCL's pick, its bandwidth scaled by the calibrated efficiency curve if any, plus
        the fabric's loaded-step latency, island term included, per step (a tree's levels: that
        or fabric.tree_level_us, the larger; NCCL's pick knows neither)."""
        ch = self.nccl_choice(op, nbytes, n, nodes)
        per_step = self.hw.loaded_step_s(nodes)
        if ch.algorithm != "ring":  # a tree's levels: measured alone, or under load if more
            per_step = max(per_step, self.hw.tree_level_s(nodes))
        extra = per_step * self.loaded_steps(ch, op, n, nodes)
        if extra:
            ch = Choice(ch.algorithm, ch.protocol, ch.time_s + extra, ch.latency_s + extra,
                        ch.algbw_Bps)
        if not self.bw_curve or n < 2:
            return ch
        f = curve_factor(self.bw_curve, op, f"{ch.algorithm}/{ch.protocol}",
                         "intra" if nodes <= 1 else "inter", nbytes)
        if f == 1.0:
            return ch
        algbw = ch.algbw_Bps * f
        return Choice(ch.algorithm, ch.protocol, ch.latency_s + nbytes / algbw, ch.latency_s,
                      algbw)

    def time_s(self, op: str, nbytes: float, n: int, nodes: int) -> float:
        return self.best(op, nbytes, n, nodes).time_s


def curve_value(knots, nbytes: float) -> float:
    """A curve's factor at `nbytes`: piecewise-linear in log2(size) between knots (sorted by
    size), held at the first knot's value below it and at the last one's above."""
    pts = sorted((float(s), float(f)) for s, f in knots)
    if not pts:
        return 1.0
    x = math.log2(max(nbytes, 1.0))
    xs = [math.log2(s) for s, _ in pts]
    if x <= xs[0]:
        return pts[0][1]
    for i in range(1, len(pts)):
        x0, x1, f0, f1 = xs[i - 1], xs[i], pts[i - 1][1], pts[i][1]
        if x <= x1:
            return f0 + (f1 - f0) * (x - x0) / (x1 - x0) if x1 > x0 else f1
    return pts[-1][1]


def curve_factor(curves: dict, op: str, choice: str, domain: str, nbytes: float) -> float:
    """runtime.comm.nccl_bw_curve's factor for op / "algorithm/protocol" / domain (1 if none)."""
    knots = ((curves.get(op) or {}).get(choice) or {}).get(domain)
    return curve_value(knots, nbytes) if knots else 1.0


def nccl_model(hw: Hardware, comm) -> NcclModel:
    """The model for a scenario's runtime.comm section."""
    return NcclModel(hw=hw, version=comm.nccl_version, channels=comm.nccl_channels,
                     nvls_allreduce_gain=comm.nvls_allreduce_gain,
                     algorithms=tuple(comm.nccl_algorithms),
                     bw_curve=getattr(comm, "nccl_bw_curve", None) or None,
                     latency_growth=getattr(comm, "latency_growth", True))


def engine_cost(model: NcclModel, op: str, nbytes: float,
                instances: tuple[tuple[int, ...], ...]) -> tuple[float, float]:
    """For the simulator: NCCL's choice for one collective over ring instances (the largest sets
    n and its node count) as (latency_s, byte_factor). The engine moves the ring's bytes through
    its flow network (so concurrent collectives share links) times byte_factor = the ring/Simple
    algorithm bandwidth over the chosen one's (1 for ring/Simple), and adds the choice's latency
    (NCCL's per-hop latencies by link class) in place of the alpha-beta latency."""
    n = len(max(instances, key=len))
    nodes = model.hw.nodes_spanned(instances)
    ch = model.best(op, nbytes, n, nodes)
    if n < 2:
        return 0.0, 1.0
    ring = model.ring_busbw_Bps(max(1, n // nodes), nodes) / bus_factor(op, n)
    return ch.latency_s, ring / ch.algbw_Bps
