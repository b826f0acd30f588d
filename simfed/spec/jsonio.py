"""Reading JSON input with the limits of the input contract: a regular file of bounded size,
UTF-8, strict JSON (no NaN or Infinity unless asked), bounded nesting. A fault is a `SpecError`
of one line naming the file and the reason; nothing here raises anything else, hangs or
recurses without bound.

`read_json` is for files simfed or realrun wrote or measured (results, summaries, traces,
studies); configuration is YAML (`yamlio`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .messages import cut
from .schema import SpecError
from .yamlio import MAX_DATA_BYTES, read_text

MAX_JSON_BYTES = 256 * 2**20  # results, summaries and studies: far above any simfed writes
MAX_JSON_DEPTH = 64  # simfed's own JSON nests under 10 deep; a Chrome trace 4


def _depth_over(data: Any, limit: int) -> bool:
    """Whether `data` nests deeper than `limit` (an iterative walk: no recursion)."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        obj, d = stack.pop()
        if d > limit:
            return True
        if isinstance(obj, dict):
            stack.extend((v, d + 1) for v in obj.values() if isinstance(v, (dict, list)))
        elif isinstance(obj, list):
            stack.extend((v, d + 1) for v in obj if isinstance(v, (dict, list)))
    return False


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (strict JSON has no NaN or Infinity)")


def parse_json(text: str, source: str, *, max_depth: int = MAX_JSON_DEPTH,
               allow_nan: bool = False) -> Any:
    """Parse JSON text from `source` (named in errors) with the limits of `read_json`."""
    try:
        data = json.loads(text, parse_constant=None if allow_nan else _no_constant)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{source}: not JSON (line {exc.lineno}, column {exc.colno}: "
                        f"{exc.msg})") from None
    except RecursionError:
        raise SpecError(f"{source}: JSON nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # NaN/Infinity, or an integer of more than 4,300 digits
        raise SpecError(f"{source}: not strict JSON: {cut(str(exc).split(';')[0])}") from None
    if _depth_over(data, max_depth):
        raise SpecError(f"{source}: JSON nested deeper than {max_depth} levels")
    return data


def read_json(path: str | Path, what: str, *, max_bytes: int = MAX_JSON_BYTES,
              max_depth: int = MAX_JSON_DEPTH, allow_nan: bool = False) -> Any:
    """The JSON value in `path`, which must be a regular UTF-8 file of at most `max_bytes`
    (at most `yamlio.MAX_DATA_BYTES`), nested at most `max_depth` deep, strict JSON unless
    `allow_nan`; `what` says what the file is for ("figures", "calibrate"). A SpecError of one
    line naming the file and the reason otherwise."""
    path = Path(path)
    text = read_text(path, what, min(max_bytes, MAX_DATA_BYTES))
    return parse_json(text, str(path), max_depth=max_depth, allow_nan=allow_nan)
