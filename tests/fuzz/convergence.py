"""Fuzz kinds for the convergence model's inputs: `study` (convergence study files, as `realrun
converge-study` writes them, read by `simfed calibrate --convergence` and `python -m
simfed.convergence.report`) and `profile` (a scenario's `convergence:` section: a fitted
profile of the scaling or the noise_progress model, inline or included, and the scaling model's
`data_constants`, run by `simfed run`).

Each case mutates a valid base (a study of three runs of the size study's smallest model; the
scaling profile fitted on the size study, the noise_progress profile fitted on the synthetic
study) at one place, or damages the whole file. The oracle does not ask simfed: it walks the
mutated document against the rules the schemas state (`STUDY_RULES`, `SCALING_RULES`,
`NOISE_RULES`: types, ranges, required keys, list lengths, keys that may not be added) and the
cross-field rules (a run's evaluation steps start at 0, increase and stay within its steps, one
loss per step; a covariance is n x n and every draw has n values; a data constant lies in the
range of the profile parameter it replaces). A document that breaks one is INVALID: it must be
refused in one line (exit 2); one that breaks none may run or be refused (EITHER), but never
crash, hang or write invalid JSON; the unmutated base is VALID.

The sources of the rules: simfed/spec/study.py (Study, StudyRun, Noise), simfed/convergence/
profile.py (ProfileV1, ProfileV2, NoiseProgressParams, ScalingParams, FittedRangeV1/2, Check),
simfed/spec/scenario.py (ConvergenceSpec), docs/input-contract.md.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
import math
from collections.abc import Callable
from typing import Any

import yaml

from simfed.spec.yamlio import dump_yaml

from .cases import EITHER, INVALID, ROOT, SCENARIOS, VALID, Case
from .families import (
    DEEP,
    EXTRA_FAMILIES,
    VALUES,
    WHOLE_FILE,
    Families,
    Raw,
    Rule,
    apply,
    breaks,
    dotted,
    dumps,
    paths,
)

# the mutations: the shared values and a few at the edges of this schema's ranges
CONV_VALUES: list[tuple[str, Any]] = [*VALUES, ("1e6", 1e6), ("100.5", 100.5),
                                      ("1e-12", 1e-12), ("2", 2), ("0.5", 0.5)]
LAX = {"strict": False}  # pydantic's lax mode: "12" and true are numbers, 2.0 an integer
OPT = {"required": False, "nullable": True}
STUDY_SCHEMA = "realrun.convergence_study/1"
MAX_STEPS = 10**7
SPARSE_STUDY = 256 * 2**20 + 1  # one byte over the JSON reader's limit (spec.jsonio)
SPARSE_YAML = 4 * 2**20 + 1  # one byte over the YAML reader's limit (spec.yamlio)


def num(lo: float | None = None, hi: float | None = None, **kw: Any) -> Rule:
    return Rule("num", lo, hi, **{**LAX, **kw})


def integer(lo: float | None = None, hi: float | None = None, **kw: Any) -> Rule:
    return Rule("int", lo, hi, **{**LAX, **kw})


ANY = Rule("any", required=False, nullable=True)


# ---------------------------------------------------------------------------------------------
# the study file (simfed/spec/study.py)

LOSS = num(0, 100, lo_open=True)
STUDY_RULES: dict[str, Rule] = {
    "schema": Rule("enum", choices=(STUDY_SCHEMA,)),
    "experiment": Rule("str", 1), "what": Rule("str", required=False),
    "quick": Rule("any", required=False), "base_scenario": Rule("str", required=False),
    "base_overrides": Rule("dict", required=False), "base_overrides.*": ANY,
    "model": Rule("dict"), "model.name": Rule("str"), "model.layers": integer(1, 10_000),
    "model.hidden": integer(1, 10**6), "model.vocab": integer(2, 10**7),
    "model.params": integer(1), "model.non_embedding_params": integer(1, **OPT),
    "data": Rule("dict"), "data.source": Rule("str"), "data.describe": Rule("str", required=False),
    "data.entropy_floor_nats": num(0, 100, **OPT),
    "data.unigram_loss_nats": num(0, 100, lo_open=True, **OPT),
    "recipe": Rule("dict", required=False), "recipe.*": ANY,
    "ranks_per_group": integer(1, required=False), "micro_batch": integer(1, required=False),
    "runs": Rule("list"), "runs[*]": Rule("dict"),
    "runs[*].key": Rule("str", 1, 200), "runs[*].seed": integer(0),
    "runs[*].algorithm": Rule("enum", choices=("fsdp", "hsdp", "fl_fsdp", "fl_hsdp")),
    "runs[*].groups": integer(1, 10**6), "runs[*].batch_per_model": integer(1, 10**9),
    "runs[*].seq_len": integer(1, 10**7), "runs[*].aggregate_every": integer(1, MAX_STEPS, **OPT),
    "runs[*].lr": num(0, 10, lo_open=True), "runs[*].steps": integer(1, MAX_STEPS),
    "runs[*].warmup_steps": integer(0, MAX_STEPS),
    "runs[*].lr_schedule": Rule("enum", choices=("cosine", "constant")),
    "runs[*].optimizer": Rule("enum", choices=("adamw", "sgd")),
    "runs[*].ring_dtype": Rule("str", **OPT),
    "runs[*].outer_optimizer": Rule("enum", choices=("nesterov",), **OPT),
    "runs[*].eval_steps": Rule("list", 1), "runs[*].eval_steps[*]": integer(0, MAX_STEPS),
    "runs[*].eval_loss": Rule("list", 1), "runs[*].eval_loss[*]": LOSS,
    "runs[*].train_loss": Rule("list", required=False), "runs[*].train_loss[*]": num(),
    "runs[*].noise": Rule("list", required=False), "runs[*].noise[*]": Rule("dict"),
    "runs[*].noise[*].step": integer(0, MAX_STEPS), "runs[*].noise[*].eval_loss": LOSS,
    **{f"runs[*].noise[*].{k}": num(**OPT) for k in ("grad_sq", "trace_sigma",
                                                     "b_simple_tokens")},
    "runs[*].wall_s": num(0, required=False),
}
STUDY_CLOSED = ("", "model", "data", "runs[*]", "runs[*].noise[*]")  # unknown keys refused


def lax_int(v: Any) -> int | None:
    """`v` as pydantic's lax mode reads an integer (None: it would refuse it)."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            return None
    return None


