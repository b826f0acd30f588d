"""What-if sweeps: a grid of scenario overrides, every point simulated in a worker process, one
row per point and algorithm in deterministic CSV and JSON.

A sweep varies dotted scenario keys (the same keys as `simfed run --set`) over lists or ranges:

    simfed sweep scenarios/512gpu.yaml --set training.steps=16 \\
        --vary cluster.nodes=16:1024:x2 --vary algorithms.fl_fsdp.group_nodes=1,2,4,8

Values: `V1,V2,...` (each read as a YAML scalar), `START:STOP` or `START:STOP:STEP` (arithmetic,
STOP included) or `START:STOP:xF` (geometric: times F). Keys joined by `+` vary together with
the same values (`algorithms.fl_fsdp.group_nodes+algorithms.fl_hsdp.group_nodes=2,4,8`).

A sweep file is YAML with a single top-level `sweep:` mapping (scenario files stay valid
scenarios; `simfed sweep FILE` tells the two apart by that key):

    sweep:
      scenario: ../scenarios/512gpu.yaml   # relative to this file
      set: {training.steps: 16}            # fixed overrides, applied at every point
      vary:                                # one grid axis per key (in this order)
        cluster.nodes: [16, 32, 64, 128]
        algorithms.fl_fsdp.aggregate_every: "1:64:x2"
      linked:                              # axes of keys that vary together, equal lengths
        - algorithms.fl_fsdp.group_nodes: [1, 2, 4]
          algorithms.fl_hsdp.group_nodes: [2, 4, 8]
      algorithms: [fsdp, fl_fsdp]          # optional; the first is the speedup baseline

Command-line `--vary` axes come after the file's, `--set` overrides the file's, `--algorithm`
replaces the file's list. Points run as (scenario path, overrides) tasks on a local process
pool, a Dask cluster or Ray. A point that is impossible never stops the sweep: an algorithm
whose plan does not fit the cluster gives a row with status `invalid` and the one-line error;
one that runs out of GPU memory gives `does_not_fit` (numbers kept); any other failure `error`.
Rows are ordered by point, then algorithm, so the same sweep writes byte-identical files with
any executor and any number of workers. Workers must see the scenario files at the same path.
"""

from __future__ import annotations

import copy
import csv
import io
import itertools
import json
import math
import os
import re
import time
import types
import typing
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from .spec import SpecError
from .spec.overrides import parse_sets
from .spec.paths import write_text_atomic
from .spec.scenario import LABEL_RE
from .spec.yamlio import parse_yaml, read_yaml

SWEEP_KEY = "sweep"
STATUSES = ("ok", "does_not_fit", "invalid", "error")
MAX_POINTS = 100_000
_SWEEP_FILE_KEYS = ("scenario", "set", "vary", "linked", "algorithms", "name")

# ---------------------------------------------------------------------------------------------
# the grid


@dataclass(frozen=True, kw_only=True)
class Axis:
    """One grid dimension: keys that vary together, one value per key at each position."""

    keys: tuple[str, ...]
    values: tuple[tuple[Any, ...], ...]

    def __post_init__(self) -> None:
        if not self.values:
            raise SpecError(f"{'+'.join(self.keys)}: no values")
        for v in self.values:
            if len(v) != len(self.keys):
                raise SpecError(f"{'+'.join(self.keys)}: {len(self.keys)} keys but a value "
                                f"tuple of {len(v)}")


@dataclass(frozen=True, kw_only=True)
class SweepSpec:
    """A sweep: the scenario file, fixed overrides, the grid axes and the algorithms."""

    scenario: str
    name: str = ""
    sets: Mapping[str, Any] = field(default_factory=dict)
    axes: tuple[Axis, ...] = ()
    algorithms: tuple[str, ...] = ()

    @property
    def param_keys(self) -> list[str]:
        return [k for ax in self.axes for k in ax.keys]

    def points(self) -> list[dict[str, Any]]:
        """Every grid point as {dotted key: value}, the first axis varying slowest."""
        out = []
        for combo in itertools.product(*(ax.values for ax in self.axes)):
            point: dict[str, Any] = {}
            for ax, vals in zip(self.axes, combo, strict=True):
                point.update(zip(ax.keys, vals, strict=True))
            out.append(point)
        return out


