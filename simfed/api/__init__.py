"""simfed's Python face: load a scenario, simulate it, sweep it, tabulate a collective.

    import simfed

    scn = simfed.load("scenarios/512gpu.yaml", set={"runtime.host.debug_checks": "off"})
    res = simfed.simulate(scn)                       # what `simfed run --json` writes, typed
    res.algorithm("FL+FSDP").speedup                 # fields named as in the JSON
    rows = simfed.sweep(scn, vary={"cluster.nodes": "16:128:x2"}, set={"training.steps": 8})
    rows.to_frame()                                  # pandas, when installed

The command line (`simfed run`, `sweep`, `collective`) is a thin layer over these functions.
Bad input raises `SpecError`, whose one-line message begins with the key path, file or option
and names the value (`training.seq_len: must be >= 1, got -1`): the same errors as the command
line, which prints them and exits with status 2.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..spec import Scenario, SpecError
from ..spec.loader import load_profile, load_scenario, resolve_includes, scenario_from_dict
from ..spec.overrides import set_dotted
from ..sweep.grid import Axis, SweepSpec, parse_values
from ..sweep.runner import SweepResult, run_sweep
from ..sweep.sweepfile import is_sweep_file, load_sweep_file
from .results import (
    AlgorithmResult,
    ClusterInfo,
    CollectiveRow,
    CollectiveTable,
    ModelInfo,
    Phases,
    Plan,
    SimulationResult,
)

__all__ = ["AlgorithmResult", "ClusterInfo", "CollectiveRow", "CollectiveTable", "ModelInfo",
           "Phases", "Plan", "Scenario", "SimulationResult", "SpecError", "SweepResult",
           "collective", "load", "simulate", "sweep"]


@dataclass(frozen=True)
class Source:
    """Where a loaded scenario came from, so it can be loaded again with more overrides (the
    robustness cases, the points of a sweep): a file path, or plain data with its includes
    resolved; the overrides and the profile it was loaded with."""

    path: str | None
    data: dict[str, Any] | None
    overrides: dict[str, Any]
    profile: str | None

    def load(self, more: Mapping[str, Any] | None = None) -> Scenario:
        overrides = {**self.overrides, **(more or {})}
        if self.path is not None:
            return load_scenario(self.path, overrides, profile=self.profile)
        return _from_data(self.data or {}, overrides, "<dict>")


def source_of(scenario: Scenario) -> Source | None:
    """The `Source` of a scenario that `load` returned (None for one built otherwise)."""
    return getattr(scenario, "_simfed_source", None)


def load(source: str | os.PathLike[str] | Mapping[str, Any],
         set: Mapping[str, Any] | None = None, *,  # `set`: as the command line's --set
         profile: str | os.PathLike[str] | None = None,
         base_dir: str | os.PathLike[str] | None = None) -> Scenario:
    """A validated scenario from a YAML file or from plain data (a dict as the YAML would give).

    `set`: overrides by dotted key, as `--set` (`{"cluster.nodes": 64,
    "algorithms.fl_fsdp.aggregate_every": 4}`); `profile`: a calibrated profile (`simfed
    calibrate`) merged over the scenario, as `--profile`. A file's `include:`s resolve relative
    to the file that holds them; a dict's relative to `base_dir` (default: the working
    directory). Raises SpecError."""
    overrides = dict(set or {})
    prof = os.fspath(profile) if profile is not None else None
    if isinstance(source, Mapping):
        base = Path(base_dir or ".").resolve()
        data = resolve_includes(copy.deepcopy(dict(source)), base)
        if prof is not None:
            from ..spec.loader import _deep_merge

            data = _deep_merge(data, load_profile(prof))
        scn = _from_data(data, overrides, "<dict>")
        src = Source(path=None, data=data, overrides=overrides, profile=None)
    elif isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        scn = load_scenario(path, overrides, profile=prof)
        src = Source(path=path, data=None, overrides=overrides, profile=prof)
    else:
        raise SpecError(f"load: expected a file path or a mapping, got {type(source).__name__}")
    object.__setattr__(scn, "_simfed_source", src)  # frozen: not a field, not compared
    return scn


def _from_data(data: Mapping[str, Any], overrides: Mapping[str, Any], where: str) -> Scenario:
    d = copy.deepcopy(dict(data))
    for key, value in overrides.items():
        set_dotted(d, key, value)
    return scenario_from_dict(d, where=where)


def _scenario(scenario: Scenario | str | os.PathLike[str] | Mapping[str, Any]) -> Scenario:
    return scenario if isinstance(scenario, Scenario) else load(scenario)


def simulate(scenario: Scenario | str | os.PathLike[str] | Mapping[str, Any],
             algorithms: Sequence[str] | None = None, *, robustness: bool = False,
             trace: bool = False, trace_steps: int | None = None) -> SimulationResult:
    """Simulate every algorithm of the scenario (or those named, by name or label; the first is
    the speedup baseline). With a convergence profile and target in the scenario the result
    holds the time to target (`time_to_target_s`, `first_to_target`, ...).

    `robustness`: also simulate the scenario under each of the model's known errors (the
    published validation's error sizes) and say whether the winner holds (the result's
    `robustness`, as `simfed run --robustness`); needs a scenario from `load`. `trace`: keep
    the spans of the first `trace_steps` steps (`write_traces`)."""
    from ..engine import simulate as engine_simulate

    scn = _scenario(scenario)
    names = list(algorithms or [])
    for a in names:
        if not str(a).strip():
            raise SpecError("--algorithm: an empty name; give an algorithm's name or label")
    if trace_steps is not None and trace_steps < 1:
        raise SpecError(f"--trace-steps: must be >= 1, got {trace_steps}")
    out, spans = engine_simulate(scn, algorithms=names or None, trace=trace,
                                 trace_steps=trace_steps)
    if robustness:
        from ..analysis.robustness import robustness as robust

        src = source_of(scn)
        if src is None:
            raise SpecError("robustness: give a scenario that simfed.load returned (the "
                            "cases load it again with their overrides)")
        res = robust(src.path or "<dict>", src.overrides, out, profile=src.profile,
                     algorithms=names or None, loaded=scn, reload=src.load)
        out = {**out, "robustness": res}
    return SimulationResult.from_dict(out, spans=spans if trace else None)


VaryItem = Axis | tuple[str, Any]


def sweep(scenario: Scenario | str | os.PathLike[str] | Mapping[str, Any],
          vary: Mapping[str, Any] | Iterable[VaryItem] | None = None,
          set: Mapping[str, Any] | None = None, *,  # `set`: as the command line's --set
          linked: Iterable[Mapping[str, Any]] = (), algorithms: Sequence[str] = (),
          name: str | None = None, executor: str = "local", jobs: int | None = None,
          address: str | None = None, progress: bool = False) -> SweepResult:
    """Simulate the scenario at every point of a grid: one row per point and algorithm, in a
    deterministic order whatever the executor (`rows`; `to_frame()`, `to_csv()`, `to_json()`,
    `write(csv=..., json=...)`).

    `scenario`: a scenario (from `load`, a file, a dict) or a sweep file (its `sweep:` mapping
    gives the scenario, fixed overrides, axes and algorithms; the arguments here add to it).
    `vary`: one grid axis per key, the first varying slowest: `{"cluster.nodes": [16, 32],
    "algorithms.fl_fsdp.aggregate_every": "1:64:x2"}` (a list, or `V1,V2`, `A:B[:STEP]`,
    `A:B:xF`); `"KEY1+KEY2"` varies two keys with the same values. `linked`: mappings of keys
    to equally long lists that vary together. `set`: fixed overrides at every point.
    `executor`: "local" (processes on this machine, `jobs` of them), "dask" or "ray" (a
    cluster at `address`, or a local one). An impossible point is a row with status `invalid`
    or `does_not_fit`, never an exception."""
    axes = [*_axes(vary), *_linked_axes(linked)]
    sets = dict(set or {})
    if isinstance(scenario, (str, os.PathLike)) and is_sweep_file(scenario):
        base = load_sweep_file(scenario)
        spec = SweepSpec(scenario=base.scenario, name=name or base.name,
                         sets={**base.sets, **sets}, axes=base.axes + tuple(axes),
                         algorithms=tuple(algorithms) or base.algorithms)
    else:
        scn = _scenario(scenario)
        src = source_of(scn)
        if src is None:
            raise SpecError("sweep: give a scenario file, a dict or a scenario that "
                            "simfed.load returned")
        if src.profile is not None:
            raise SpecError("sweep: a scenario loaded with a profile cannot be swept; merge "
                            "the profile's keys with set= instead")
        stem = Path(src.path).stem if src.path else "sweep"
        spec = SweepSpec(scenario=src.path if src.path is not None else (src.data or {}),
                         name=name or stem, sets={**src.overrides, **sets}, axes=tuple(axes),
                         algorithms=tuple(algorithms))
    if not spec.axes:
        raise SpecError("nothing to vary: give --vary KEY=V1,V2,... (or a sweep file)")
    if jobs is not None and jobs < 1:
        raise SpecError(f"--jobs: must be >= 1, got {jobs}")
    return run_sweep(spec, executor=executor, jobs=jobs, address=address, progress=progress)


def _axes(vary: Mapping[str, Any] | Iterable[VaryItem] | None) -> list[Axis]:
    if vary is None:
        return []
    items = vary.items() if isinstance(vary, Mapping) else vary
    out = []
    for item in items:
        if isinstance(item, Axis):
            out.append(item)
            continue
        key, raw = item
        keys = tuple(k.strip() for k in str(key).split("+"))
        if any(not k for k in keys):
            raise SpecError(f"vary {key!r}: empty key")
        values = parse_values(raw, f"vary {key}")
        out.append(Axis(keys=keys, values=tuple((v,) * len(keys) for v in values)))
    return out


def _linked_axes(linked: Iterable[Mapping[str, Any]]) -> list[Axis]:
    out = []
    for i, group in enumerate(linked):
        cols = {str(k): parse_values(v, f"linked[{i}].{k}") for k, v in group.items()}
        lengths = {k: len(v) for k, v in cols.items()}
        if len(set(lengths.values())) != 1:
            raise SpecError(f"linked[{i}]: keys vary together, so they need equally many "
                            f"values; got {lengths}")
        out.append(Axis(keys=tuple(cols), values=tuple(zip(*cols.values(), strict=True))))
    return out


_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}
MAX_COLLECTIVE_BYTES = 2**50


def nbytes(value: int | str, option: str = "--min-bytes/--max-bytes") -> int:
    """A message size: bytes, or a number with K, M or G (powers of 2)."""
    if isinstance(value, bool):
        raise SpecError(f"{option}: expected a size like 1M, got {value!r}")
    if isinstance(value, int):
        n = value
    else:
        text = str(value)
        mult = _UNITS.get(text[-1:].upper(), 1)
        try:
            n = int(float(text.rstrip("KMGkmg")) * mult)
        except (ValueError, OverflowError):  # OverflowError: 1e400 is an infinity
            raise SpecError(f"{option}: expected a size like 1M, got {text!r}") from None
    if not 1 <= n <= MAX_COLLECTIVE_BYTES:
        raise SpecError(f"{option}: {value!r} is {n:,} bytes; expected 1 B to 1 PiB")
    return n


def byte_range(min_bytes: int | str, max_bytes: int | str) -> tuple[int, int]:
    """The smallest and largest message size, checked (`nbytes`; the smallest not above the
    largest)."""
    lo, hi = nbytes(min_bytes), nbytes(max_bytes)
    if lo > hi:
        raise SpecError(f"--min-bytes {min_bytes} ({lo:,} B) is above --max-bytes {max_bytes} "
                        f"({hi:,} B)")
    return lo, hi


def collective(scenario: Scenario | str | os.PathLike[str] | Mapping[str, Any],
               op: str = "all_reduce", *, nodes: int | None = None,
               gpus_per_node: int | None = None, min_bytes: int | str = "1M",
               max_bytes: int | str = "8G") -> CollectiveTable:
    """An nccl-tests-style table (size, time, algbw, busbw, NCCL's algorithm and protocol) from
    NCCL's own tuning model for the scenario's cluster: `op` over `nodes` x `gpus_per_node`
    GPUs (default: the whole cluster), sizes doubling from `min_bytes` to `max_bytes`."""
    from ..collectives.table import collective_table, sizes
    from ..spec.ops import OPS

    if op not in OPS:
        raise SpecError(f"collective: op {op!r}: expected one of {', '.join(OPS)}")
    lo, hi = byte_range(min_bytes, max_bytes)
    scn = _scenario(scenario)
    n_nodes = nodes or scn.cluster.nodes
    q = gpus_per_node or scn.cluster.node.gpus
    if n_nodes > scn.cluster.nodes or q > scn.cluster.node.gpus or n_nodes < 1 or q < 1:
        raise SpecError(f"collective: {n_nodes} nodes x {q} GPUs does not fit the cluster's "
                        f"{scn.cluster.nodes} x {scn.cluster.node.gpus}")
    rows = collective_table(scn, op, n_nodes * q, n_nodes, sizes(lo, hi))
    return CollectiveTable(op=op, nodes=n_nodes, gpus_per_node=q,
                           nccl_version=str(scn.runtime.comm.nccl_version),
                           cluster=scn.cluster.name,
                           rows=tuple(CollectiveRow.from_dict(r) for r in rows))