def lax_float(v: Any) -> float | None:
    """`v` as pydantic's lax mode reads a finite number (None: it would refuse it)."""
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, str):
        try:
            f = float(v.strip())
        except ValueError:
            return None
        return f if math.isfinite(f) else None
    return None


def _header_cross(doc: dict[str, Any]) -> bool:
    """Non-embedding parameters within the parameters; the unigram loss below the untrained
    ln(vocab), the entropy floor not above it."""
    model, data = doc.get("model"), doc.get("data")
    if not isinstance(model, dict) or not isinstance(data, dict):
        return False
    ne, p, vocab = (lax_int(model.get(k)) for k in ("non_embedding_params", "params", "vocab"))
    if ne is not None and p is not None and ne > p:
        return True
    uni, floor = (lax_float(data.get(k)) for k in ("unigram_loss_nats", "entropy_floor_nats"))
    if uni is not None and vocab is not None and vocab >= 2 and uni >= math.log(vocab):
        return True
    return uni is not None and floor is not None and floor > uni


def study_cross(doc: Any) -> bool:
    """A run's evaluation steps start at 0 and increase within its steps, one loss per step;
    warm-up within the steps; no run (key, seed) twice (simfed/spec/study.py)."""
    runs = doc.get("runs") if isinstance(doc, dict) else None
    if not isinstance(runs, list):
        return False
    if _header_cross(doc):
        return True
    seen = set()
    for r in runs:
        if not isinstance(r, dict):
            continue
        steps, warm = lax_int(r.get("steps")), lax_int(r.get("warmup_steps"))
        es, el = r.get("eval_steps"), r.get("eval_loss")
        if isinstance(es, list) and isinstance(el, list) and len(es) != len(el):
            return True
        if isinstance(es, list) and es:
            ints = [lax_int(s) for s in es]
            if all(i is not None for i in ints):
                if ints[0] != 0 or any(b <= a for a, b in itertools.pairwise(ints)):
                    return True
                if steps is not None and ints[-1] > steps:
                    return True
        if steps is not None and warm is not None and warm > steps:
            return True
        key, seed = r.get("key"), lax_int(r.get("seed"))
        if isinstance(key, str) and seed is not None:
            if (key, seed) in seen:
                return True
            seen.add((key, seed))
    return False