def _number(text: str) -> int | float:
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise SpecError(f"range bound {text!r} is not a number") from None


def _tidy(x: float) -> int | float:
    """Round away float drift (0.1 * 3 = 0.30000000000000004 -> 0.3)."""
    return float(f"{x:.12g}")


def parse_values(raw: Any, where: str = "value") -> list[Any]:
    """A list of values from `V1,V2,...`, `A:B`, `A:B:STEP`, `A:B:xF` or a YAML list; every
    number finite (a NaN or an infinity could not be written to the sweep's JSON)."""
    values = _parse_values(raw, where)
    for v in values:
        if isinstance(v, float) and not math.isfinite(v):
            raise SpecError(f"{where}: {v} is not a finite number")
    return values


def _parse_values(raw: Any, where: str) -> list[Any]:
    if isinstance(raw, (list, tuple)):
        if not raw:
            raise SpecError(f"{where}: empty list of values")
        return list(raw)
    if not isinstance(raw, str):
        return [raw]
    text = raw.strip()
    if not text:
        raise SpecError(f"{where}: no values")
    if ":" in text and "," not in text and not text.startswith(("{", "[", "'", '"')):
        return _parse_range(text, where)
    items = [s.strip() for s in text.split(",")]
    if any(not s for s in items):
        raise SpecError(f"{where}: empty item in {raw!r}")
    values = []
    for s in items:
        values.append(parse_yaml(s, where))  # with simfed.spec.yamlio's limits
    return values


def _parse_range(text: str, where: str) -> list[Any]:
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise SpecError(f"{where}: range {text!r}: expected START:STOP, START:STOP:STEP or "
                        "START:STOP:xFACTOR")
    start, stop = _number(parts[0]), _number(parts[1])
    geometric = len(parts) == 3 and parts[2].strip().lower().startswith("x")
    step_text = parts[2].strip()[1:] if geometric else (parts[2] if len(parts) == 3 else "1")
    step = _number(step_text)
    ints = all(isinstance(v, int) for v in (start, stop, step))
    values: list[Any] = []
    if geometric:
        if step <= 1 or start <= 0 or stop < start:
            raise SpecError(f"{where}: range {text!r}: need 0 < START <= STOP and a factor > 1")
        v: float = start
        while v <= stop * (1 + 1e-12):
            values.append(int(v) if ints else _tidy(v))
            v = v * step
            if len(values) > MAX_POINTS:
                break
    else:
        if step <= 0 or stop < start:
            raise SpecError(f"{where}: range {text!r}: need START <= STOP and a STEP > 0")
        n = math.floor((stop - start) / step + 1e-9) + 1
        if n > MAX_POINTS:
            raise SpecError(f"{where}: range {text!r} has {n:,} values (at most {MAX_POINTS:,})")
        values = [start + i * step if ints else _tidy(start + i * step) for i in range(n)]
    if len(values) > MAX_POINTS:
        raise SpecError(f"{where}: range {text!r} has too many values (at most {MAX_POINTS:,})")
    return values


def parse_vary(item: str) -> Axis:
    """`--vary KEY=VALUES` or `--vary KEY1+KEY2=VALUES` (linked keys, same values)."""
    if "=" not in item:
        raise SpecError(f"--vary {item!r}: expected KEY=V1,V2,... or KEY=START:STOP[:STEP], "
                        "e.g. cluster.nodes=16,32,64")
    lhs, _, rhs = item.partition("=")
    keys = tuple(k.strip() for k in lhs.split("+"))
    if any(not k for k in keys):
        raise SpecError(f"--vary {item!r}: empty key")
    values = parse_values(rhs, f"--vary {lhs.strip()}")
    return Axis(keys=keys, values=tuple((v,) * len(keys) for v in values))


def is_sweep_file(path: str | Path) -> bool:
    try:
        data = read_yaml(path, "sweep")  # bounded: not /dev/zero forever
    except SpecError:
        return False
    return isinstance(data, dict) and SWEEP_KEY in data


