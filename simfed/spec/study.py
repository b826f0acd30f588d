"""Convergence study files (`realrun converge-study`, results/convergence/NAME.json), checked
when read: by `simfed calibrate --convergence` and the report before anything is fitted, and by
`realrun converge-study` before it resumes a file. Every key known, every number finite and in
its physical range, evaluation steps increasing from 0 and within the run, one loss per step; a
fault is one line naming the file, the run and the field."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from .jsonio import read_json
from .models import FrozenModel
from .schema import SpecError

STUDY_SCHEMA = "realrun.convergence_study/1"
MAX_STEPS = 10**7


def _finite(v: float) -> float:
    if not math.isfinite(v):
        raise ValueError(f"must be a finite number, got {v}")
    return v


Num = Annotated[float, AfterValidator(_finite)]
Loss = Annotated[float, AfterValidator(_finite), Field(gt=0, le=100)]


class Noise(FrozenModel):
    step: int = Field(ge=0, le=MAX_STEPS)
    eval_loss: Loss
    grad_sq: Num | None = None
    trace_sigma: Num | None = None
    b_simple_tokens: Num | None = None  # null where the |G|^2 estimate is not positive


class StudyRun(FrozenModel):
    key: str = Field(min_length=1, max_length=200)
    seed: int = Field(ge=0)
    algorithm: Literal["fsdp", "hsdp", "fl_fsdp", "fl_hsdp"]
    groups: int = Field(ge=1, le=10**6)
    batch_per_model: int = Field(ge=1, le=10**9)
    seq_len: int = Field(ge=1, le=10**7)
    aggregate_every: int | None = Field(None, ge=1, le=MAX_STEPS)
    lr: Num = Field(gt=0, le=10)
    steps: int = Field(ge=1, le=MAX_STEPS)
    warmup_steps: int = Field(ge=0, le=MAX_STEPS)
    lr_schedule: Literal["cosine", "constant"]
    optimizer: Literal["adamw", "sgd"]
    ring_dtype: str | None = None
    outer_optimizer: Literal["nesterov"] | None = None
    eval_steps: list[int] = Field(min_length=1)
    eval_loss: list[Loss] = Field(min_length=1)
    train_loss: list[Num] = Field(default_factory=list)
    noise: list[Noise] = Field(default_factory=list)
    wall_s: Num = Field(0.0, ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> StudyRun:
        if len(self.eval_steps) != len(self.eval_loss):
            raise ValueError(f"eval_steps has {len(self.eval_steps)} points, eval_loss "
                             f"{len(self.eval_loss)}")
        if self.eval_steps[0] != 0:
            raise ValueError(f"eval_steps must start at 0 (the untrained model), got "
                             f"{self.eval_steps[0]}")
        bad = next((i for i in range(1, len(self.eval_steps))
                    if self.eval_steps[i] <= self.eval_steps[i - 1]), None)
        if bad is not None:
            raise ValueError(f"eval_steps must increase: {self.eval_steps[bad - 1]} then "
                             f"{self.eval_steps[bad]} at point {bad}")
        if self.eval_steps[-1] > self.steps:
            raise ValueError(f"eval_steps go to {self.eval_steps[-1]}, past the run's "
                             f"{self.steps} steps")
        if self.warmup_steps > self.steps:
            raise ValueError(f"warmup_steps {self.warmup_steps} > steps {self.steps}")
        return self


class StudyModel(FrozenModel):
    name: str
    layers: int = Field(ge=1, le=10_000)
    hidden: int = Field(ge=1, le=10**6)
    vocab: int = Field(ge=2, le=10**7)
    params: int = Field(ge=1)
    non_embedding_params: int | None = Field(None, ge=1)


class StudyData(FrozenModel):
    source: str
    describe: str = ""
    entropy_floor_nats: Num | None = Field(None, ge=0, le=100)
    unigram_loss_nats: Num | None = Field(None, gt=0, le=100)


class Study(FrozenModel):
    schema_: Literal["realrun.convergence_study/1"] = Field(alias="schema")
    experiment: str = Field(min_length=1)
    what: str = ""
    quick: bool = False
    base_scenario: str = ""
    base_overrides: dict[str, Any] = Field(default_factory=dict)
    model: StudyModel
    data: StudyData
    recipe: dict[str, Any] = Field(default_factory=dict)
    ranks_per_group: int = Field(1, ge=1)
    micro_batch: int = Field(1, ge=1)
    runs: list[StudyRun]

    @model_validator(mode="after")
    def _unique(self) -> Study:
        m, d = self.model, self.data
        if m.non_embedding_params is not None and m.non_embedding_params > m.params:
            raise ValueError(f"model.non_embedding_params {m.non_embedding_params} exceeds "
                             f"model.params {m.params}")
        untrained = math.log(m.vocab)  # the loss of uniform guessing over the vocabulary
        if d.unigram_loss_nats is not None and d.unigram_loss_nats >= untrained:
            raise ValueError(f"data.unigram_loss_nats {d.unigram_loss_nats:g} must be below the "
                             f"untrained loss ln(model.vocab) = {untrained:.4g}")
        if (d.entropy_floor_nats is not None and d.unigram_loss_nats is not None
                and d.entropy_floor_nats > d.unigram_loss_nats):
            raise ValueError(f"data.entropy_floor_nats {d.entropy_floor_nats:g} is above "
                             f"data.unigram_loss_nats {d.unigram_loss_nats:g}")
        seen: set[tuple[str, int]] = set()
        for r in self.runs:
            if (r.key, r.seed) in seen:
                raise ValueError(f"run {r.key} seed {r.seed} appears twice")
            seen.add((r.key, r.seed))
        return self


def is_size_study(study: dict[str, Any]) -> bool:
    """A file of the size study: it names its model's non-embedding size, which the scaling
    model takes as an input (the other studies fit the noise_progress model)."""
    return (study.get("model") or {}).get("non_embedding_params") is not None


def read_study_file(path: str | Path, *, defaults: bool = True) -> dict[str, Any]:
    """A study file as plain data, checked and typed (SpecError naming the file and field
    otherwise), every key present with its default (`defaults=False`: only the keys the file
    has, as a study being resumed is written back)."""
    p = Path(path)
    data = read_json(p, "a convergence study")
    if not isinstance(data, dict) or data.get("schema") != STUDY_SCHEMA:
        raise SpecError(f"{p}: not a convergence study file (schema {STUDY_SCHEMA} expected; "
                        "write one with `realrun converge-study`)")
    study = Study.parse(data, str(p))
    # the values as checked, not as written: pydantic's lax mode accepts "12" or 2.0 for the
    # integer 12 or 2 (and the files hold steps such as 0.0); readers get the numbers
    return study.model_dump(by_alias=True, exclude_unset=not defaults)