# ---------------------------------------------------------------------------------------------
# the profiles (simfed/convergence/profile.py) and convergence.data_constants

PAIR = Rule("list", 2, 2)
SCALING_PARAMS = {  # ScalingParams: (lo, hi, lo refused)
    "log_lr_star": (math.log(1e-8), math.log(100), False), "lr_size_exponent": (-2, 3, False),
    "log_noise_star": (-10, 60, False), "noise_loss_exponent": (0, 20, False),
    "log_progress_scale": (-20, 30, False), "exponent": (0, 10, True),
    "progress_size_exponent": (-3, 3, False), "loss_floor": (0, 100, False),
    "log_floor_coef": (-30, 10, False), "floor_size_exponent": (0, 3, False),
    "log_fl_kappa": (-20, 20, False), "unigram_loss": (0, 100, False),
    "log_unigram_scale": (-20, 20, False),
    "log_unigram_lr_star": (math.log(1e-8), math.log(100), False),
    "lr_tail": (0.55, 4, False), "lr_tail_size_exponent": (-2, 2, False),
    "lr_damage": (0, 100, False),
}
# profiles fitted before these read as their defaults
OPTIONAL_PARAMS = ("lr_tail", "lr_tail_size_exponent", "lr_damage")
NOISE_PARAMS = {  # NoiseProgressParams
    "log_progress_scale": (-20, 20, False), "exponent": (0, 10, True),
    "log_noise_tokens": (-20, 40, False), "noise_exponent": (0, 10, False),
    "fl_rho1": (0, 1, False), "log_fl_kappa": (-20, 20, False), "loss_floor": (0, 100, False),
}
# convergence.data_constants: each replaces a scaling parameter (simfed/convergence/predict.py),
# so it is held to that parameter's range (a log parameter's range exponentiated); optimal_lr
# to the range of the model's optimal learning rates
DC = {"required": False}
DATA_CONSTANTS = {
    "loss_floor": num(0, 100, **DC), "floor_coef": num(math.exp(-30), math.exp(10), **DC),
    "floor_size_exponent": num(0, 3, **DC),
    "noise_star_tokens": num(math.exp(-10), math.exp(60), **DC),
    "noise_loss_exponent": num(0, 20, **DC), "unigram_loss": num(0, 100, **DC),
    "optimal_lr": num(1e-8, 100, **DC),
}
CHECK = {"checks": Rule("list", required=False), "checks[*]": Rule("dict"),
         "checks[*].what": Rule("str"), "checks[*].fit": Rule("str"),
         "checks[*].check": Rule("str"), "checks[*].points": integer(0),
         "checks[*].median_abs_error": num(0, **OPT), "checks[*].worst_abs_error": num(0, **OPT),
         "checks[*].inside_band": num(0, 1, **OPT),
         "checks[*].inside_closed_band": num(0, 1, **OPT),
         "checks[*].seen": Rule("bool", required=False),
         "checks[*].unreached": integer(0, required=False),
         "checks[*].median_abs_error_with_unreached": num(0, **OPT)}


def _params(table: dict[str, tuple[float, float, bool]]) -> dict[str, Rule]:
    return {f"params.{k}": num(lo, hi, lo_open=op, required=k not in OPTIONAL_PARAMS)
            for k, (lo, hi, op) in table.items()}


