"""Published numbers that bear on time to target at real scale (validation/convergence/).

One YAML file per source (a paper's table or figure, or a repository's data file): where it was
read (`source`), what was trained on (`data`), and either training runs (`kind: runs`) with their
model size, tokens per step per model copy, replicas and sync period, outer optimizer, learning
rate schedule and evaluation losses, or fitted laws (`kind: law`) with their equation and
constants. Every entry is `fit` or `check`; the rule that decides it is `assign_split` below (and
validation/convergence/README.md), fixed before any prediction was made.

Every file is checked with pydantic; a bad one is a SpecError of one line naming the file, the
entry and the field with the value found (cut to 200 characters), never a traceback.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from ..spec.schema import SpecError

Split = Literal["fit", "check"]
Finite = Annotated[float, Field(allow_inf_nan=False)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Name = Annotated[str, Field(min_length=1, max_length=120, pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")]
Text = Annotated[str, Field(min_length=1)]

# physical ranges (inclusive): anything outside is a typo, not a measurement
PARAMS_RANGE = (1e3, 1e13)
TOKENS_RANGE = (1.0, 1e15)
BATCH_TOKENS_RANGE = (1.0, 1e9)
LR_RANGE = (1e-8, 10.0)
LOSS_RANGE = (0.0, 20.0)          # nats/token, exclusive of 0
BPB_RANGE = (0.0, 10.0)           # bits per byte, exclusive of 0
PPL_RANGE = (1.0, 1e6)
MAX_STEPS = 10**8

SCHEDULES = ("cosine", "constant", "linear", "wsd", "wsd_linear", "two_stage", "multi_step",
             "step", "inverse_sqrt")
OUTER = ("none", "average", "nesterov", "sgd", "sgdm", "adam")


class _FieldError(ValueError):
    """A check across fields that blames one field (and its value) in the one-line error."""

    def __init__(self, field: str, message: str, value: Any = None) -> None:
        super().__init__(message)
        self.field, self.value = field, value


def _within(value: float | None, lo: float, hi: float, what: str, lo_open: bool = False) -> None:
    if value is None:
        return
    if (value <= lo if lo_open else value < lo) or value > hi:
        raise _FieldError(what, f"must be in {'(' if lo_open else '['}{lo:g}, {hi:g}]", value)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)


class Source(_Strict):
    """Where the numbers were read."""
    citation: Text
    url: Annotated[str, Field(pattern=r"^https?://\S+$")]
    where: Text                      # table, figure, equation or file path
    commit: Annotated[str, Field(pattern=r"^[0-9a-f]{40}$")] | None = None
    how: Literal["table", "figure", "file", "text"]
    reading_uncertainty: NonNegative | None = None   # required for how: figure
    read_from: str | None = None     # the copy actually read, when not the primary document

    @model_validator(mode="after")
    def _consistent(self) -> Source:
        if self.how == "figure" and self.reading_uncertainty is None:
            raise _FieldError("reading_uncertainty", "a value digitised from a figure needs "
                              "reading_uncertainty", None)
        if self.how == "file" and self.commit is None:
            raise _FieldError("commit", "a repository file needs the commit it was read at", None)
        return self


class Data(_Strict):
    """What the models were trained on, and what the loss is measured on."""
    name: Text
    tokenizer: str | None = None
    vocab: Annotated[int, Field(ge=2, le=10**7)] | None = None
    eval_set: Text


class WarmStart(_Strict):
    """Data-parallel training the run starts from (one model copy): its steps are part of the
    step count in `eval`, not of `steps`."""
    steps: Annotated[int, Field(ge=1, le=MAX_STEPS)]
    batch_tokens: Positive | None = None


class Run(_Strict):
    """One published training run."""
    name: Name
    split: Split
    params: Positive | None = None
    non_embedding_params: Positive | None = None
    layers: Annotated[int, Field(ge=1, le=10_000)] | None = None
    seq_len: Annotated[int, Field(ge=1, le=10**7)] | None = None
    batch_tokens: Positive | None = None    # tokens per optimizer step per model copy
    replicas: Annotated[int, Field(ge=1, le=10**6)]
    sync_every: Annotated[int, Field(ge=0, le=MAX_STEPS)]
    outer_optimizer: Literal[OUTER]  # type: ignore[valid-type]
    outer_lr: Positive | None = None
    outer_momentum: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)] | None = None
    optimizer: Text
    lr: Positive | None = None               # peak learning rate, absolute
    final_lr: NonNegative | None = None      # learning rate at the end, absolute
    warmup_steps: Annotated[int, Field(ge=0, le=MAX_STEPS)] | None = None
    schedule: Literal[SCHEDULES] | None = None  # type: ignore[valid-type]
    final_lr_fraction: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = None
    steps: Annotated[int, Field(ge=1, le=MAX_STEPS)] | None = None
    tokens: Positive | None = None           # all replicas, warm start included
    warm_start: WarmStart | None = None
    tuned: Literal["none", "best_of_sweep", "law_predicted"] = "none"
    variant: str | None = None
    eval: Annotated[list[tuple[Annotated[int, Field(ge=0, le=MAX_STEPS)] | None, Finite]],
                    Field(min_length=1)]
    eval_metric: Literal["loss", "perplexity", "bits_per_byte"]
    lr_trace: list[tuple[Annotated[int, Field(ge=0, le=MAX_STEPS)], NonNegative]] | None = None
    notes: str | None = None

    @field_validator("eval")
    @classmethod
    def _steps_in_order(cls, v: list[tuple[int | None, float]]) -> list[tuple[int | None, float]]:
        for i, (step, _) in enumerate(v):
            if step is None and i != len(v) - 1:
                raise ValueError("a null step (end of training, count not published) may only be "
                                 "the last evaluation point")
        steps = [s for s, _ in v if s is not None]
        if any(b <= a for a, b in itertools.pairwise(steps)):
            raise ValueError("evaluation steps must increase")
        return v

    @model_validator(mode="after")
    def _physical(self) -> Run:
        if self.params is None and self.non_embedding_params is None:
            raise _FieldError("params", "params or non_embedding_params is required", None)
        _within(self.params, *PARAMS_RANGE, "params")
        _within(self.non_embedding_params, *PARAMS_RANGE, "non_embedding_params")
        if self.params is not None and self.non_embedding_params is not None \
                and self.non_embedding_params > self.params:
            raise _FieldError("non_embedding_params", f"exceeds params {self.params:g}",
                              self.non_embedding_params)
        _within(self.tokens, *TOKENS_RANGE, "tokens")
        _within(self.batch_tokens, *BATCH_TOKENS_RANGE, "batch_tokens")
        _within(self.lr, *LR_RANGE, "lr")
        if self.final_lr is not None and self.lr is not None and self.final_lr > self.lr:
            raise _FieldError("final_lr", f"exceeds the peak lr {self.lr:g}", self.final_lr)
        if (self.outer_optimizer == "none") != (self.sync_every == 0):
            raise _FieldError("sync_every", f"{self.sync_every} with outer_optimizer "
                              f"{self.outer_optimizer!r}: outer_optimizer none goes with "
                              "sync_every 0 and only with it", self.sync_every)
        if self.replicas > 1 and self.sync_every == 0:
            raise _FieldError("sync_every", f"replicas {self.replicas} need sync_every >= 1",
                              self.sync_every)
        if self.outer_optimizer == "none" and (self.outer_lr or self.outer_momentum):
            raise _FieldError("outer_lr", "outer_lr/outer_momentum without an outer optimizer",
                              self.outer_lr)
        lo, hi = {"loss": LOSS_RANGE, "perplexity": PPL_RANGE,
                  "bits_per_byte": BPB_RANGE}[self.eval_metric]
        for _step, value in self.eval:
            if not (lo < value <= hi if self.eval_metric != "perplexity" else lo <= value <= hi):
                raise _FieldError("eval", f"{self.eval_metric} {value} outside the physical "
                                  f"range ({lo:g}, {hi:g}]", value)
        total = self.total_steps()
        last = [s for s, _ in self.eval if s is not None]
        if total is not None and last and last[-1] > total:
            raise _FieldError("eval", f"evaluation step {last[-1]} is past the run's {total} "
                              "steps", last[-1])
        if self.lr_trace is not None:
            for _, lr in self.lr_trace:
                _within(lr, 0.0, LR_RANGE[1], "lr_trace values")
        return self

    def total_steps(self) -> int | None:
        """Optimizer steps from initialisation: the warm start's and the run's own."""
        if self.steps is None:
            return None
        return self.steps + (self.warm_start.steps if self.warm_start else 0)

    def size(self) -> float:
        """The model size the split rule compares: total parameters when published, else
        non-embedding parameters (a pool uses one kind throughout)."""
        return float(self.params if self.params is not None else self.non_embedding_params)

    def horizon(self) -> float | None:
        """Training length per model copy: tokens / replicas when tokens are published, else the
        optimizer steps."""
        if self.tokens is not None:
            return self.tokens / self.replicas
        return float(self.total_steps()) if self.steps is not None else None


class Law(_Strict):
    """One published fitted relation."""
    name: Name
    split: Split
    equation: Text
    where: Text                       # equation or table number
    constants: Annotated[dict[Annotated[str, Field(min_length=1)], Finite], Field(min_length=1)]
    valid: Text                       # data, tokenizer, units, fitted range
    fitted_on: str | None = None      # the runs the authors fitted it on, when they are recorded


class ConvergenceSource(_Strict):
    """One file of validation/convergence/."""
    source: Source
    data: Data
    kind: Literal["runs", "law"]
    pool: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")]  # the split rule's group
    notes: Text
    runs: list[Run] | None = None
    laws: list[Law] | None = None
    _path: Path | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _entries(self) -> ConvergenceSource:
        have, other = ("runs", "laws") if self.kind == "runs" else ("laws", "runs")
        if not getattr(self, have):
            raise _FieldError(have, f"kind {self.kind} needs a non-empty {have} list",
                              getattr(self, have))
        if getattr(self, other):
            raise _FieldError(other, f"kind {self.kind} has no {other}", None)
        return self

    @property
    def path(self) -> Path | None:
        return self._path

    def list_key(self) -> str:
        return "runs" if self.kind == "runs" else "laws"

    def entries(self) -> list[Run] | list[Law]:
        return self.runs if self.kind == "runs" else self.laws  # type: ignore[return-value]


def _cut(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _error(path: Path, exc: ValidationError, data: dict[str, Any]) -> SpecError:
    err = exc.errors()[0]
    loc = list(err["loc"])
    where = ""
    # name the entry by its list and index, then the field
    for p in loc:
        where += f"[{p}]" if isinstance(p, int) else (f".{p}" if where else str(p))
    if len(loc) >= 2 and loc[0] in ("runs", "laws") and isinstance(loc[1], int):
        try:
            name = data[loc[0]][loc[1]].get("name")
        except (AttributeError, IndexError, KeyError, TypeError):
            name = None
        if name:
            where = f"{loc[0]}[{loc[1]}] ({name})" + where[len(f"{loc[0]}[{loc[1]}]"):]
    blamed = (err.get("ctx") or {}).get("error")
    if isinstance(blamed, _FieldError):
        where = f"{where}.{blamed.field}" if where else blamed.field
        what = str(blamed) + ("" if blamed.value is None else f", got {_cut(blamed.value)}")
    elif err["type"] == "missing":
        what = "missing"
    elif err["type"] == "extra_forbidden":
        what = "unknown key (not in the schema)"
    else:
        msg = err["msg"].removeprefix("Value error, ")
        what = f"{msg[0].lower()}{msg[1:]}, got {_cut(err.get('input'))}"
    return SpecError(f"{path}: {where or 'file'}: {what}".replace("\n", " "))


def load_file(path: Path) -> ConvergenceSource:
    """One file, checked; any problem is a one-line SpecError naming file, entry and field."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError(f"{path}: not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: cannot be read ({exc})") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping (source, data, kind, ...), got "
                        f"{type(data).__name__}")
    try:
        src = ConvergenceSource.model_validate(data)
    except ValidationError as exc:
        raise _error(path, exc, data) from None
    seen: dict[str, int] = {}
    key = src.list_key()
    for i, e in enumerate(src.entries()):
        if e.name in seen:
            raise SpecError(f"{path}: {key}[{i}].name: {e.name!r} repeats {key}[{seen[e.name]}]")
        seen[e.name] = i
    src._path = path
    return src


