"""The files of a published-measurements folder (validation/published/, or a user's own) checked
before anything is simulated: `cases.yaml` (FSDP runs' tokens/s/GPU), `speedups.yaml` (ratios of
a setting over a baseline) and `collectives.yaml` (nccl-tests tables and points).

Each entry is validated with pydantic; a bad one is a SpecError of one line naming the file, the
entry and the field with what was found (`cases.yaml: cases[3].set: expected fit or check, got
'train'`), never a traceback. Entry names must be unique within a file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..spec.schema import SpecError
from ..spec.yamlio import read_yaml

Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=1)]
Source = dict[str, Any] | str


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)
    name: Annotated[str, Field(min_length=1)]
    scenario: Annotated[str, Field(min_length=1)]
    source: Source


class PublishedRun(_Entry):
    """cases.yaml: one published FSDP run. A scale study is several runs with the same `study`
    (the same model at several GPU counts); `overrides` are the dotted scenario keys of this run
    (cluster.nodes, training.micro_batch, algorithms.0) over its study's scenario; `framework`
    names the code that ran (pytorch-fsdp1, pytorch-fsdp2, jax-xla, deepspeed-zero3; empty: the
    scenario's training.fsdp_version as PyTorch FSDP)."""
    set: Literal["fit", "check"]
    published_tokens_per_s_per_gpu: Positive
    # the run's peak GPU memory as its source gives it (torchtitan's tables: the caching
    # allocator's reserved peak, which its training loop logs)
    published_peak_memory_GiB: Positive | None = None
    gpu: str | None = None
    gpus: Count | None = None
    study: Annotated[str, Field(min_length=1)] | None = None
    framework: Annotated[str, Field(min_length=1)] | None = None
    overrides: dict[str, Any] | None = None


class _Pair(BaseModel):
    model_config = ConfigDict(extra="forbid")
    baseline: Positive
    variant: Positive


class PublishedSpeedup(_Entry):
    """speedups.yaml: a setting's published speedup over a baseline on the same cluster."""
    baseline: dict[str, Any]
    variant: dict[str, Any]
    published: _Pair


class _Collective(_Entry):
    set: Literal["fit", "check"]
    op: Literal["all_reduce", "all_gather", "reduce_scatter"]
    nodes: Count
    gpus_per_node: Count
    set_keys: dict[str, Any] | None = None
    hardware: str | None = None
    nccl_version: str | None = None
    env: str | None = None
    column: str | None = None


class CollectiveTable(_Collective):
    """collectives.yaml tables: (size in bytes, bus bandwidth in GB/s) rows."""
    rows: Annotated[list[tuple[Count, Positive]], Field(min_length=1)]


class CollectivePoint(_Collective):
    """collectives.yaml cases: one quoted (size, bus bandwidth) point."""
    nbytes: Count
    published_busbw_GBps: Positive


def read(path: Path) -> dict[str, Any]:
    """The YAML mapping in `path`; a missing, unreadable or malformed file is a SpecError. Read
    as scenarios are (spec.yamlio: a regular UTF-8 file of at most 4 MiB, no duplicate keys,
    nested at most 64 deep, aliases expanded to at most 200,000 values)."""
    if not path.exists() and not path.is_symlink():
        raise SpecError(f"validate --published: {path} not found")
    data = read_yaml(path, "validate --published")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping with a list of entries, "
                        f"got {type(data).__name__}")
    return data


def entries(path: Path, data: dict[str, Any], kind: str, model: type[BaseModel]
            ) -> list[dict[str, Any]]:
    """`data[kind]` checked entry by entry against `model`; the entries as plain dicts with the
    checked values (numbers as numbers), in file order."""
    items = data.get(kind)
    if items is None:  # (an absent or empty key: no entries of this kind)
        items = []
    if not isinstance(items, list):  # (before: 0, '' or false were taken as no entries)
        raise SpecError(f"{path}: {kind}: expected a list of entries, got {type(items).__name__}")
    out, seen = [], {}
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise SpecError(f"{path}: {kind}[{i}]: expected a mapping, got {item!r}")
        try:
            entry = model.model_validate(item)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"])
            what = ("missing" if err["type"] == "missing"
                    else f"{err['msg'][0].lower()}{err['msg'][1:]}, got {err['input']!r}")
            raise SpecError(f"{path}: {kind}[{i}]{where}: {what}") from None
        if entry.name in seen:
            raise SpecError(f"{path}: {kind}[{i}].name: {entry.name!r} repeats {kind}"
                            f"[{seen[entry.name]}]")
        seen[entry.name] = i
        out.append({**item, **entry.model_dump(include=set(item))})
    return out


def scenario_error(path: Path, kind: str, i: int, entry: dict[str, Any], exc: SpecError
                   ) -> SpecError:
    """A scenario error inside an entry, with the entry named in front."""
    return SpecError(f"{path}: {kind}[{i}] ({entry.get('name')}): {exc}")