SCALING_PROFILE: dict[str, Rule] = {
    "schema": Rule("enum", choices=("simfed.convergence_profile/2",), required=False),
    "model": Rule("enum", choices=("scaling",), required=False), "source": Rule("str"),
    "params": Rule("dict"), **_params(SCALING_PARAMS),
    "covariance": Rule("list"), "covariance[*]": Rule("list"), "covariance[*][*]": num(),
    "draws": Rule("list", required=False), "draws[*]": Rule("list"), "draws[*][*]": num(),
    "residual_sd": num(0, 10), "progress_sd": num(0, 10, **OPT),
    "fit_progress_sd": num(0, 10, **OPT), "progress_sd_from": Rule("str", required=False),
    "rms_error": num(0, 10),
    "on_bound": Rule("list", required=False),
    "on_bound[*]": Rule("enum", choices=tuple(SCALING_PARAMS)),
    "fitted_range": Rule("dict"), "fitted_range.data": Rule("str"),
    "fitted_range.vocab": integer(2),
    **{f"fitted_range.{k}": PAIR for k in ("seq_len", "non_embedding_params", "lr",
                                           "batch_tokens", "groups", "aggregate_every",
                                           "steps", "loss")},
    **{f"fitted_range.{k}[*]": num(0, lo_open=True) for k in (
        "seq_len", "non_embedding_params", "lr", "batch_tokens", "groups", "aggregate_every",
        "steps", "loss")},
    "fitted_range.optimizer": Rule("str", required=False),
    "fitted_range.outer": Rule("list", required=False), "fitted_range.outer[*]": Rule("str"),
    **CHECK,
}
NOISE_PROFILE: dict[str, Rule] = {
    "schema": Rule("enum", choices=("simfed.convergence_profile/1",), required=False),
    "model": Rule("enum", choices=("noise_progress",), required=False),
    "source": Rule("str", required=False), "loss_init": num(0, 100, lo_open=True, **OPT),
    "params": Rule("dict"), **_params(NOISE_PARAMS),
    "covariance": Rule("list", **OPT), "covariance[*]": Rule("list"), "covariance[*][*]": num(),
    "draws": Rule("list", required=False), "draws[*]": Rule("list"), "draws[*][*]": num(),
    "residual_sd": num(0, 10, required=False), "rms_error": num(0, **OPT),
    "fitted_range": Rule("dict", required=False),
    "fitted_range.model": Rule("str", **OPT), "fitted_range.model_params": num(0, lo_open=True,
                                                                                **OPT),
    "fitted_range.vocab": integer(2, **OPT), "fitted_range.data": Rule("str", **OPT),
    "fitted_range.seq_len": integer(1, **OPT), "fitted_range.lr": num(0, lo_open=True, **OPT),
    "fitted_range.optimizer": Rule("str", **OPT),
    **{f"fitted_range.{k}": Rule("list", 2, 2, **OPT) for k in ("batch_tokens", "groups",
                                                                "aggregate_every", "steps")},
    **{f"fitted_range.{k}[*]": num(0, lo_open=True) for k in ("batch_tokens", "groups",
                                                               "aggregate_every", "steps")},
}


def convergence_rules(model: str) -> dict[str, Rule]:
    """The scenario's `convergence:` section with a profile of `model` (ConvergenceSpec)."""
    prof = SCALING_PROFILE if model == "scaling" else NOISE_PROFILE
    rules = {
        # the other model refuses this profile; none (the default) uses none
        "model": Rule("enum", choices=(model,), required=False),
        "target_loss": num(0, required=False), "profile": Rule("dict"),
        **{f"profile.{k}": r for k, r in prof.items()},
    }
    if model == "scaling":
        rules["data_constants"] = Rule("dict", **OPT)
        rules.update({f"data_constants.{k}": r for k, r in DATA_CONSTANTS.items()})
    return rules


CONV_CLOSED = ("", "profile", "profile.params", "profile.fitted_range", "profile.checks[*]",
               "data_constants")