def load_published_convergence(folder: Path | str) -> list[ConvergenceSource]:
    """Every `*.yaml` file of `folder`, checked, in file-name order. Run names are unique within
    a pool (the split rule's group), so a run can be named by (pool, name)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SpecError(f"{folder}: not a folder of published convergence files")
    files = sorted(folder.glob("*.yaml"))
    if not files:
        raise SpecError(f"{folder}: no *.yaml files")
    out = [load_file(p) for p in files]
    owner: dict[tuple[str, str], Path] = {}
    for src in out:
        for e in src.entries():
            key = (src.pool, e.name)
            if key in owner and owner[key] != src.path:
                raise SpecError(f"{src.path}: {src.list_key()} name {e.name!r} is also in "
                                f"{owner[key].name} (pool {src.pool})")
            owner[key] = src.path  # type: ignore[assignment]
    return out


# ---- the fit/check split rule ----------------------------------------------------------------

def assign_split(runs: list[Run]) -> dict[str, Split]:
    """The split rule for the runs of one pool (one source paper on one training data set),
    applied in one pass; a run is `check` if any clause holds, else `fit`:

    1. size: the pool has at least two model sizes and the run's is the largest, or one of the
       two largest when the pool has at least five;
    2. horizon: among runs with the same model size, tokens per step per copy, replicas and sync
       period, the run has the longest horizon (tokens per copy, else optimizer steps) and that
       group has at least two distinct horizons;
    3. replicas: the pool has at least two distinct replica counts above one and the run has the
       largest.
    """
    sizes = sorted({r.size() for r in runs}, reverse=True)
    held_sizes = set(sizes[:2] if len(sizes) >= 5 else sizes[:1]) if len(sizes) >= 2 else set()
    groups: dict[tuple[Any, ...], list[Run]] = defaultdict(list)
    for r in runs:
        groups[(r.size(), r.batch_tokens, r.replicas, r.sync_every)].append(r)
    longest: set[str] = set()
    for members in groups.values():
        horizons = {h for h in (m.horizon() for m in members) if h is not None}
        if len(horizons) >= 2:
            top = max(horizons)
            longest |= {m.name for m in members if m.horizon() is not None
                        and math.isclose(m.horizon(), top, rel_tol=1e-9)}
    multi = sorted({r.replicas for r in runs if r.replicas > 1})
    most = multi[-1] if len(multi) >= 2 else None
    return {r.name: ("check" if r.size() in held_sizes or r.name in longest
                     or (most is not None and r.replicas == most) else "fit")
            for r in runs}


def pools(sources: list[ConvergenceSource]) -> dict[str, list[Run]]:
    """The runs of every pool, across files."""
    out: dict[str, list[Run]] = defaultdict(list)
    for src in sources:
        if src.kind == "runs":
            out[src.pool].extend(src.runs or [])
    return dict(out)


def split_mismatches(sources: list[ConvergenceSource]) -> list[str]:
    """Runs whose recorded split differs from the rule's, as `pool/name: recorded X, rule Y`."""
    out = []
    for pool, runs in sorted(pools(sources).items()):
        rule = assign_split(runs)
        out += [f"{pool}/{r.name}: recorded {r.split}, rule {rule[r.name]}"
                for r in runs if r.split != rule[r.name]]
    return out


