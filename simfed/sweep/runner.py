"""Running a sweep: every point on an executor, with a progress bar, rows in point order."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..spec import SpecError
from .check import prepare
from .executors import EXECUTORS, Task, default_jobs
from .grid import SweepSpec
from .point import STATUSES, json_safe, run_point


@dataclass
class SweepResult:
    """Rows (point, then algorithm order) and the sweep's description; wall time not saved.

    A row holds the point (`point`, `params`: the varied keys' values), `status` (ok,
    does_not_fit, invalid, error), `error`, the scenario context and every field of the
    algorithm in `simfed run --json`."""

    meta: dict[str, Any]
    rows: list[dict[str, Any]]
    wall_s: float = 0.0

    def counts(self) -> dict[str, int]:
        return {s: sum(r["status"] == s for r in self.rows) for s in STATUSES}

    def to_csv(self) -> str:
        """One line per row, scalar fields as dotted columns; arrays stay in the JSON."""
        from .output import to_csv

        return to_csv(self.rows)

    def to_json(self) -> str:
        """The sweep's description and every row, arrays included."""
        from .output import to_json

        return to_json(self)

    def to_frame(self) -> Any:
        """A pandas DataFrame with the CSV's columns (needs pandas)."""
        from .output import scalar_columns

        try:
            import pandas as pd
        except ImportError:
            raise ImportError("to_frame() needs pandas: pip install 'simfed[frames]'") from None
        return pd.DataFrame([scalar_columns(r) for r in self.rows])

    def write(self, *, csv: str | Path | None = None, json: str | Path | None = None
              ) -> list[Path]:
        """Write the CSV and/or the JSON (atomically); returns the paths written."""
        from .output import write_outputs

        return write_outputs(self, csv_path=csv, json_path=json)


def run_sweep(spec: SweepSpec, *, executor: str = "local", jobs: int | None = None,
              address: str | None = None, progress: bool = True) -> SweepResult:
    """Simulate every point of the grid; never raises for an impossible point."""
    if executor not in EXECUTORS:
        raise SpecError(f"executor {executor!r}: valid executors are {', '.join(EXECUTORS)}")
    idents, points = prepare(spec)
    scenario = (spec.scenario if isinstance(spec.scenario, dict)
                else str(Path(spec.scenario).resolve()))
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
        "name": _name(spec),
        "scenario": (_display_path(spec.scenario) if isinstance(spec.scenario, str)
                     else "<dict>"),
        "set": dict(spec.sets),
        "axes": [{"keys": list(ax.keys), "values": [list(v) for v in ax.values]}
                 for ax in spec.axes],
        "algorithms": idents,
        "baseline": idents[0],
        "points": len(points),
        "rows": len(rows),
    }
    return SweepResult(meta=json_safe(meta), rows=rows, wall_s=wall_s)


def _name(spec: SweepSpec) -> str:
    if spec.name:
        return spec.name
    return Path(spec.scenario).stem if isinstance(spec.scenario, str) else "sweep"


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
    name = _name(spec)
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