def profile_cross(n: int, optional: int = 0) -> Callable[[Any], bool]:
    """A covariance is n x n (or empty: none), every draw has n values (or all of them n - k
    for k up to `optional`), on_bound names parameters, a fitted range's low is not above its
    high."""

    def broken(doc: Any) -> bool:
        prof = doc.get("profile") if isinstance(doc, dict) else None
        if not isinstance(prof, dict):
            return False
        cov, draws = (m if isinstance(m, list) else [] for m in
                      (prof.get("covariance"), prof.get("draws")))
        lengths = {len(r) for r in cov + draws if isinstance(r, list)}
        # a profile fitted before the `optional` trailing parameters: every row and the
        # covariance's side shorter by as many, read as their defaults
        short = (len(lengths) == 1 and n - optional <= min(lengths) < n
                 and len(cov) in (0, min(lengths)))
        if not short and (lengths - {n} or (cov and len(cov) != n)):
            return True
        rng = prof.get("fitted_range")  # a fitted range [low, high] has low <= high
        for pair in (rng.values() if isinstance(rng, dict) else ()):
            if isinstance(pair, list) and len(pair) == 2:
                lo, hi = (lax_float(v) for v in pair)
                if lo is not None and hi is not None and lo > hi:
                    return True
        return False

    return broken


# ---------------------------------------------------------------------------------------------
# the oracle: the mutated document walked against the rules


def _tokens(pattern: str) -> list[str]:
    out: list[str] = []
    for part in pattern.replace("[*]", ".[*]").split("."):
        if part:
            out.append("*" if part == "[*]" else part)
    return out


def _matches(doc: Any, tokens: list[str]) -> list[tuple[bool, Any]]:
    """(present, value) of every place `tokens` names in `doc` (the parents that exist)."""
    nodes = [doc]
    for i, tok in enumerate(tokens):
        last = i == len(tokens) - 1
        nxt: list[Any] = []
        out: list[tuple[bool, Any]] = []
        for node in nodes:
            if tok == "*":
                if isinstance(node, list):
                    nxt.extend(node)
                    out.extend((True, v) for v in node)
            elif isinstance(node, dict):
                if tok in node:
                    nxt.append(node[tok])
                    out.append((True, node[tok]))
                elif last:
                    out.append((False, None))
        if last:
            return out
        nodes = nxt
    return [(True, doc)]


def _has(doc: Any, marker: Callable[[Any], bool]) -> bool:
    stack = [doc]
    while stack:
        x = stack.pop()
        if marker(x):
            return True
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return False


def broken_by(doc: Any, rules: dict[str, Rule], closed: tuple[str, ...], *, strict_json: bool,
              cross: Callable[[Any], bool] | None = None) -> bool | None:
    """True when `doc` breaks a rule; None when it breaks none but a value's validity is not
    known (a lax conversion); False when it keeps every rule."""
    if _has(doc, lambda x: x is DEEP):
        return True  # past the readers' nesting limit (64)
    if strict_json and _has(doc, lambda x: isinstance(x, Raw)):
        return True
    unknown = False
    for pattern, rule in rules.items():
        if pattern.endswith(".*"):
            continue
        for present, value in _matches(doc, _tokens(pattern)):
            if not present:
                if rule.required:
                    return True
                continue
            b = _breaks(rule, value)
            if b:
                return True
            unknown = unknown or b is None
    for pattern in closed:  # a key no rule names, added where unknown keys are refused
        head = _tokens(pattern)
        known = {_tokens(p)[len(head)] for p in rules
                 if len(_tokens(p)) > len(head) and _tokens(p)[:len(head)] == head}
        for present, node in _matches(doc, head):
            if present and isinstance(node, dict) and set(node) - known:
                return True
    if cross is not None and cross(doc):
        return True
    if not strict_json and _has(doc, lambda x: isinstance(x, Raw)):
        unknown = True  # NaN where no rule speaks: a reader may take it
    return None if unknown else False