# ---- summary ---------------------------------------------------------------------------------

TESTS = ("size", "horizon", "batch", "replicas", "outer", "schedule")


def _varies_within(runs: list[Run], group: Any, value: Any) -> bool:
    """Some group of runs (same `group(run)`) has two or more distinct non-null `value(run)`."""
    seen: dict[Any, set[Any]] = defaultdict(set)
    for r in runs:
        v = value(r)
        if v is not None:
            seen[group(r)].add(v)
    return any(len(vals) >= 2 for vals in seen.values())


def coverage_of(src: ConvergenceSource) -> list[str]:
    """What a file's runs can test, from which quantities vary among them: size (two model
    sizes), horizon (two lengths at one size, batch and sync setting), batch (two batches at one
    size and replica setting), replicas (two replica/sync settings at one size), outer (two outer
    optimizers among averaged runs), schedule (two schedules or learning rates at one size)."""
    if src.kind != "runs":
        return ["law"]
    runs = src.runs or []
    checks = {
        "size": _varies_within(runs, lambda r: 0, Run.size),
        "horizon": _varies_within(runs, lambda r: (r.size(), r.batch_tokens, r.replicas,
                                                    r.sync_every), Run.horizon),
        "batch": _varies_within(runs, lambda r: (r.size(), r.replicas, r.sync_every),
                                lambda r: r.batch_tokens),
        "replicas": _varies_within(runs, Run.size, lambda r: (r.replicas, r.sync_every)),
        "outer": _varies_within([r for r in runs if r.outer_optimizer != "none"], lambda r: 0,
                                lambda r: r.outer_optimizer),
        "schedule": _varies_within(
            runs, Run.size,
            lambda r: None if r.schedule is None and r.lr is None
            else (r.schedule, r.lr, r.final_lr, r.final_lr_fraction)),
    }
    return [t for t in TESTS if checks[t]]


