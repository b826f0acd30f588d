"""Sweep output: rows as deterministic CSV and JSON, and read back."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from ..spec import SpecError
from ..spec.paths import write_text_atomic


class SweepRows(Protocol):
    """What is written of a sweep (`runner.SweepResult`): its description and its rows."""

    meta: dict[str, Any]
    rows: list[dict[str, Any]]


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


def scalar_columns(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row's scalar fields as dotted columns: arrays (step times, [p10, p90] intervals, loss
    curves) are left out; they stay in the JSON. The point's `params` are kept whatever their
    values (they name the point)."""
    return {k: v for k, v in flatten(row).items()
            if k.startswith("params.") or not isinstance(v, (list, tuple))}


def to_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    """One line per row; columns: the union of the rows' scalar columns in first-seen order
    (`scalar_columns`)."""
    flat = [scalar_columns(r) for r in rows]
    columns: dict[str, None] = {}
    for f in flat:
        columns.update(dict.fromkeys(f))
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(list(columns))
    for f in flat:
        w.writerow([_cell(f.get(c)) for c in columns])
    return buf.getvalue()


def to_json(result: SweepRows) -> str:
    return json.dumps({"sweep": result.meta, "rows": result.rows}, indent=1,
                      allow_nan=False) + "\n"


def write_outputs(result: SweepRows, *, csv_path: str | Path | None = None,
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