def _breaks(rule: Rule, value: Any) -> bool | None:
    if rule.kind == "any":
        return False
    if rule.kind in ("num", "int") and not rule.strict:  # pydantic's lax conversions
        if isinstance(value, bool):
            value = int(value)
        elif isinstance(value, str):
            try:
                value = int(value) if rule.kind == "int" else float(value)
            except ValueError:
                return True
        if isinstance(value, float) and not math.isfinite(value):
            return True
        if rule.kind == "int" and isinstance(value, float) and not value.is_integer():
            return True  # a fraction is never an integer
    if rule.kind == "str" and isinstance(value, str):
        return len(value) < (rule.lo or 0) or (rule.hi is not None and len(value) > rule.hi)
    if rule.kind == "list" and isinstance(value, list):
        return len(value) < (rule.lo or 0) or (rule.hi is not None and len(value) > rule.hi)
    return breaks(rule, value)


# ---------------------------------------------------------------------------------------------
# mutation


def mutate(fam: Families, base: Any, rules: dict[str, Rule], closed: tuple[str, ...], *,
           strict_json: bool, cross: Callable[[Any], bool] | None = None,
           whole: float = 0.16) -> tuple[str, Any, str]:
    """(what, the document or the whole file's damage name, expectation). The place is drawn
    by key pattern first (each checked key as likely as any other, a covariance entry no more
    than a parameter), then a concrete place of that pattern."""
    rng = fam.rng
    r = rng.random()
    if r < 0.05:
        return "the base", base, VALID
    if r < 0.05 + whole:
        return "whole", None, INVALID
    every = paths(base)
    by: dict[str, list[tuple]] = {}
    for p in every:
        by.setdefault(dotted(p), []).append(p)
    checked = sorted(d for d in by if d in rules)
    pattern = rng.choice(checked if checked and rng.random() < 0.7 else sorted(by))
    path = rng.choice(by[pattern])
    label, value = rng.choice(CONV_VALUES)
    doc = apply(base, path, value)
    b = broken_by(doc, rules, closed, strict_json=strict_json, cross=cross)
    return f"{dotted(path)} {label}", doc, INVALID if b else EITHER


# ---------------------------------------------------------------------------------------------
# the bases


@functools.cache
def study_base() -> dict[str, Any]:
    """The first three runs of the size study's smallest model (kjv-h48): 12 KB; too few
    evaluation points to fit the scaling model (calibrate refuses it in one line), enough for
    the report's tables."""
    data = json.loads((ROOT / "results" / "convergence" / "kjv-h48.json").read_text())
    return {**data, "runs": data["runs"][:3]}


TINY = SCENARIOS / "convergence-tiny.yaml"


@functools.cache
def profile_base(model: str) -> dict[str, Any]:
    name = "kjv-scaling" if model == "scaling" else "synthetic-tiny"
    return yaml.safe_load((SCENARIOS / "convergence" / f"{name}.yaml").read_text())


# constants of another corpus, inside each range; the scaling base with them still reaches its
# target (loss 3.5) within 32 steps
DATA_CONSTANTS_BASE = {"loss_floor": 1.7, "floor_coef": 0.05, "floor_size_exponent": 0.3,
                       "noise_star_tokens": 1.0e6, "noise_loss_exponent": 4.0,
                       "unigram_loss": 2.9, "optimal_lr": 3.0e-3}


def convergence_base(form: str) -> dict[str, Any]:
    """The `convergence:` section: scaling, scaling with data constants, or noise_progress."""
    if form == "noise_progress":
        return {"model": "noise_progress", "target_loss": 5.2,
                "profile": copy.deepcopy(profile_base("noise_progress"))}
    conv: dict[str, Any] = {"model": "scaling", "target_loss": 3.5,
                            "profile": copy.deepcopy(profile_base("scaling"))}
    if form == "constants":
        conv["data_constants"] = dict(DATA_CONSTANTS_BASE)
    return conv


def scenario(conv: Any, model: str) -> dict[str, Any]:
    """convergence-tiny shrunk to 8 nodes and 32 steps; the scaling model on the KJV data with
    the size study's peak learning rate."""
    out: dict[str, Any] = {"include": str(TINY), "name": "fuzz-profile",
                           "cluster": {"nodes": 8}, "training": {"steps": 32}}
    if model == "scaling":
        out["training"].update(warmup_steps=3, lr=3.0e-3)
        out["data"] = {"source": "kjv"}
    out["convergence"] = conv
    return out