def load_sweep_file(path: str | Path) -> SweepSpec:
    """Parse a sweep file (see the module docstring); the scenario path is made absolute."""
    p = Path(path)
    data = read_yaml(p, "sweep file")
    if not isinstance(data, dict) or SWEEP_KEY not in data:
        raise SpecError(f"{p}: a sweep file has a top-level `sweep:` mapping")
    extra = sorted(set(data) - {SWEEP_KEY})
    if extra:
        raise SpecError(f"{p}: {extra[0]}: unknown top-level key; a sweep file has only `sweep:`")
    sw = data[SWEEP_KEY]
    if not isinstance(sw, dict):
        raise SpecError(f"{p}: sweep: expected a mapping")
    unknown = sorted(set(map(str, sw)) - set(_SWEEP_FILE_KEYS))
    if unknown:
        raise SpecError(f"{p}: sweep.{unknown[0]}: unknown key; valid keys: "
                        f"{', '.join(_SWEEP_FILE_KEYS)}")
    if not isinstance(sw.get("scenario"), str):
        raise SpecError(f"{p}: sweep.scenario: the scenario file to vary (relative to {p.name})")
    scenario = (p.parent / sw["scenario"]).resolve()
    sets = sw.get("set") or {}
    if not isinstance(sets, dict):
        raise SpecError(f"{p}: sweep.set: expected a mapping of dotted keys to values")
    axes: list[Axis] = []
    vary = sw.get("vary") or {}
    if not isinstance(vary, dict):
        raise SpecError(f"{p}: sweep.vary: expected a mapping of dotted keys to value lists")
    for key, raw in vary.items():
        keys = tuple(k.strip() for k in str(key).split("+"))
        vals = parse_values(raw, f"sweep.vary.{key}")
        axes.append(Axis(keys=keys, values=tuple((v,) * len(keys) for v in vals)))
    linked = sw.get("linked") or []
    if not isinstance(linked, list):
        raise SpecError(f"{p}: sweep.linked: expected a list of mappings")
    for i, group in enumerate(linked):
        if not isinstance(group, dict) or not group:
            raise SpecError(f"{p}: sweep.linked[{i}]: expected a mapping of keys to value lists")
        cols = {str(k): parse_values(v, f"sweep.linked[{i}].{k}") for k, v in group.items()}
        lengths = {k: len(v) for k, v in cols.items()}
        if len(set(lengths.values())) != 1:
            raise SpecError(f"{p}: sweep.linked[{i}]: keys vary together, so they need equally "
                            f"many values; got {lengths}")
        axes.append(Axis(keys=tuple(cols), values=tuple(zip(*cols.values(), strict=True))))
    algs = sw.get("algorithms") or []
    if isinstance(algs, str):
        algs = [algs]
    name = str(sw.get("name") or p.stem)
    if not LABEL_RE.fullmatch(name) or ".." in name:  # it names the sweep's output files
        raise SpecError(f"{p}: sweep.name: {name!r} is not a name (letters, digits, space, "
                        "+ . _ ( ) -, no '..')")
    return SweepSpec(scenario=str(scenario), name=name, sets=sets,
                     axes=tuple(axes), algorithms=tuple(map(str, algs)))


# ---------------------------------------------------------------------------------------------
# checking a sweep before running it


