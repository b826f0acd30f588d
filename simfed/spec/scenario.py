"""The scenario: cluster, model, training run, runtime settings, algorithms and stragglers, as
frozen objects (the cluster's specs live in `spec.cluster`, the runtime's in `spec.runtime`, and
both are re-exported here). Reading one from YAML, with its `include:`s and `--set` overrides,
is `simfed.spec.loader.load_scenario`.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from .algorithms import ALGORITHMS, algorithm_info
from .cluster import (  # noqa: F401 - re-exported: the scenario's names live here too
    ClusterSpec,
    FabricSpec,
    GpuSpec,
    NicSpec,
    NodeSpec,
    NvlinkSpec,
    node_block_groups,
    node_cores,
    ranks_per_core,
)
from .limits import MAX_EMULATED_RANKS, MAX_WORLD
from .model import ModelSpec
from .nccl_channels import channel_sm_share, gpu_arch, ring_channels
from .overrides import set_dotted
from .plan import ParallelPlan
from .runtime import (  # noqa: F401 - re-exported
    DOMAINS,
    CollectiveOp,
    CommRuntime,
    ComputeRuntime,
    Domain,
    GemmTile,
    HostRuntime,
    MemoryRuntime,
    RuntimeSpec,
)
from .schema import SpecError, build, param, to_plain
from .stragglers import (  # noqa: F401 - re-exported
    DegradedNic,
    JitterSpec,
    SlowGpu,
    SlowNode,
    StragglerSpec,
)
from .training import DataSpec, TrainingSpec
from .validation_plan import (  # noqa: F401 - re-exported
    BENCH_PARTS,
    REBENCH_PARTS,
    RebenchPart,
    ValidationShape,
    ValidationSpec,
)

SCHEMA_VERSION = 1
# ---------------------------------------------------------------------------------------------
# algorithms


@dataclass(frozen=True, kw_only=True)
class AlgorithmSpec:
    name: str = param(choices=tuple(ALGORITHMS))
    label: str = param("", doc="display name (default: the algorithm's title)")
    group_nodes: int = param(0, ge=0, doc="fl_*: nodes per federation group")
    aggregate_every: int = param(0, ge=0, doc="fl_*: K, local steps between FedAvg rounds")
    shard_size: int = param(0, ge=0, doc="hsdp/fl_hsdp: shard group size (0 = a node)")
    forward_prefetch: bool = param(False)
    reshard_root_after_forward: bool = param(
        False, doc="reshard the root unit (embedding, head) after forward and all-gather it "
        "again in backward (FSDP1 and FSDP2's heuristic keep it: false)")
    reshard_last_layer_after_forward: bool = param(
        True, doc="reshard the last decoder layer after forward like the others; false: keep "
        "it unsharded until its backward, which then needs no all-gather (torchtitan's "
        "default wrap policy from 2024 to July 2025: `reshard_after_forward = int(layer_id) "
        "< len(model.layers) - 1`, torchtitan/parallelisms/parallelize_llama.py apply_fsdp "
        "at eef8bb2, until 83e6941 kept [norm, output] unsharded instead)")
    limit_all_gathers: bool = param(
        True, doc="FSDP1 rate limiter: the host waits before a third all-gather is in flight "
        "(FSDP1 default True; the paper's code sets False)")
    backward_prefetch: str = param("none", choices=("none", "pre", "post"))
    sharding: str = param(
        "full", choices=("full", "grad_op"),
        doc="fsdp/hsdp family: full (FULL_SHARD / HYBRID_SHARD: reshard after forward, gather "
        "again for backward) or grad_op (SHARD_GRAD_OP, ZeRO-2: parameters stay gathered from "
        "forward to backward; gradients and optimizer state stay sharded)")
    fedavg_dtype: str = param("bf16", choices=("bf16", "fp32"))
    round_budget_s: float = param(
        0.0, ge=0, doc="fl_*: time-budgeted rounds: each group runs as many local steps as fit "
        "in this wall time, then FedAvg weighted by steps taken (FedNova); 0 = K steps")
    round_deadline_s: float = param(
        0.0, ge=0, doc="fl_*: partial participation: a group not done with its K steps this "
        "long after the round began is left out of the average and re-synchronised from it")
    outer_optimizer: str = param(
        "average", choices=("average", "nesterov"),
        doc="fl_*: average = plain FedAvg; nesterov = DiLoCo's outer step, Nesterov momentum "
        "on the averaged delta (pseudo-gradient)")
    outer_lr: float = param(0.7, doc="fl_*: outer learning rate (DiLoCo: 0.7)")
    outer_momentum: float = param(0.9, ge=0, doc="fl_*: outer Nesterov momentum, below 1 "
                                  "(DiLoCo: 0.9)")

    def __post_init__(self) -> None:
        info = algorithm_info(self.name)
        where = f"algorithms.{self.name}"
        if self.outer_lr <= 0:
            raise SpecError(f"{where}.outer_lr: must be > 0, got {self.outer_lr}")
        if self.outer_momentum >= 1:
            raise SpecError(f"{where}.outer_momentum: must be below 1, got "
                            f"{self.outer_momentum}")
        variant = {"round_budget_s": self.round_budget_s,
                   "round_deadline_s": self.round_deadline_s,
                   "outer_optimizer": self.outer_optimizer != "average"}
        if not info.federated:
            for key, on in variant.items():
                if on:
                    raise SpecError(f"{where}.{key}: only federated algorithms (fl_*) have "
                                    f"FedAvg rounds; {self.name} has none")
        if self.round_budget_s and self.round_deadline_s:
            raise SpecError(f"{where}.round_deadline_s: a time-budgeted round "
                            f"(round_budget_s {self.round_budget_s} s) has no deadline; set one")
        if info.federated and self.aggregate_every < 1:
            raise SpecError(
                f"algorithms.{self.name}.aggregate_every: must be >= 1 for a federated "
                f"algorithm, got {self.aggregate_every}"
            )
        if info.federated and self.group_nodes < 1:
            raise SpecError(
                f"algorithms.{self.name}.group_nodes: must be >= 1 for a federated algorithm, "
                f"got {self.group_nodes}"
            )

    @property
    def display(self) -> str:
        return self.label or algorithm_info(self.name).title

    def plan(self, cluster: ClusterSpec) -> ParallelPlan:
        return ParallelPlan.for_algorithm(
            self.name,
            nodes=cluster.nodes,
            gpus_per_node=cluster.node.gpus,
            group_nodes=self.group_nodes or None,
            shard_size=self.shard_size or None,
        )


# ---------------------------------------------------------------------------------------------
# convergence (time to a target loss; simfed.convergence)


@dataclass(frozen=True, kw_only=True)
class ConvergenceSpec:
    model: str = param(
        "none", choices=("none", "scaling", "noise_progress"),
        doc="convergence model (simfed.convergence): none; scaling (model size, tokens per "
        "step, learning rate and schedule, groups and K are inputs: a profile fitted at some "
        "sizes predicts another); or noise_progress (one size, one lr: a profile for its own "
        "model and recipe)")
    target_loss: float = param(0.0, ge=0, doc="evaluation loss (nats/token) to reach; 0 = none")
    target_perplexity: float = param(0.0, ge=0, doc="... or evaluation perplexity; 0 = none")
    profile: dict[str, Any] = param(
        None, doc="the fitted profile (`simfed calibrate --convergence`; usually "
        "`include: convergence/NAME.yaml`): parameters, covariance, fitted range")
    transfer: bool = param(
        False, doc="apply a profile fitted on another model or data: losses rescaled between "
        "the scenario model's untrained loss ln(vocab) and loss_floor (flagged as extrapolation)")
    loss_floor: float = param(0.0, ge=0, doc="transfer: the data's irreducible loss (nats)")
    data_constants: dict[str, float] = param(
        None, doc="scaling: the constants of another corpus and tokenizer in place of the "
        "profile's (loss_floor, floor_coef, floor_size_exponent, noise_star_tokens, "
        "noise_loss_exponent, unigram_loss; optimal_lr: the noise-free optimal learning rate "
        "of the scenario's model), each with its source in a comment; listed in the "
        "output")
    samples: int = param(200, ge=10, le=10000, doc="parameter draws for the uncertainty band")

    def __post_init__(self) -> None:
        if self.target_loss and self.target_perplexity:
            raise SpecError(f"convergence: give target_loss ({self.target_loss:g}) or "
                            f"target_perplexity ({self.target_perplexity:g}), not both")
        if self.target_perplexity and self.target_perplexity <= 1:
            raise SpecError(f"convergence.target_perplexity: must be > 1, got "
                            f"{self.target_perplexity:g}")
        if self.model != "none" and not self.profile:
            raise SpecError(f"convergence.profile: required for model {self.model} (fit one "
                            "with `simfed calibrate --convergence STUDY.json`)")
        if self.data_constants:
            if self.model != "scaling":
                raise SpecError("convergence.data_constants: only the scaling model has data "
                                f"constants; model is {self.model}")
            known = ("loss_floor", "floor_coef", "floor_size_exponent", "noise_star_tokens",
                     "noise_loss_exponent", "unigram_loss", "optimal_lr")
            for k, v in self.data_constants.items():
                if k not in known:
                    raise SpecError(f"convergence.data_constants.{k}: unknown; expected one of "
                                    f"{', '.join(known)}")
                positive = k in ("floor_coef", "noise_star_tokens", "optimal_lr")
                if not (v > 0 if positive else v >= 0) or v > 1e12:
                    raise SpecError(f"convergence.data_constants.{k}: must be "
                                    f"{'> 0' if positive else '>= 0'} and at most 1e12, got {v}")


# ---------------------------------------------------------------------------------------------
# the scenario


@dataclass(frozen=True, kw_only=True)
class Scenario:
    version: int = param(SCHEMA_VERSION, ge=1, le=SCHEMA_VERSION)
    name: str = param("scenario")
    description: str = param("")
    seed: int = param(0, ge=0)
    cluster: ClusterSpec
    model: ModelSpec
    training: TrainingSpec
    data: DataSpec = DataSpec()
    runtime: RuntimeSpec = RuntimeSpec()
    algorithms: tuple[AlgorithmSpec, ...]
    stragglers: StragglerSpec = StragglerSpec()
    validation: ValidationSpec = ValidationSpec()
    convergence: ConvergenceSpec = ConvergenceSpec()

    def __post_init__(self) -> None:
        if not self.algorithms:
            raise SpecError("algorithms: at least one algorithm is required")
        names = [a.name for a in self.algorithms]
        for i, a in enumerate(self.algorithms):
            if names.count(a.name) > 1 and not a.label:
                raise SpecError(
                    f"algorithms[{i}].label: {a.name} appears more than once; give each a label"
                )
        _check_labels(self.algorithms)
        if self.cluster.world > MAX_WORLD:
            raise SpecError(
                f"cluster: {self.cluster.nodes:,} nodes x {self.cluster.node.gpus:,} GPUs = "
                f"{self.cluster.world:,} GPUs; the limit is {MAX_WORLD:,} (the largest size "
                "measured: 524,288 GPUs take about 3 s on a quiet 2-core host)")
        if self.cluster.host_cores > 0 and self.cluster.world > MAX_EMULATED_RANKS:
            raise SpecError(
                f"cluster.host_cores: an emulated cluster runs every rank on one host; "
                f"{self.cluster.world:,} ranks is over the limit of {MAX_EMULATED_RANKS:,}")
        if (self.stragglers.jitter.distribution == "uniform"
                and self.stragglers.jitter.sigma >= 1):
            raise SpecError(f"stragglers.jitter.sigma: a uniform half-width must be < 1 (a "
                            f"compute factor 1 +- sigma stays positive), got "
                            f"{self.stragglers.jitter.sigma}")
        self._resolve_channels()
        self._check_validation()
        self._check_float8()
        self._check_island()
        self._check_trainer_sync()
        for i, a in enumerate(self.algorithms):
            try:
                a.plan(self.cluster)
            except SpecError as exc:
                raise SpecError(f"algorithms[{i}] ({a.name}): {exc}") from None
        world = self.cluster.world
        for s in self.stragglers.slow_nodes + self.stragglers.degraded_nics:
            if s.node >= self.cluster.nodes:
                raise SpecError(
                    f"stragglers: node {s.node} does not exist (cluster has "
                    f"{self.cluster.nodes} nodes)"
                )
        for g in self.stragglers.slow_gpus:
            if g.rank >= world:
                raise SpecError(f"stragglers: rank {g.rank} does not exist ({world} GPUs)")

    def _resolve_channels(self) -> None:
        """runtime.comm.nccl_channels / sm_share `auto`: NCCL's ring channels across nodes from
        the cluster's NICs, and the SMs they hold (simfed/spec/nccl_channels.py)."""
        comm = self.runtime.comm
        if comm.nccl_channels != "auto" and comm.sm_share != "auto":
            return
        node = self.cluster.node
        channels = comm.nccl_channels
        if channels == "auto":
            channels = ring_channels(node.nics.count, node.nics.bw_Gbps, node.gpus,
                                     gpu_arch(node.gpu.name) == "hopper")
        share = comm.sm_share
        if share == "auto":
            if node.gpu.sms < 1:
                raise SpecError(f"runtime.comm.sm_share: auto is {channels} channels over the "
                                f"GPU's SMs, and cluster.node.gpu.sms is {node.gpu.sms}; give "
                                "the SM count (A100 108, H100 SXM 132) or a number")
            share = channel_sm_share(channels, node.gpu.sms)
            if share > 0.99:
                raise SpecError(f"runtime.comm.sm_share: auto gives {channels} channels over "
                                f"{node.gpu.sms} SMs = {share:g}; a collective's kernels cannot "
                                "hold the whole GPU: give a number below 0.99")
        runtime = replace(self.runtime, comm=replace(comm, nccl_channels=channels,
                                                     sm_share=share))
        object.__setattr__(self, "runtime", runtime)

    def _check_island(self) -> None:
        f = self.cluster.fabric
        if f.loaded_step_island_us > 0 and not f.nodes_per_island:
            raise SpecError(f"cluster.fabric.loaded_step_island_us: {f.loaded_step_island_us:g} us "
                            "needs cluster.fabric.nodes_per_island > 0 (the nodes of one island)")

    def _check_trainer_sync(self) -> None:
        t = self.training
        if (t.host_reductions or t.metric_sync_states) and not self.runtime.host.sync_per_step:
            key = "metric_sync_states" if t.metric_sync_states else "host_reductions"
            raise SpecError(f"training.{key}: {getattr(t, key)} per-step collectives read on "
                            "the host need runtime.host.sync_per_step: true (the trainer reads "
                            "the step's loss first)")

    def _check_float8(self) -> None:
        """training.float8 needs FP8 tensor cores and the per-kernel compute model."""
        f8 = self.training.float8
        if f8 == "none":
            return
        gpu = self.cluster.node.gpu
        if gpu.peak_tflops_fp8 <= 0:
            raise SpecError(f"training.float8: {f8} needs FP8 tensor cores; "
                            f"cluster.node.gpu.peak_tflops_fp8 is 0 for {gpu.name} (H100 SXM: "
                            "1979 dense)")
        if (f8 == "tensorwise" and self.training.float8_all_gather
                and self.training.fsdp_version != 2):
            raise SpecError("training.float8_all_gather: FSDP's float8 all-gather is FSDP2's "
                            "(torchao fsdp_utils.py); set training.fsdp_version: 2, or "
                            "float8_all_gather: false for FSDP1 (it gathers bf16)")
        if self.runtime.compute.model != "kernels":
            raise SpecError(f"training.float8: {f8} needs runtime.compute.model: kernels "
                            f"(it is {self.runtime.compute.model!r}: one efficiency constant "
                            "cannot tell float8 GEMMs from the rest)")

    def _check_validation(self) -> None:
        """Every validation shape's and bench set's overrides give a valid scenario, and a
        shape's algorithms are in it: at load time, not partway through `simfed validate`."""
        v = self.validation
        if not (v.shapes or v.fit or v.check or v.bench_sets):
            return
        base = _without_none(to_plain(self))
        base.pop("validation")

        def variant(sets: Mapping[str, Any], where: str) -> Scenario:
            data = copy.deepcopy(base)
            try:
                for dotted, value in sets.items():
                    set_dotted(data, str(dotted), value)
                return build(Scenario, data, "")
            except SpecError as exc:
                raise SpecError(f"{where}: {exc}") from None

        seen: dict[str, str] = {}
        named = [(f"validation.{key}[{i}]", shape) for key in ("shapes", "fit", "check")
                 for i, shape in enumerate(getattr(v, key))]
        for where, shape in named:
            if not LABEL_RE.fullmatch(shape.name) or ".." in shape.name:
                raise SpecError(f"{where}.name: {shape.name!r} is not a name (letters, digits, "
                                "space, + . _ ( ) -, at most 64, no '..'); it names the shape's "
                                "run folder")
            if shape.name in seen:
                raise SpecError(f"{where}.name: {shape.name!r} is also {seen[shape.name]}'s "
                                "name (each shape has its run folder)")
            seen[shape.name] = where
            scn = variant(shape.set, f"{where}.set") if shape.set else self
            for j, name in enumerate(shape.algorithms):
                try:
                    scn.algorithm(name)
                except SpecError as exc:
                    raise SpecError(f"{where}.algorithms[{j}]: {exc}") from None
            runs = shape.algorithms or tuple(a.label or a.name for a in scn.algorithms)
            for j, name in enumerate(shape.baselines):
                if name not in runs:
                    raise SpecError(f"{where}.baselines[{j}]: {name!r} is not one of the "
                                    f"shape's algorithms ({', '.join(runs)})")
        for i, sets in enumerate(v.bench_sets):
            where = f"validation.bench_sets[{i}]"
            sets = dict(sets)
            skip = sets.pop("skip", "")
            bad = [p for p in str(skip).split(",") if p.strip() and p.strip() not in BENCH_PARTS]
            if bad:
                raise SpecError(f"{where}.skip: {bad[0]!r} is not a part of `realrun bench` "
                                f"({', '.join(BENCH_PARTS)})")
            variant(sets, where)

    def algorithm(self, name: str) -> AlgorithmSpec:
        """The algorithm with this label, else with this name (a name that more than one
        algorithm has is ambiguous: use the labels)."""
        valid = ", ".join(a.label or a.name for a in self.algorithms)
        if not name or not name.strip():
            raise SpecError(f"algorithm: an empty name; this scenario has: {valid}")
        found = ([a for a in self.algorithms if a.label and a.label == name]
                 or [a for a in self.algorithms if a.name == name])
        if len(found) > 1:
            raise SpecError(f"algorithm {name!r} is ambiguous: {len(found)} algorithms have "
                            f"that name; use a label ({valid})")
        if found:
            return found[0]
        raise SpecError(f"algorithm {name!r} is not in this scenario; it has: {valid}")

    @property
    def global_tokens_per_step(self) -> int:
        return self.cluster.world * self.training.micro_batch * self.training.seq_len

    @property
    def dataset_sequences(self) -> int:
        t = self.training
        return t.dataset_sequences or t.steps * self.cluster.world * t.micro_batch


