"""Fuzz families for every input simfed and realrun read besides scenarios: result files of
`simfed plot` / `simfed figures`, Chrome and realrun traces and bench summaries for
`simfed calibrate`, published-measurement folders for `simfed validate --published`, `realrun
converge`'s options, and the output path of every command that writes a file.

Each family builds a valid base once (a small run, sweep, trace, ...), then mutates it: one
value at a random place in the file (a wrong type, NaN, Infinity, a negative or huge number, a
long string, deep nesting, a deleted or unknown key) or the whole file (cut short, empty,
binary, UTF-16, nested 100,000 deep, a list or a number at the top level). The oracle is the
contract as documented (docs/input-contract.md), written here as tables of the keys each reader
checks (`Rule`): a mutation that breaks a rule is INVALID (it must be refused: exit 2, one
line), a mutation elsewhere is EITHER (it may run or be refused, but never crash, hang, write
invalid JSON or replace what an output path names); the unmutated base is VALID.

`FAMILIES` lists them (name, maker, weight); `EXTRA_FAMILIES` is the hook for more: append
(name, maker, weight), where maker(gen) -> Case takes the `Families` object (its rng, `case()`
and the mutation helpers below). The convergence study and profile kinds are there
(tests/fuzz/convergence.py).
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from simfed.spec.yamlio import dump_yaml

from .cases import EITHER, INVALID, ROOT, SCENARIOS, VALID, Case

CPU4 = str(SCENARIOS / "cpu4.yaml")
TINY = str(ROOT / "tests" / "fixtures" / "tiny2x2.yaml")
IS_ROOT = os.geteuid() == 0
MAX_DEPTH = 64  # spec.jsonio.MAX_JSON_DEPTH, as documented


# ---------------------------------------------------------------------------------------------
# mutations of a JSON document


class Raw(str):
    """A JSON token written as it is (NaN, Infinity: not strict JSON)."""


DELETE, UNKNOWN = object(), object()
DEEP = "deep"  # a value nested 100 deep

VALUES: list[tuple[str, Any]] = [
    ("a string", "x"), ("a numeric string", "12"), ("10,000 characters", "x" * 10_000),
    ("a list", [1, 2]), ("a mapping", {"k": 1}), ("true", True), ("null", None), ("0", 0),
    ("-1", -1), ("-0.5", -0.5), ("1.5", 1.5), ("1e308", 1e308), ("10**30", 10**30),
    ("1e-300", 1e-300), ("NaN", Raw("NaN")), ("Infinity", Raw("Infinity")),
    ("-Infinity", Raw("-Infinity")), ("nested 100 deep", DEEP), ("deleted", DELETE),
    ("an unknown sibling key", UNKNOWN),
]


def dumps(data: Any) -> bytes:
    """JSON with Raw tokens and DEEP values written as they are."""
    raws: list[str] = []

    def walk(x: Any) -> Any:
        if isinstance(x, Raw) or x is DEEP:
            raws.append("[" * 100 + "]" * 100 if x is DEEP else str(x))
            return f"__raw_{len(raws) - 1}__"
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        return x

    text = json.dumps(walk(data))
    for i, r in enumerate(raws):
        text = text.replace(f'"__raw_{i}__"', r, 1)
    return text.encode()


def paths(data: Any, prefix: tuple = (), limit: int = 8) -> list[tuple]:
    """Every place in `data` (at most `limit` items of a list)."""
    out = []
    if isinstance(data, dict):
        for k, v in data.items():
            out.append((*prefix, k))
            out += paths(v, (*prefix, k), limit)
    elif isinstance(data, list):
        for i, v in enumerate(data[:limit]):
            out.append((*prefix, i))
            out += paths(v, (*prefix, i), limit)
    return out


def dotted(path: tuple) -> str:
    """("algorithms", 0, "name") -> "algorithms[*].name" (the rules' spelling)."""
    out = ""
    for p in path:
        out += "[*]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def apply(data: Any, path: tuple, value: Any) -> Any:
    data = copy.deepcopy(data)
    parent = data
    for p in path[:-1]:
        parent = parent[p]
    last = path[-1]
    if value is DELETE:
        del parent[last]
    elif value is UNKNOWN:
        if isinstance(parent, dict):
            parent["bogus_key"] = 1
        else:
            parent.append({"bogus_key": 1})
    else:
        parent[last] = value
    return data


@dataclass(frozen=True)
class Rule:
    """A key a reader checks: its type (num, int, str, enum, dict, list, bool) and range."""

    kind: str
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False  # lo itself refused
    required: bool = True
    nullable: bool = False
    choices: tuple = ()
    strict: bool = True  # a string or bool is not a number (pydantic strict)


def breaks(rule: Rule, value: Any) -> bool | None:
    """Whether `value` in place of a key with `rule` is invalid (None: not known)."""
    if value is DELETE:
        return rule.required
    if value is DEEP:
        return True
    if isinstance(value, Raw):
        return True  # NaN/Infinity: not strict JSON, or not a finite number
    if value is None:
        return not rule.nullable
    k = rule.kind
    if k in ("num", "int"):
        if isinstance(value, bool):
            return True if rule.strict else None
        if isinstance(value, str):
            return True if rule.strict else (None if _numeric(value) else True)
        if not isinstance(value, (int, float)):
            return True
        if k == "int" and isinstance(value, float) and not value.is_integer():
            return True if rule.strict else None
        if rule.lo is not None and (value < rule.lo or (rule.lo_open and value == rule.lo)):
            return True
        return rule.hi is not None and value > rule.hi
    if k == "str":
        return not isinstance(value, str)
    if k == "enum":
        return value not in rule.choices
    if k == "dict":
        return not isinstance(value, dict)
    if k == "dict|str":
        return not isinstance(value, (dict, str))
    if k == "list":
        return not isinstance(value, list) or (rule.lo is not None and len(value) < rule.lo)
    if k == "bool":
        return not isinstance(value, bool)
    return None


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def expectation(rules: dict[str, Rule], path: tuple, value: Any, *, strict_json: bool,
                forbid_extra: tuple[str, ...] = ()) -> str:
    """INVALID when the mutation breaks a rule (or the reader's limits), else EITHER."""
    if value is DEEP and len(path) + 100 > MAX_DEPTH:
        return INVALID
    if isinstance(value, Raw) and strict_json:
        return INVALID
    if value is UNKNOWN:
        parent = dotted(path[:-1]) if isinstance(path[-1], str) else dotted(path)
        return INVALID if parent in forbid_extra else EITHER
    rule = rules.get(dotted(path))
    if rule is None or (value is DELETE and isinstance(path[-1], int)):
        return EITHER  # (a list item deleted: the list's own rule decides)
    return INVALID if breaks(rule, value) else EITHER


WHOLE_FILE: list[tuple[str, Callable[[bytes], bytes]]] = [
    ("cut short", lambda b: b[: max(1, len(b) // 2)]),
    ("empty", lambda b: b""),
    ("binary", lambda b: bytes(range(256)) * 4),
    ("UTF-16", lambda b: b.decode().encode("utf-16")),
    ("nested 100,000 deep", lambda b: b"[" * 100_000 + b"]" * 100_000),
    ("a list at the top level", lambda b: b"[1, 2, 3]"),
    ("a number at the top level", lambda b: b"42"),
    ("a NUL byte", lambda b: b[:10] + b"\x00" + b[10:]),
]
WHOLE_NAMES = {name for name, _ in WHOLE_FILE}


# ---------------------------------------------------------------------------------------------
# the bases (each built once per process)


@functools.cache
def run_results() -> dict[str, Any]:
    from simfed.engine import simulate
    from simfed.spec import load_scenario

    out, _ = simulate(load_scenario(CPU4, {"training.steps": 2}))
    return json.loads(json.dumps(out))


@functools.cache
def sweep_results() -> dict[str, Any]:
    from simfed.sweep import Axis, SweepSpec, run_sweep

    spec = SweepSpec(scenario=CPU4, name="s", axes=(
        Axis(keys=("training.steps",), values=((2,), (3,))),
        Axis(keys=("cluster.nodes",), values=((1,), (2,)))))
    res = run_sweep(spec, jobs=1, progress=False)
    return json.loads(json.dumps({"sweep": res.meta, "rows": res.rows}))


def validate_results() -> dict[str, Any]:
    phases = {"forward": 0.2, "backward": 0.4, "optimizer": 0.05, "aggregation": 0.0}
    return {"runs": [{"name": f"r{i}", "algorithm": a, "split": "fit", "baseline": False,
                      "predicted_step_time_s": 0.7 + 0.1 * i, "measured_step_time_s": 0.75,
                      "predicted_phases_s": phases, "measured_phases_s": phases}
                     for i, a in enumerate(("fsdp", "fl_fsdp"))],
            "speedups": [{"name": "fl_fsdp over fsdp", "predicted": 1.1, "measured": 1.05}]}


def summary() -> dict[str, Any]:
    return {"algorithm": "fsdp", "world_size": 4, "step_times_s": [0.5, 0.4, 0.41, 0.4],
            "train_loss": [5.5, 5.4, 5.3, 5.2],
            "train_perplexity": [math.exp(x) for x in (5.5, 5.4, 5.3, 5.2)],
            "eval_perplexity": 180.0, "untrained_eval_perplexity": 250.0}


@functools.cache
def study() -> dict[str, Any]:
    data = json.loads((ROOT / "results" / "convergence" / "synthetic-tiny.json").read_text())
    lr = data["recipe"]["paper_lr"]
    runs = [r for r in data["runs"] if math.isclose(r["lr"], lr) and r["seed"] == 0][:12]
    for r in runs:  # the untrained point and the last two (evaluation steps start at 0)
        r["eval_loss"] = [r["eval_loss"][0], *r["eval_loss"][-2:]]
        r["eval_steps"] = [r["eval_steps"][0], *r["eval_steps"][-2:]]
        r["train_loss"], r["noise"] = r["train_loss"][-3:], []
    return {**data, "runs": runs}


NCCL_EVENT = {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL", "ts": 10.0,
              "dur": 250.0, "pid": 0, "tid": 7,
              "args": {"Collective name": "_allgather_base", "In msg nelems": 1024,
                       "Out msg nelems": 4096, "dtype": "BFloat16", "Group size": 2,
                       "Process Group Ranks": "[0, 1]"}}


def chrome_trace() -> dict[str, Any]:
    events = []
    for i, n in enumerate((1024, 65536, 1048576, 4194304)):
        for j, ranks in enumerate(([0, 1], [2, 3])):
            e = copy.deepcopy(NCCL_EVENT)
            e["ts"] = 10.0 + 1000.0 * (2 * i + j)
            e["dur"] = 30.0 + n / 5000.0
            e["args"]["In msg nelems"], e["args"]["Out msg nelems"] = n, 2 * n
            e["args"]["Process Group Ranks"] = json.dumps(ranks)
            events.append(e)
    return {"traceEvents": events, "deviceProperties": [{"id": 0, "name": "cpu-rank"}]}


TRACE_HEAD = {"schema": "simfed-trace", "version": 1,
              "meta": {"world_size": 4, "backend": "gloo", "rank": 0}}


def realrun_trace() -> list[dict[str, Any]]:
    spans = []
    for i, n in enumerate((65536, 1048576, 8388608)):
        for op, group, ranks in (("all_gather", "shard", [0, 1]), ("all_reduce", "replicate",
                                                                   [0, 2])):
            spans.append({"name": op, "cat": "comm", "rank": 0, "step": i, "start_s": 1.0 + i,
                          "dur_s": 1e-4 + n / 1e9, "nbytes": n, "group": group,
                          "attrs": {"ranks": ranks}})
    return [TRACE_HEAD, *spans]


def bench_summary() -> dict[str, Any]:
    rows = []
    for group, size in (("intra", 2), ("inter", 2)):
        for op in ("all_gather", "all_reduce"):
            for n in (65_536, 1_048_576, 8_388_608):
                rows.append({"op": op, "group": group, "group_size": size, "nodes": 2,
                             "concurrent_groups": 1, "nbytes": n,
                             "time_s": 5e-5 + n / (1e9 if group == "intra" else 2e8)})
    meta = {"nodes": 2, "ranks_per_node": 2, "world_size": 4, "backend": "gloo",
            "link_rate_Gbps": 1.0, "network": "testbed", "cores": 1, "host_cores": 2,
            "impl": {"reduce_scatter": "gloo_allreduce"}, "overlap": "none"}
    return {"meta": meta, "comm": rows}


@functools.cache
def published_scenario() -> bytes:
    from simfed.spec.loader import load_scenario_data

    data = load_scenario_data(CPU4)
    data["training"]["steps"] = 2
    return dump_yaml(data).encode()


def published_files() -> dict[str, Any]:
    src = {"repo": "example/published", "file": "README.md"}
    return {
        "cases.yaml": {"cases": [
            {"name": "a", "scenario": "s.yaml", "set": "fit", "gpus": 4,
             "published_tokens_per_s_per_gpu": 20000, "source": src},
            {"name": "b", "scenario": "s.yaml", "set": "check", "gpus": 4,
             "published_tokens_per_s_per_gpu": 25000, "source": src,
             "overrides": {"training.micro_batch": 2}}]},
        "speedups.yaml": {"cases": [
            {"name": "s", "scenario": "s.yaml", "baseline": {},
             "variant": {"training.micro_batch": 2},
             "published": {"baseline": 100, "variant": 150}, "source": src}]},
        "collectives.yaml": {"tables": [], "cases": []},
    }


# ---------------------------------------------------------------------------------------------
# the contract of each file kind (docs/input-contract.md), as the oracle

SECONDS = Rule("num", 0, 1e7)
POS_SECONDS = Rule("num", 0, 1e7, lo_open=True)
OPT = {"required": False, "nullable": True}

RUN_RULES = {
    "scenario": Rule("str"), "cluster": Rule("dict"), "model": Rule("dict", required=False),
    "cluster.world": Rule("int", 1, 2**53, **OPT), "cluster.gpu": Rule("str", required=False),
    "cluster.name": Rule("str", required=False), "model.name": Rule("str", required=False),
    "algorithms": Rule("list", lo=1), "algorithms[*]": Rule("dict"),
    "algorithms[*].name": Rule("str"), "algorithms[*].label": Rule("str"),
    "algorithms[*].step_time_s": POS_SECONDS, "algorithms[*].phases_s": Rule("dict"),
    **{f"algorithms[*].phases_s.{p}": Rule("num", 0, 1e7, required=False)
       for p in ("forward", "backward", "optimizer", "aggregation", "other")},
    "algorithms[*].compute_s": SECONDS, "algorithms[*].exposed_comm_s": SECONDS,
    "algorithms[*].debug_checks_s": Rule("num", 0, 1e7, required=False),
    "algorithms[*].speedup": Rule("num", 0, 1e30, lo_open=True, **OPT),
    "algorithms[*].tokens_per_s": Rule("num", 0, 1e30, **OPT),
}
SWEEP_RULES = {
    "sweep": Rule("dict", required=False), "rows": Rule("list"), "rows[*]": Rule("dict"),
    "rows[*].point": Rule("int", 0, 2**53), "rows[*].params": Rule("dict"),
    "rows[*].status": Rule("enum", choices=("ok", "invalid", "does_not_fit", "error"),
                           required=False),
    **{f"rows[*].{k}": Rule("str", **OPT) for k in ("name", "label", "baseline")},
    "rows[*].cluster": Rule("dict", **OPT), "rows[*].cluster.world": Rule("int", 1, 2**53, **OPT),
    "rows[*].cluster.gpu": Rule("str", required=False),
    "rows[*].cluster.name": Rule("str", required=False),
    "rows[*].step_time_s": Rule("num", 0, 1e7, lo_open=True, **OPT),
    **{f"rows[*].{k}": Rule("num", 0, 1e30, **OPT)
       for k in ("tokens_per_s", "tokens_per_s_per_gpu", "mfu")},
    "rows[*].speedup": Rule("num", 0, 1e30, lo_open=True, **OPT),
}
SUMMARY_RULES = {  # realrun summary.json as the perplexity figure reads it (NaN losses drawn)
    "step_times_s": Rule("list", required=False, nullable=True),
    "step_times_s[*]": Rule("num", 0, 1e7),
    "train_loss": Rule("list", required=False, nullable=True),
    "train_perplexity": Rule("list", required=False, nullable=True),
}
LENIENT = {"strict": False}
# the figures read a study through its schema (simfed/spec/study.py, pydantic's lax mode: "12"
# and true are numbers, 2.0 a count, as realrun writes its noise steps) and then for the
# FL-grid figure's fields; the study kind (tests/fuzz/convergence.py) walks every key
STUDY_RULES = {
    "recipe": Rule("dict"), "recipe.paper_lr": Rule("num", 0, 1e30, lo_open=True, **LENIENT),
    "ranks_per_group": Rule("int", 1, 2**20, required=False, **LENIENT),  # default 1
    "micro_batch": Rule("int", 1, 2**20, required=False, **LENIENT),
    "runs": Rule("list"), "runs[*]": Rule("dict"), "runs[*].algorithm": Rule("str"),
    "runs[*].lr": Rule("num", 0, 1e30, lo_open=True, **LENIENT),
    "runs[*].groups": Rule("int", 1, 2**53, **LENIENT),
    "runs[*].batch_per_model": Rule("int", 1, 2**53, **LENIENT),
    "runs[*].aggregate_every": Rule("int", 1, 2**53, **OPT, **LENIENT),
    "runs[*].seed": Rule("int", **LENIENT),
    "runs[*].eval_loss": Rule("list", lo=1),
    "runs[*].eval_loss[*]": Rule("num", 0, 1e30, **LENIENT),
}
CHROME_RULES = {  # profiler.check_times and the NCCL kernel checks (samples.read_chrome)
    "traceEvents": Rule("list"),
    "traceEvents[*].ts": Rule("num", -1e17, 1e17, required=False, **LENIENT),
    "traceEvents[*].dur": Rule("num", 0, 1e13, required=False, **LENIENT),
    "traceEvents[*].args.In msg nelems": Rule("int", 0, 2**50, required=False, **LENIENT),
    "traceEvents[*].args.Out msg nelems": Rule("int", 0, 2**50, required=False, **LENIENT),
    "traceEvents[*].args.Group size": Rule("int", 2, 2**19, required=False, **LENIENT),
}
SPAN_RULES = {  # spec.trace.Span.from_dict and the collective samples (samples.py)
    "rank": Rule("int", 0, None, **LENIENT), "step": Rule("int", None, None, **LENIENT),
    "start_s": Rule("num", None, None, **LENIENT),
    "dur_s": Rule("num", 0, 1e7, **LENIENT),  # (0: not a sample, skipped)
    "nbytes": Rule("int", 0, 2**50, required=False, **LENIENT),
    "attrs.ranks[*]": Rule("int", 0, 3, **LENIENT),
}
BENCH_RULES = {  # spec.bench: rows typed (unknown keys refused), numbers finite and in range
    "meta": Rule("dict"), "comm": Rule("list"), "comm[*]": Rule("dict"),
    "meta.nodes": Rule("int", 1, 2**19, **OPT, **LENIENT),
    "meta.world_size": Rule("int", 1, 2**19, **OPT, **LENIENT),
    "meta.ranks_per_node": Rule("int", 1, 2**19, **OPT, **LENIENT),
    # 0 or 1e-3 to 1e5 Gb/s (a tiny positive rate is refused where this rule says 'valid')
    "meta.link_rate_Gbps": Rule("num", 0, 1e5, **OPT, **LENIENT),
    "comm[*].op": Rule("str"), "comm[*].group": Rule("str"),
    "comm[*].group_size": Rule("int", 1, 4, **LENIENT),
    "comm[*].nbytes": Rule("int", 1, 2**50, **LENIENT),
    "comm[*].time_s": Rule("num", 1e-9, 1e7, **LENIENT),
    "comm[*].concurrent_groups": Rule("int", 1, 2**19, required=False, **LENIENT),
    "comm[*].nodes": Rule("int", 1, 2**19, required=False, nullable=True, **LENIENT),
}
PUBLISHED_RULES = {  # calibration.published_files (entries typed, unknown keys refused)
    "cases": Rule("list", required=False, nullable=True), "cases[*]": Rule("dict"),
    "cases[*].name": Rule("str"), "cases[*].scenario": Rule("str"),
    "cases[*].set": Rule("enum", choices=("fit", "check")),
    "cases[*].published_tokens_per_s_per_gpu": Rule("num", 0, None, lo_open=True,
                                                    strict=False),
    "cases[*].gpus": Rule("int", 1, None, **OPT, strict=False),
    "cases[*].source": Rule("dict|str"),
    "cases[*].baseline": Rule("dict"), "cases[*].variant": Rule("dict"),
    "cases[*].published": Rule("dict"),
    "cases[*].published.baseline": Rule("num", 0, None, lo_open=True, strict=False),
    "cases[*].published.variant": Rule("num", 0, None, lo_open=True, strict=False),
}


# ---------------------------------------------------------------------------------------------
# the families


class Families:
    """Case makers for the inputs beyond scenarios; `gen` is the scenario Generator (its rng and
    case numbering are shared)."""

    def __init__(self, gen: Any):
        self.gen = gen
        self.rng = gen.rng

    def case(self, kind: str, what: str, expect: str, files: dict[str, bytes], argv: list[str],
             outputs: tuple[str, ...] = (), prog: str = "simfed",
             specials: dict[str, str] | None = None) -> Case:
        self.gen.n += 1
        return Case(self.gen.n, kind, what, expect, files, argv, outputs, prog=prog,
                    specials=specials or {})

    def mutate_json(self, base: Any, rules: dict[str, Rule], *, strict_json: bool = True,
                    forbid_extra: tuple[str, ...] = ()) -> tuple[str, bytes, str]:
        """(what, the file's bytes, expectation): the base, one value mutated, or the whole
        file damaged."""
        r = self.rng.random()
        if r < 0.04:
            return "the base", dumps(base), VALID
        if r < 0.2:
            what, damage = self.rng.choice(WHOLE_FILE)
            return what, damage(dumps(base)), INVALID
        # half the mutations at a key the reader checks, half anywhere
        every = paths(base)
        checked = [p for p in every if dotted(p) in rules]
        path = self.rng.choice(checked if checked and self.rng.random() < 0.5 else every)
        label, value = self.rng.choice(VALUES)
        expect = expectation(rules, path, value, strict_json=strict_json,
                             forbid_extra=forbid_extra)
        return (f"{dotted(path)} {label}", dumps(apply(base, path, value)), expect)

    # -- result files for plot and figures
    def results_case(self) -> Case:
        pick = self.rng.choice(["run", "sweep", "sweep-heatmap", "validate", "summary",
                                "study"])
        if pick == "run":
            what, body, expect = self.mutate_json(run_results(), RUN_RULES)
            argv = ["plot", "phases", "{dir}/run.json", "--out", "{dir}/o.png"]
            return self.case("results", f"run.json: {what}", expect, {"run.json": body}, argv,
                             ("o.png",))
        if pick.startswith("sweep"):
            what, body, expect = self.mutate_json(sweep_results(), SWEEP_RULES)
            kind = "heatmap" if pick == "sweep-heatmap" else "scaling"
            expect = EITHER if expect == VALID and kind == "heatmap" else expect
            argv = ["plot", kind, "{dir}/sw.json", "--out", "{dir}/o.png"]
            return self.case("results", f"sweep ({kind}): {what}", expect, {"sw.json": body},
                             argv, ("o.png",))
        if pick == "validate":  # read leniently (every field optional): only the file
            what, body, expect = self.mutate_json(validate_results(), {})
            argv = ["plot", "validation", "{dir}/v.json", "--out", "{dir}/o.png"]
            return self.case("results", f"validate.json: {what}", expect, {"v.json": body},
                             argv, ("o.png",))
        if pick == "summary":
            what, body, expect = self.mutate_json(summary(), SUMMARY_RULES, strict_json=False)
            argv = ["plot", "perplexity", "{dir}/summary.json", "--out", "{dir}/o.png"]
            return self.case("results", f"summary.json: {what}", expect,
                             {"summary.json": body}, argv, ("o.png",))
        what, body, expect = self.mutate_json(study(), STUDY_RULES)
        argv = ["figures", "--scenario", CPU4, "--out", "{dir}/figs", "--results", "{dir}/res",
                "--only", "convergence", "-q"]
        return self.case("results", f"study: {what}", expect,
                         {"res/convergence/s.json": body}, argv, ("figs",))

    # -- traces and bench summaries for calibrate
    def trace_case(self) -> Case:
        out = ("p.yaml", "p.json")
        argv = ["calibrate", "{dir}/IN", "--scenario", TINY, "--out", "{dir}/p.yaml"]
        if self.rng.random() < 0.5:
            what, body, expect = self.mutate_json(chrome_trace(), CHROME_RULES,
                                                  strict_json=False)
            argv[1] = "{dir}/t.json"
            return self.case("trace", f"Chrome trace: {what}", expect, {"t.json": body}, argv,
                             out)
        lines = realrun_trace()
        # the header or a span before the last (a last line that does not parse is skipped
        # by design: a trace torn by a crash)
        i = self.rng.randrange(len(lines) - 1)
        if i == 0:
            what, body, expect = self.mutate_json(lines[0], {"schema": Rule("enum", choices=(
                "simfed-trace",)), "meta": Rule("dict", required=False, nullable=True),
                "meta.world_size": Rule("int", 1, 2**19, required=False, nullable=True,
                                        strict=False)}, strict_json=False)
            text = body + b"\n" + b"\n".join(dumps(s) for s in lines[1:]) + b"\n"
            what = f"header: {what}"
        else:
            what, body, expect = self.mutate_json(lines[i], SPAN_RULES, strict_json=False)
            text = b"\n".join(dumps(s) for s in lines[:i]) + b"\n" + body.replace(b"\n", b" ") \
                + b"\n" + b"\n".join(dumps(s) for s in lines[i + 1:]) + b"\n"
            what = f"span {i}: {what}"
        if "empty" in what:
            expect = EITHER  # an empty line is skipped
        argv[1] = "{dir}/trace_rank0.jsonl"
        return self.case("trace", f"realrun trace: {what}", expect,
                         {"trace_rank0.jsonl": text}, argv, out)

    def bench_case(self) -> Case:
        what, body, expect = self.mutate_json(bench_summary(), BENCH_RULES, strict_json=False,
                                              forbid_extra=("comm[*]",))
        argv = ["calibrate", "{dir}/b", "--scenario", TINY, "--out", "{dir}/p.yaml"]
        return self.case("bench", f"bench-summary.json: {what}", expect,
                         {"b/bench-summary.json": body}, argv, ("p.yaml", "p.json"))

    # -- published folders
    def published_case(self) -> Case:
        files = published_files()
        name = self.rng.choice(sorted(files))
        what, body, expect = self.mutate_json(files[name], PUBLISHED_RULES, strict_json=False,
                                              forbid_extra=("cases[*]", "cases[*].published"))
        text = body  # a damaged file as it is; else as YAML (NaN: .nan, a number in YAML)
        if what not in WHOLE_NAMES:
            text = dump_yaml(json.loads(body)).encode()
        if what == "empty":
            expect = EITHER  # an empty file is a folder without entries of that kind
        folder = {f"pub/{n}": (text if n == name else dump_yaml(v).encode())
                  for n, v in files.items()}
        folder["pub/s.yaml"] = published_scenario()
        argv = ["validate", "--published", "{dir}/pub", "--json", "{dir}/out.json"]
        return self.case("published", f"{name}: {what}", expect, folder, argv, ("out.json",))

    # -- realrun converge's options
    def converge_case(self) -> Case:
        small = ["--set", "training.steps=1", "--set", "training.eval_sequences=4"]
        choices: list[tuple[str, list[str], str]] = [
            ("a tiny valid run", ["-a", "fsdp", *small], VALID),
            ("--seeds 1,x", ["--seeds", "1,x"], INVALID),
            ("--seeds -1", ["--seeds", "-1"], INVALID),
            ("--seeds 2**70", ["--seeds", str(2**70)], INVALID),
            ("--seeds ''", ["--seeds", ","], INVALID),
            ("--eval-every -1", ["--eval-every", "-1"], INVALID),
            ("--eval-every abc", ["--eval-every", "abc"], INVALID),
            ("--algorithm bogus", ["-a", "bogus"], INVALID),
            ("--algorithm ''", ["-a", ""], INVALID),
            ("--algorithm 'fsdp,'", ["-a", "fsdp,"], INVALID),
            ("cluster.nodes=100000", ["--set", "cluster.nodes=100000"], INVALID),
            ("training.steps=10**9", ["--set", "training.steps=1000000000"], INVALID),
            ("model.layers=256, hidden 2**20", ["--set", "model.layers=256", "--set",
                                                "model.hidden=1048576"], INVALID),
            ("training.seq_len=2**24", ["--set", "training.seq_len=16777216"], INVALID),
            ("negative betas", ["--set", "training.betas=[-0.1,0.9]"], INVALID),
            ("betas 1", ["--set", "training.betas=[0.9,1.0]"], INVALID),
            ("fsdp_version true", ["--set", "training.fsdp_version=true"], INVALID),
            ("an unknown key", ["--set", "training.bogus=1"], INVALID),
            ("lr NaN", ["--set", "training.lr=.nan"], INVALID),
            ("a 10,000-character label", ["--set", "algorithms.0.label=" + "x" * 10_000],
             INVALID),
            ("--json under a file", ["-a", "fsdp", *small, "--json", "{dir}/blocker/c.json"],
             INVALID),
            ("--json a folder", ["-a", "fsdp", *small, "--json", "{dir}"], INVALID),
            ("--json ''", ["--json", ""], INVALID),
            ("scenario /dev/zero", None, INVALID),
            ("scenario missing", None, INVALID),
        ]
        what, extra, expect = self.rng.choice(choices)
        scenario = {"scenario /dev/zero": "/dev/zero",
                    "scenario missing": "{dir}/none.yaml"}.get(what, CPU4)
        argv = ["converge", scenario, *(extra or [])]
        return self.case("converge", what, expect, {"blocker": b"x"}, argv, ("c.json",),
                         prog="realrun")

    # -- output paths of every command that writes a file
    OUTPUT_COMMANDS: tuple[tuple[str, str, list[str]], ...] = (
        ("run --json", "simfed", ["run", CPU4, "-q", "--set", "training.steps=2", "--json",
                                  "{out}"]),
        ("sweep --json", "simfed", ["sweep", CPU4, "--vary", "training.steps=2,3", "-q",
                                    "--jobs", "1", "--json", "{out}", "--csv",
                                    "{dir}/sw.csv"]),
        ("sweep --csv", "simfed", ["sweep", CPU4, "--vary", "training.steps=2,3", "-q",
                                   "--jobs", "1", "--csv", "{out}", "--json", "{dir}/sw.json"]),
        ("calibrate --out", "simfed", ["calibrate", "{dir}/b", "--scenario", TINY, "--out",
                                       "{out}", "--report", "{dir}/r.json"]),
        ("calibrate --report", "simfed", ["calibrate", "{dir}/b", "--scenario", TINY, "--out",
                                          "{dir}/p.yaml", "--report", "{out}"]),
        ("plot --out", "simfed", ["plot", "phases", "{dir}/run.json", "--out", "{out}.png"]),
        ("validate --published --json", "simfed", ["validate", "--published", "{dir}/pub",
                                                   "--json", "{out}"]),
        ("realrun converge --json", "realrun", ["converge", CPU4, "-a", "fsdp", "--set",
                                                "training.steps=1", "--set",
                                                "training.eval_sequences=4", "--json",
                                                "{out}"]),
    )

    def outputs_case(self) -> Case:
        name, prog, template = self.rng.choice(self.OUTPUT_COMMANDS)
        kinds: list[tuple[str, str]] = [  # (what the path names, expectation)
            ("a new path", VALID), ("a new path in new folders", VALID),
            ("an existing regular file", VALID), ("a symlink to a file", VALID),
            ("a dangling symlink", VALID), ("a FIFO without a reader", INVALID),
            ("a folder", INVALID), ("a path under a file", INVALID), ("a socket", INVALID),
            ("a symlink loop", INVALID), ("a path in /proc", INVALID), ("''", INVALID),
        ]  # (a NUL byte cannot reach a command line: the OS passes C strings)
        if IS_ROOT:
            kinds += [("a character device", VALID), ("a symlink to a character device", VALID),
                      ("a block device", INVALID)]
        what, expect = self.rng.choice(kinds)
        png = name == "plot --out"
        files: dict[str, bytes] = {"blocker": b"x", "b/bench-summary.json":
                                   dumps(bench_summary()), "run.json": dumps(run_results())}
        if name.startswith("validate"):
            for n, v in published_files().items():
                files[f"pub/{n}"] = dump_yaml(v).encode()
            files["pub/s.yaml"] = published_scenario()
        specials: dict[str, str] = {}
        out = "o"
        outputs: tuple[str, ...] = ("o.png",) if png else ("o",)
        if what == "a new path in new folders":
            out, outputs = "x/y/o", ("x",)
        elif what == "an existing regular file":
            files["o.png" if png else "o"] = b"old"
        elif what == "a symlink to a file":
            files["target.png" if png else "target"] = b"old"
            specials["o.png" if png else "o"] = "link:target.png" if png else "link:target"
            outputs = ("target.png",) if png else ("target",)
        elif what == "a dangling symlink":
            specials["o.png" if png else "o"] = "link:made.png" if png else "link:made"
            outputs = ("made.png", "o.png") if png else ("made", "o")  # (the link resolves)
        elif what in ("a FIFO without a reader", "a socket", "a character device",
                      "a block device", "a symlink loop"):
            kind = {"a FIFO without a reader": "fifo", "a socket": "sock",
                    "a character device": "chr", "a block device": "blk",
                    "a symlink loop": "loop"}[what]
            specials["o.png" if png else "o"] = kind
        elif what == "a symlink to a character device":
            specials["null"] = "chr"
            specials["o.png" if png else "o"] = "link:null"
        elif what == "a folder":
            files["o/x" if not png else "o.png/x"] = b"x"
        elif what == "a path under a file":
            out = "blocker/o"
        path = {"a path in /proc": "/proc/simfed-fuzz-out", "''": ""}.get(what, "{dir}/" + out)
        argv = []
        for a in template:
            if a in ("{out}", "{out}.png"):
                a = path + (".png" if png and path.startswith("{dir}") else "")
            argv.append(a)
        return self.case("outputs", f"{name}: {what}", expect, files, argv,
                         (*outputs, "sw.csv", "sw.json", "r.json", "p.yaml", "p.json"),
                         prog=prog, specials=specials)


FAMILIES: list[tuple[str, Callable[[Families], Case], int]] = [
    ("results", Families.results_case, 1),
    ("trace", Families.trace_case, 1),
    ("bench", Families.bench_case, 1),
    ("published", Families.published_case, 1),
    ("converge", Families.converge_case, 1),
    ("outputs", Families.outputs_case, 1),
]

# More families: append (name, maker, weight); maker(families: Families) -> Case (see
# docs/testing.md). tests/fuzz/convergence.py appends the study and profile kinds when imported.
EXTRA_FAMILIES: list[tuple[str, Callable[[Families], Case], int]] = []


def all_families() -> list[tuple[str, Callable[[Families], Case], int]]:
    from . import convergence  # noqa: F401 - appends its kinds to EXTRA_FAMILIES

    return FAMILIES + EXTRA_FAMILIES