def _unwrap(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else Any
    return tp


def check_key(key: str) -> None:
    """Raise SpecError when a dotted key names no scenario field (typos fail before the run)."""
    import dataclasses

    from .spec.scenario import Scenario

    tp: Any = Scenario
    parts = key.split(".")
    for i, part in enumerate(parts):
        tp = _unwrap(tp)
        where = ".".join(parts[:i]) or "the top level"
        if dataclasses.is_dataclass(tp):
            hints = typing.get_type_hints(tp)
            names = [f.name for f in dataclasses.fields(tp) if f.init]
            if part not in names:
                raise SpecError(f"{key}: unknown key {part!r} under {where}; valid keys there: "
                                f"{', '.join(sorted(names))}")
            tp = hints[part]
        elif typing.get_origin(tp) is tuple:
            args = typing.get_args(tp)
            tp = args[0] if args else Any  # a list item, by name, label or index
        elif tp is Any or typing.get_origin(tp) is dict or tp is dict:
            return
        else:
            raise SpecError(f"{key}: {where} is a value, not a mapping")


def select_algorithms(data: Mapping[str, Any], wanted: Sequence[str]) -> list[dict[str, Any]]:
    """The scenario's algorithm items named (by name or label) in `wanted`, in that order;
    all of them when `wanted` is empty."""
    items = data.get("algorithms")
    if not isinstance(items, list) or not items:
        raise SpecError("algorithms: at least one algorithm is required")
    if not wanted:
        return list(items)
    out = []
    for w in wanted:
        match = [it for it in items if isinstance(it, dict) and w in (it.get("name"),
                                                                         it.get("label"))]
        if not match:
            have = ", ".join(str(it.get("label") or it.get("name")) for it in items
                             if isinstance(it, dict))
            raise SpecError(f"algorithm {w!r} is not in this scenario; it has: {have}")
        out.append(match[0])
    return out


def _ident(item: Mapping[str, Any]) -> str:
    return str(item.get("label") or item.get("name"))


def prepare(spec: SweepSpec) -> tuple[list[str], list[dict[str, Any]]]:
    """Check keys and algorithms against the scenario; return the algorithm identifiers (label
    or name) and the list of points. Raises SpecError on a mistake in the sweep itself."""
    from .spec import load_scenario_data
    from .spec.scenario import set_dotted

    keys = spec.param_keys
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise SpecError(f"{dup[0]}: varied by more than one axis")
    for key in list(keys) + list(spec.sets):
        check_key(key)
    n = math.prod(len(ax.values) for ax in spec.axes) if spec.axes else 1
    if n > MAX_POINTS:
        raise SpecError(f"the grid has {n:,} points (at most {MAX_POINTS:,})")
    base = load_scenario_data(spec.scenario, spec.sets)
    chosen = select_algorithms(base, spec.algorithms)
    idents = [_ident(it) for it in chosen]
    if len(set(idents)) != len(idents):
        raise SpecError(f"algorithms: {idents} names one algorithm twice")
    for ax in spec.axes:  # list items exist (algorithms.NAME.key)
        for key, value in zip(ax.keys, ax.values[0], strict=True):
            set_dotted(copy.deepcopy(base), key, value)
    return idents, spec.points()


# ---------------------------------------------------------------------------------------------
# one point (runs in a worker)


def _clean(obj: Any) -> Any:
    """JSON-safe: non-finite floats become None, tuples lists, mapping proxies dicts."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def _failed(item: Mapping[str, Any] | str, status: str, error: str) -> dict[str, Any]:
    if isinstance(item, str):
        name, label = item, item
    else:
        name, label = str(item.get("name", "")), _ident(item)
    return {"status": status, "error": error, "name": name, "label": label}


def run_point(scenario: str, overrides: Mapping[str, Any],
              algorithms: Sequence[str]) -> list[dict[str, Any]]:
    """Simulate one grid point; one dict per algorithm (in `algorithms` order), never raising.

    Each dict holds `status`, `error` and, when simulated, the scenario context and every field
    of that algorithm in `simfed run --json`. Speedups are against algorithms[0] (None when that
    one could not run at this point)."""
    try:
        return _run_point(scenario, overrides, algorithms)
    except Exception as exc:  # a bug must not sink a thousand-point sweep
        msg = f"{type(exc).__name__}: {exc}".splitlines()[0]
        return [_failed(a, "error", msg) for a in algorithms]


# "<top level>: algorithms[0] (fl_fsdp): " means nothing for a scenario built for one algorithm
_ALONE = re.compile(r"^<top level>: algorithms\[0\] \([^)]*\): ")


def _run_point(scenario: str, overrides: Mapping[str, Any],
               algorithms: Sequence[str]) -> list[dict[str, Any]]:
    from .engine import simulate
    from .spec import load_scenario_data, scenario_from_dict

    try:
        data = load_scenario_data(scenario, overrides)
        items = select_algorithms(data, algorithms)
    except SpecError as exc:
        return [_failed(a, "invalid", str(exc)) for a in algorithms]
    errors: dict[int, str] = {}
    try:
        scn = scenario_from_dict({**data, "algorithms": items}, where=scenario)
        valid = list(range(len(items)))
    except SpecError:
        valid = []
        for i, it in enumerate(items):  # which algorithms are impossible here, and why
            try:
                scenario_from_dict({**data, "algorithms": [it]}, where=scenario)
                valid.append(i)
            except SpecError as exc:
                errors[i] = _ALONE.sub("", str(exc))
        if not valid:
            return [_failed(it, "invalid", errors[i]) for i, it in enumerate(items)]
        scn = scenario_from_dict({**data, "algorithms": [items[i] for i in valid]},
                                 where=scenario)
    out, _ = simulate(scn)
    results = dict(zip(valid, out["algorithms"], strict=True))
    context = {k: out[k] for k in ("scenario", "cluster", "model", "tokens_per_step")}
    context["baseline"] = results[0]["label"] if 0 in results else algorithms[0]
    rows = []
    for i, it in enumerate(items):
        if i not in results:
            rows.append(_failed(it, "invalid", errors[i]))
            continue
        r = dict(results[i])
        if 0 not in results:
            r["speedup"] = None
            r["epoch_speedup"] = None
        status = "ok" if r.get("fits", True) else "does_not_fit"
        error = "" if status == "ok" else (
            f"peak memory {r['peak_memory_bytes'] / 2**30:.1f} GiB > "
            f"{r['memory_capacity_bytes'] / 2**30:.1f} GiB per GPU")
        rows.append({"status": status, "error": error, **context, **r})
    return [_clean(r) for r in rows]


# ---------------------------------------------------------------------------------------------
# executors: each yields (task index, result) as tasks finish

Task = tuple[str, dict[str, Any], tuple[str, ...]]
Executor = Callable[[Callable[..., Any], list[Task], int, "str | None"], Iterator[tuple[int, Any]]]


def _local(fn: Callable[..., Any], tasks: list[Task], jobs: int,
           address: str | None) -> Iterator[tuple[int, Any]]:
    """A process pool on this machine. On Linux the workers are forked at once, before any
    progress-bar thread exists (fast, and no `if __name__ == "__main__"` guard needed in
    scripts); elsewhere they are spawned."""
    if address:
        raise SpecError("--address is for --executor dask or ray, not local")
    if jobs <= 1 or len(tasks) <= 1:
        return ((i, fn(*t)) for i, t in enumerate(tasks))
    import multiprocessing
    import sys
    from concurrent.futures import ProcessPoolExecutor

    method = "fork" if sys.platform.startswith("linux") else "spawn"
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context(method))
    try:
        futures = {pool.submit(fn, *t): i for i, t in enumerate(tasks)}
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    return _drain_pool(pool, futures)


def _drain_pool(pool: Any, futures: dict[Any, int]) -> Iterator[tuple[int, Any]]:
    from concurrent.futures import as_completed

    try:
        for fut in as_completed(futures):
            yield futures[fut], fut.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _dask(fn: Callable[..., Any], tasks: list[Task], jobs: int,
          address: str | None) -> Iterator[tuple[int, Any]]:
    """Dask distributed: the scheduler at `address`, or a local cluster of `jobs` processes."""
    try:
        import logging

        from distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise SpecError("--executor dask needs the 'distributed' extra: "
                        "pip install 'simfed[distributed]'") from None
    cluster = None
    if address:
        client = Client(address)
    else:
        cluster = LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True,
                               dashboard_address=None, silence_logs=logging.ERROR)
        client = Client(cluster)
    try:
        tag = uuid.uuid4().hex[:8]
        futures = [client.submit(fn, *t, key=f"simfed-point-{tag}-{i}", pure=False)
                   for i, t in enumerate(tasks)]
        index = {f.key: i for i, f in enumerate(futures)}
        for fut in as_completed(futures):
            yield index[fut.key], fut.result()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def _ray(fn: Callable[..., Any], tasks: list[Task], jobs: int,
         address: str | None) -> Iterator[tuple[int, Any]]:
    """Ray: the cluster at `address`, or a local one with `jobs` CPUs."""
    try:
        import ray
    except ImportError:
        raise SpecError("--executor ray needs Ray: pip install 'ray[default]'") from None
    started = not ray.is_initialized()
    if started:
        ray.init(address=address or None, num_cpus=None if address else jobs,
                 include_dashboard=False, log_to_driver=False)
    try:
        remote = ray.remote(num_cpus=1)(fn)
        refs = {remote.remote(*t): i for i, t in enumerate(tasks)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                yield refs[ref], ray.get(ref)
    finally:
        if started:
            ray.shutdown()


EXECUTORS: dict[str, Executor] = {"local": _local, "dask": _dask, "ray": _ray}


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


# ---------------------------------------------------------------------------------------------
# running a sweep


@dataclass
class SweepResult:
    """Rows (point, then algorithm order) and the sweep's description; wall time not saved."""

    meta: dict[str, Any]
    rows: list[dict[str, Any]]
    wall_s: float = 0.0

    def counts(self) -> dict[str, int]:
        return {s: sum(r["status"] == s for r in self.rows) for s in STATUSES}


def run_sweep(spec: SweepSpec, *, executor: str = "local", jobs: int | None = None,
              address: str | None = None, progress: bool = True) -> SweepResult:
    """Simulate every point of the grid; never raises for an impossible point."""
    if executor not in EXECUTORS:
        raise SpecError(f"executor {executor!r}: valid executors are {', '.join(EXECUTORS)}")
    idents, points = prepare(spec)
    scenario = str(Path(spec.scenario).resolve())
    tasks: list[Task] = [(scenario, {**spec.sets, **p}, tuple(idents)) for p in points]
    jobs = max(1, min(jobs or default_jobs(), len(tasks)))
    results: list[list[dict[str, Any]] | None] = [None] * len(tasks)
    t0 = time.perf_counter()
    stream = EXECUTORS[executor](run_point, tasks, jobs, address)
    if progress:
        _run_with_progress(stream, results, spec, len(idents))
    else:
        for i, res in stream:
            results[i] = res
    wall_s = time.perf_counter() - t0
    rows = []
    for i, (point, res) in enumerate(zip(points, results, strict=True)):
        assert res is not None
        for r in res:
            rows.append({"point": i, "params": point, **r})
    meta = {
        "name": spec.name or Path(spec.scenario).stem,
        "scenario": _display_path(spec.scenario),
        "set": dict(spec.sets),
        "axes": [{"keys": list(ax.keys), "values": [list(v) for v in ax.values]}
                 for ax in spec.axes],
        "algorithms": idents,
        "baseline": idents[0],
        "points": len(points),
        "rows": len(rows),
    }
    return SweepResult(meta=_clean(meta), rows=rows, wall_s=wall_s)


def _display_path(path: str) -> str:
    """Relative to the working directory when inside it (so files do not depend on clones)."""
    p = Path(path).resolve()
    try:
        return p.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return p.as_posix()


def _run_with_progress(stream: Iterator[tuple[int, Any]], results: list[Any], spec: SweepSpec,
                       n_algorithms: int) -> None:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = Console(stderr=True)
    name = spec.name or Path(spec.scenario).stem
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("points"), TimeElapsedColumn(), TextColumn("eta"),
               TimeRemainingColumn(), TextColumn("{task.fields[bad]}"))
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(f"sweep {name}", total=len(results), bad="")
        bad = 0
        for i, res in stream:
            results[i] = res
            bad += sum(r["status"] != "ok" for r in res)
            bar.update(task, advance=1,
                       bad=f"{bad} of {n_algorithms * len(results)} rows not ok" if bad else "")


