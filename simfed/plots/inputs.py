"""The result files `simfed plot` and `simfed figures` draw from, read and checked before any
figure is drawn or written: `simfed run --json` output (phases), `simfed sweep` rows (scaling,
heatmap) and the convergence study files behind the FL-grid figure.

Each is read by `spec.jsonio.read_json` (a regular UTF-8 file of bounded size, strict JSON: no
NaN or Infinity, nested at most 64 deep) and validated by a pydantic model of the fields the
figures use: their types and ranges (times 0 to 10^7 s, every number finite), required where a
figure needs them. Keys the figures do not use are kept as they are (the files are simfed's own
output, which grows new fields). A fault is one line naming the file, the key and the value
(cut to 200 characters)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from ..spec import SpecError
from ..spec.jsonio import read_json
from ..spec.limits import MAX_TIME_S
from ..spec.messages import shown

Seconds = Annotated[float, Field(ge=0, le=MAX_TIME_S, allow_inf_nan=False)]
PositiveSeconds = Annotated[float, Field(gt=0, le=MAX_TIME_S, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, le=1e30, allow_inf_nan=False)]
Positive = Annotated[float, Field(gt=0, le=1e30, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=2**53)]


class _Open(BaseModel):
    """Strict types (a string is not a number), other keys kept."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)


class ClusterInfo(_Open):
    world: Annotated[int, Field(ge=1, le=2**53)] | None = None
    gpu: str = ""
    name: str = ""


class ModelInfo(_Open):
    name: str = ""


class AlgorithmResult(_Open):
    """One algorithm of `simfed run --json`: what the phases figure draws."""

    name: str
    label: str
    step_time_s: PositiveSeconds
    phases_s: dict[Literal["forward", "backward", "optimizer", "aggregation", "other"], Seconds]
    compute_s: Seconds
    exposed_comm_s: Seconds
    debug_checks_s: Seconds = 0.0
    speedup: Positive | None = None
    tokens_per_s: NonNegative | None = None


class RunResults(_Open):
    """`simfed run --json` output."""

    scenario: str
    cluster: ClusterInfo
    model: ModelInfo = ModelInfo()
    algorithms: Annotated[list[AlgorithmResult], Field(min_length=1)]


class SweepRow(_Open):
    """One row of `simfed sweep` (JSON `rows`, or a CSV line re-nested): a point x algorithm.
    Rows of invalid points carry no results (null)."""

    point: Count
    params: dict[str, str | int | float | bool | None]  # the swept keys' values (scalars)
    status: Literal["ok", "invalid", "does_not_fit", "error"] = "ok"
    name: str | None = None
    label: str | None = None
    baseline: str | None = None
    cluster: ClusterInfo | None = None
    model: ModelInfo | None = None
    step_time_s: PositiveSeconds | None = None
    tokens_per_s: NonNegative | None = None
    tokens_per_s_per_gpu: NonNegative | None = None
    speedup: Positive | None = None
    mfu: NonNegative | None = None

    @pydantic.model_validator(mode="after")
    def _simulated_rows_have_results(self) -> SweepRow:
        """A simulated row (ok) has its step time and throughputs, as simfed sweep writes it."""
        if self.status == "ok":
            for key in ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu"):
                if getattr(self, key) is None:
                    raise ValueError(f"{key} is missing, but the row's status is ok (simulated)")
        return self


class SweepFile(_Open):
    sweep: dict[str, Any] = {}
    rows: list[SweepRow]


class StudyRun(_Open):
    """The fields of a convergence study's run that the FL-grid figure uses."""

    algorithm: str
    lr: Positive
    groups: Annotated[int, Field(ge=1, le=2**53)]
    batch_per_model: Annotated[int, Field(ge=1, le=2**53)]
    aggregate_every: Annotated[int, Field(ge=1, le=2**53)] | None = None
    seed: int
    eval_loss: Annotated[list[NonNegative], Field(min_length=1)]


class StudyRecipe(_Open):
    paper_lr: Positive


class StudyForGrid(_Open):
    """A `realrun converge-study` file, as far as the FL-grid figure reads it."""

    recipe: StudyRecipe
    ranks_per_group: Annotated[int, Field(ge=1, le=2**20)]
    micro_batch: Annotated[int, Field(ge=1, le=2**20)]
    runs: list[StudyRun]


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for p in loc:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def check(model: type[BaseModel], data: Any, source: str) -> Any:
    """`data` validated by `model`; a SpecError naming `source`, the key and the value."""
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        where = _loc(err["loc"]) or "the top level"
        got = "" if err["type"] == "missing" else f", got {shown(err.get('input'))}"
        raise SpecError(f"{source}: {where}: {err['msg'].lower()}{got}") from None


def run_results(path: str | Path, what: str = "plot phases") -> dict[str, Any]:
    """`simfed run --json` output, checked (the plain JSON value is returned)."""
    data = read_json(path, what)
    check(RunResults, data, f"{path} (expected simfed run --json output)")
    return data


def sweep_rows(path: str | Path, what: str = "plot") -> list[dict[str, Any]]:
    """The rows of a `simfed sweep` JSON or CSV file, checked."""
    p = Path(path)
    if p.suffix.lower() == ".csv":
        from ..sweep import read_rows

        rows = read_rows(p)
        checked = [check(SweepRow, r, f"{p} (a simfed sweep CSV), row {i + 1}")
                   for i, r in enumerate(rows)]
    else:
        data = read_json(p, what)
        checked = check(SweepFile, data, f"{p} (expected simfed sweep JSON)").rows
        rows = data["rows"]
    # the values as checked (an integer 10**30 is the number 1e30), the other keys as written
    return [{**r, **m.model_dump(exclude_unset=True)} for r, m in zip(rows, checked,
                                                                     strict=True)]


def study_for_grid(path: str | Path, what: str = "figures") -> dict[str, Any]:
    """A convergence study file as the convergence figures read it, checked whole
    (simfed.spec.study) and for what the FL-grid figure needs."""
    from ..spec.study import read_study_file

    data = read_study_file(path)
    check(StudyForGrid, data, f"{path} (a realrun converge-study file)")
    return data