def _plain(doc: Any) -> Any:
    """The document with NaN/Infinity as floats and deep values as nested lists (for YAML)."""
    return json.loads(dumps(doc))


def _flow(data: Any) -> bytes:
    """YAML in flow style: reads back as the same values, and a file cut short does not
    parse."""
    return dump_yaml(data, default_flow_style=True, width=10**9, sort_keys=False).encode()


# ---------------------------------------------------------------------------------------------
# the case makers


def study_case(fam: Families) -> Case:
    base = study_base()
    what, doc, expect = mutate(fam, base, STUDY_RULES, STUDY_CLOSED, strict_json=True,
                               cross=study_cross)
    files: dict[str, bytes] = {}
    specials: dict[str, str] = {}
    if what == "whole":
        if fam.rng.random() < 0.1:
            what = f"over the size limit ({SPARSE_STUDY:,} bytes)"
            specials["study.json"] = f"sparse:{SPARSE_STUDY}"
        else:
            what, damage = fam.rng.choice(WHOLE_FILE)
            files["study.json"] = damage(dumps(base))
    else:
        files["study.json"] = dumps(doc)
    if fam.rng.random() < 0.5:
        # three runs hold too few evaluation points to fit (32 of the 39 the scaling model's 13
        # parameters need): the base is refused in one line, and nothing is written
        expect = EITHER if expect == VALID else expect
        argv = ["calibrate", "--convergence", "{dir}/study.json", "--out", "{dir}/p.yaml",
                "--draws", "0"]
        return fam.case("study", f"calibrate: {what}", expect, files, argv, ("p.yaml", "p.json"),
                        specials=specials)
    return fam.case("study", f"report: {what}", expect, files, ["{dir}/study.json"], (),
                    prog="report", specials=specials)


PROFILE_FORMS = (("scaling", 9), ("constants", 5), ("noise_progress", 6))


def profile_case(fam: Families) -> Case:
    rng = fam.rng
    form = rng.choices([f for f, _ in PROFILE_FORMS], [w for _, w in PROFILE_FORMS])[0]
    model = "noise_progress" if form == "noise_progress" else "scaling"
    n = len(NOISE_PARAMS if model == "noise_progress" else SCALING_PARAMS)
    base = convergence_base(form)
    what, doc, expect = mutate(fam, base, convergence_rules(model), CONV_CLOSED,
                               strict_json=False,
                               cross=profile_cross(n, len(OPTIONAL_PARAMS) if model == "scaling"
                                                   else 0))
    files: dict[str, bytes] = {}
    specials: dict[str, str] = {}
    included = what == "whole" or rng.random() < 0.3
    if what == "whole":
        conv = {k: v for k, v in base.items() if k != "profile"}
        conv["profile"] = {"include": "p.yaml"}
        if rng.random() < 0.1:
            what = f"the profile over the size limit ({SPARSE_YAML:,} bytes)"
            specials["p.yaml"] = f"sparse:{SPARSE_YAML}"
        else:
            what, damage = rng.choice(WHOLE_FILE)
            files["p.yaml"] = damage(_flow(base["profile"]))
            what = f"the profile file {what}"
    elif included and isinstance(doc, dict) and isinstance(doc.get("profile"), dict):
        conv = {k: v for k, v in doc.items() if k != "profile"}
        conv["profile"] = {"include": "p.yaml"}
        files["p.yaml"] = _flow(_plain(doc["profile"]))
        what = f"{what} (profile included)"
    else:
        conv = doc
    files["s.yaml"] = dump_yaml(_plain(scenario(conv, model)), sort_keys=False).encode()
    argv = ["run", "{dir}/s.yaml", "-q", "--json", "{dir}/o.json"]
    return fam.case("profile", f"{form}: {what}", expect, files, argv, ("o.json",),
                    specials=specials)


EXTRA_FAMILIES.extend([("study", study_case, 1), ("profile", profile_case, 1)])

__all__ = ["profile_case", "study_case"]