def summary_rows(sources: list[ConvergenceSource]) -> list[dict[str, Any]]:
    """One row per file: file, pool, kind, fit and check counts, what the file can test."""
    rows = []
    for src in sources:
        count = Counter(e.split for e in src.entries())
        rows.append({"file": src.path.name if src.path else "?", "pool": src.pool,
                     "kind": src.kind, "fit": count.get("fit", 0),
                     "check": count.get("check", 0), "tests": coverage_of(src),
                     "source": src.source.citation})
    return rows


def summary(sources: list[ConvergenceSource]) -> str:
    """A plain-text table of `summary_rows` with totals."""
    rows = summary_rows(sources)
    width = max([len(r["file"]) for r in rows] + [4])
    lines = [f"{'file':<{width}}  {'kind':<4}  {'fit':>4}  {'check':>5}  tests"]
    for r in rows:
        lines.append(f"{r['file']:<{width}}  {r['kind']:<4}  {r['fit']:>4}  {r['check']:>5}  "
                     f"{', '.join(r['tests'])}")
    for kind in ("runs", "law"):
        fit = sum(r["fit"] for r in rows if r["kind"] == kind)
        check = sum(r["check"] for r in rows if r["kind"] == kind)
        lines.append(f"{'total ' + kind:<{width}}  {'':<4}  {fit:>4}  {check:>5}")
    return "\n".join(lines)

