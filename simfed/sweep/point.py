"""One grid point, simulated in a worker: one row per algorithm, never raising."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..spec import SpecError
from .check import algorithm_ident, scenario_data, select_algorithms

STATUSES = ("ok", "does_not_fit", "invalid", "error")


def json_safe(obj: Any) -> Any:
    """JSON-safe: non-finite floats become None, tuples lists, mapping proxies dicts."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def _failed(item: Mapping[str, Any] | str, status: str, error: str) -> dict[str, Any]:
    if isinstance(item, str):
        name, label = item, item
    else:
        name, label = str(item.get("name", "")), algorithm_ident(item)
    return {"status": status, "error": error, "name": name, "label": label}


def run_point(scenario: str | Mapping[str, Any], overrides: Mapping[str, Any],
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


def _run_point(scenario: str | Mapping[str, Any], overrides: Mapping[str, Any],
               algorithms: Sequence[str]) -> list[dict[str, Any]]:
    from ..engine import simulate
    from ..spec import scenario_from_dict

    where = scenario if isinstance(scenario, str) else "<dict>"
    try:
        data = scenario_data(scenario, overrides)
        items = select_algorithms(data, algorithms)
    except SpecError as exc:
        return [_failed(a, "invalid", str(exc)) for a in algorithms]
    errors: dict[int, str] = {}
    try:
        scn = scenario_from_dict({**data, "algorithms": items}, where=where)
        valid = list(range(len(items)))
    except SpecError:
        valid = []
        for i, it in enumerate(items):  # which algorithms are impossible here, and why
            try:
                scenario_from_dict({**data, "algorithms": [it]}, where=where)
                valid.append(i)
            except SpecError as exc:
                errors[i] = _ALONE.sub("", str(exc))
        if not valid:
            return [_failed(it, "invalid", errors[i]) for i, it in enumerate(items)]
        scn = scenario_from_dict({**data, "algorithms": [items[i] for i in valid]},
                                 where=where)
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
    return [json_safe(r) for r in rows]