# ---------------------------------------------------------------------------------------------
# output


def flatten(row: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts to dotted columns (phases_s.forward, params.cluster.nodes)."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (list, tuple, Mapping)):
        return json.dumps(v, separators=(",", ":"))
    return str(v)


def to_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    """One line per row; columns: the union of flattened keys in first-seen order."""
    flat = [flatten(r) for r in rows]
    columns: dict[str, None] = {}
    for f in flat:
        columns.update(dict.fromkeys(f))
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(list(columns))
    for f in flat:
        w.writerow([_cell(f.get(c)) for c in columns])
    return buf.getvalue()


def to_json(result: SweepResult) -> str:
    return json.dumps({"sweep": result.meta, "rows": result.rows}, indent=1,
                      allow_nan=False) + "\n"


def write_outputs(result: SweepResult, *, csv_path: str | Path | None = None,
                  json_path: str | Path | None = None) -> list[Path]:
    written = []
    if csv_path:
        written.append(write_text_atomic(csv_path, to_csv(result.rows)))
    if json_path:
        written.append(write_text_atomic(json_path, to_json(result)))
    return written


def _parse_cell(text: str) -> Any:
    if text == "":
        return None
    if text in ("true", "false"):
        return text == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    if text[:1] in "[{":
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            pass
    return text


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Sweep rows from the JSON or the CSV that `simfed sweep` wrote (CSV columns re-nested)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"file not found: {p}") from None
    if p.suffix.lower() == ".csv":
        rows = []
        for rec in csv.DictReader(io.StringIO(text)):
            row: dict[str, Any] = {"params": {}}
            for col, raw in rec.items():
                val = _parse_cell(raw or "")
                if col.startswith("params."):
                    row["params"][col[len("params."):]] = val
                    continue
                if val is None:
                    continue
                cur = row
                *head, last = col.split(".")
                for h in head:
                    cur = cur.setdefault(h, {})
                cur[last] = val
            rows.append(row)
        return rows
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        raise SpecError(f"{p}: not JSON (expected the output of simfed sweep)") from None
    if isinstance(data, dict) and isinstance(data.get("rows"), list):
        return data["rows"]
    if isinstance(data, list):
        return data
    raise SpecError(f"{p}: no `rows` list (expected the output of simfed sweep)")