# a label names an algorithm in tables and is the stem of its trace files: a name, not a path
LABEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9 +._()-]{0,63}")


def _without_none(data: Any) -> Any:
    """Plain data without the None values of unset optional keys (so it builds again)."""
    if isinstance(data, dict):
        return {k: _without_none(v) for k, v in data.items() if v is not None}
    if isinstance(data, list):
        return [_without_none(v) for v in data]
    return data


def trace_stem(display: str) -> str:
    """The file name stem of an algorithm's traces (`simfed run --trace`)."""
    return display.lower().replace("+", "_").replace(" ", "_")


def _check_labels(algorithms: tuple[AlgorithmSpec, ...]) -> None:
    """Labels are names (letters, digits, space, + . _ ( ) -; no path separators, no `..`),
    another algorithm's name is not a label, and no two algorithms share a display name or a
    trace file."""
    seen: dict[str, int] = {}
    for i, a in enumerate(algorithms):
        where = f"algorithms[{i}].label"
        if a.label:
            if not LABEL_RE.fullmatch(a.label) or ".." in a.label:
                raise SpecError(f"{where}: {a.label!r} is not a name (letters, digits, space, "
                                "+ . _ ( ) -, at most 64, no '..'); labels name trace files")
            if a.label in ALGORITHMS and a.label != a.name:
                raise SpecError(f"{where}: {a.label!r} is the name of another algorithm; "
                                f"`--algorithm {a.label}` would be ambiguous")
        for key in {a.display.lower(), trace_stem(a.display)}:
            if key in seen:
                raise SpecError(f"{where}: {a.display!r} names algorithms[{seen[key]}] too "
                                "(labels and trace files must be unique); give each a label")
            seen[key] = i


# ---------------------------------------------------------------------------------------------
# loading