# ---------------------------------------------------------------------------------------------
# the command


def _fmt_s(t: float) -> str:
    return f"{t:.2f} s" if t >= 1 else f"{t * 1e3:.0f} ms"


def print_summary(result: SweepResult, max_rows: int = 40) -> None:
    """A pivot table: one line per point, one column per algorithm (step time, speedup)."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:  # a pipe or a log file: do not squeeze the table into 80 columns
        console = Console(width=160)
    algs = result.meta["algorithms"]
    labels = {r["name"]: r["label"] for r in reversed(result.rows) if r.get("label")}
    labels.update({r["label"]: r["label"] for r in result.rows if r.get("label")})
    keys = [k for ax in result.meta["axes"] for k in ax["keys"]]
    base = labels.get(algs[0], algs[0])
    target = any("time_to_target_s" in r for r in result.rows)
    t = Table(title=f"sweep {result.meta['name']}: step time (speedup vs {base})"
              + (", time to the convergence target" if target else ""), header_style="bold")
    for k in keys:
        t.add_column(k.split(".")[-1] if len(k) > 16 else k, justify="right", no_wrap=True)
    for a in algs:
        t.add_column(labels.get(a, a), justify="right", no_wrap=True)
    by_point: dict[int, list[dict[str, Any]]] = {}
    for r in result.rows:
        by_point.setdefault(r["point"], []).append(r)
    for n, (_, rs) in enumerate(sorted(by_point.items())):
        if n >= max_rows:
            break
        cells = [str(rs[0]["params"][k]) for k in keys]
        for r in rs:
            if r["status"] in ("invalid", "error"):
                cells.append(f"[dim]{r['status']}[/dim]")
                continue
            sp = f" ({r['speedup']:.2f}x)" if r.get("speedup") is not None else ""
            oom = " [red]OOM[/red]" if r["status"] == "does_not_fit" else ""
            ttt = ""  # time to the scenario's convergence target, when it has one
            if "time_to_target_s" in r:
                v = r["time_to_target_s"]
                ttt = f", target {_fmt_s(v)}" if v is not None else ", target not reached"
            cells.append(f"{_fmt_s(r['step_time_s'])}{sp}{ttt}{oom}")
        t.add_row(*cells)
    console.print(t)
    if len(by_point) > max_rows:
        console.print(f"  ... {len(by_point) - max_rows} more points in the CSV/JSON")
    errors = sorted({r["error"] for r in result.rows if r["status"] in ("invalid", "error")})
    for e in errors[:5]:
        console.print(f"  [dim]not run:[/dim] {e}", highlight=False)
    if len(errors) > 5:
        console.print(f"  ... {len(errors) - 5} more distinct errors in the CSV/JSON")


@click.command("sweep")
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--vary", "varies", multiple=True, metavar="KEY=VALUES",
              help="A grid axis: KEY=V1,V2,... or KEY=START:STOP[:STEP] or KEY=START:STOP:xF; "
                   "KEY1+KEY2=... varies keys together. Repeat for more axes.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="A fixed override at every point, e.g. --set training.steps=16")
@click.option("--algorithm", "-a", "algorithms", multiple=True,
              help="Only these algorithms (names or labels); the first is the speedup baseline.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Write OUT/<name>.csv and OUT/<name>.json [default: results/sweeps].")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), help="Write the CSV here.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the JSON here.")
@click.option("--name", default=None, help="Name of the sweep (file names, titles).")
@click.option("--jobs", "-j", type=int, default=None,
              help="Worker processes [default: the CPUs of this machine].")
@click.option("--executor", type=click.Choice(list(EXECUTORS)), default="local",
              show_default=True, help="local process pool, Dask (extra 'distributed') or Ray.")
@click.option("--address", default=None,
              help="Scheduler of an existing Dask cluster (tcp://host:8786) or Ray cluster; "
                   "without it a local one is started.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no table.")
def sweep_command(scenario: str, varies: tuple[str, ...], sets: tuple[str, ...],
                  algorithms: tuple[str, ...], out_dir: str | None, csv_path: str | None,
                  json_path: str | None, name: str | None, jobs: int | None, executor: str,
                  address: str | None, quiet: bool) -> None:
    """Simulate SCENARIO (a scenario or a sweep file) over a grid of values, in parallel.

    Writes one row per point and algorithm (CSV and JSON, byte-identical for the same sweep);
    impossible points are rows with status `invalid` or `does_not_fit`, never a crash.

    \b
    A sweep file is YAML with one top-level `sweep:` mapping:
      sweep:
        scenario: ../scenarios/512gpu.yaml     # relative to the sweep file
        set: {training.steps: 16}
        vary: {cluster.nodes: "16:1024:x2", algorithms.fl_fsdp.group_nodes: [1, 4]}
        linked: [{algorithms.fl_fsdp.aggregate_every: [4, 8],
                  algorithms.fl_hsdp.aggregate_every: [8, 16]}]
        algorithms: [fsdp, fl_fsdp]
    """
    if jobs is not None and jobs < 1:
        raise SpecError(f"--jobs: must be >= 1, got {jobs}")
    if not Path(scenario).exists():
        raise SpecError(f"file not found: {scenario}")
    if is_sweep_file(scenario):
        spec = load_sweep_file(scenario)
    else:
        spec = SweepSpec(scenario=scenario, name=Path(scenario).stem)
    spec = SweepSpec(
        scenario=spec.scenario, name=name or spec.name,
        sets={**spec.sets, **parse_sets(sets)},
        axes=spec.axes + tuple(parse_vary(v) for v in varies),
        algorithms=tuple(algorithms) or spec.algorithms,
    )
    if not spec.axes:
        raise SpecError("nothing to vary: give --vary KEY=V1,V2,... (or a sweep file)")
    if not (csv_path or json_path):
        base = Path(out_dir or "results/sweeps") / spec.name
        csv_path, json_path = f"{base}.csv", f"{base}.json"
    elif out_dir:
        raise SpecError("give either --out DIR or --csv/--json files, not both")
    result = run_sweep(spec, executor=executor, jobs=jobs, address=address, progress=not quiet)
    written = write_outputs(result, csv_path=csv_path, json_path=json_path)
    if not quiet:
        print_summary(result)
    c = result.counts()
    click.echo(f"{result.meta['points']} points x {len(result.meta['algorithms'])} algorithms "
               f"= {len(result.rows)} rows: {c['ok']} ok, {c['does_not_fit']} do not fit, "
               f"{c['invalid']} invalid, {c['error']} errors ({result.wall_s:.1f} s)")
    for p in written:
        click.echo(f"wrote {p}")
