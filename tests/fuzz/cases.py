"""Seeded generation of fuzz cases for simfed's input contract.

A case is a folder of files and a `simfed` command line, with what the contract expects of it:

- VALID: it must run (exit 0) and write strict JSON;
- INVALID: it must be refused: exit 2 and one error line (never exit 0);
- EITHER: either is fine (a value the schema allows but another rule may refuse).

Whatever the expectation, it must never crash (a traceback or an internal error), hang (over the
time limit) or write invalid JSON or a file outside the folders named on the command line.

Cases come from the shipped scenarios (shrunk to a few steps so that a valid case runs in a
fraction of a second), mutated at every scenario key found by walking the schema
(`simfed.spec.scenario.Scenario`): a wrong type, a negative number, zero, NaN, +-inf, huge and
tiny numbers, the key's limit and over it, a bad choice, null, missing and an unknown sibling;
plus YAML pathologies (duplicate keys, alias bombs, deep nesting, self-referencing aliases, bad
syntax, wrong top level), encodings (UTF-16, Latin-1, binary, a BOM), include pathologies
(cycles, fan-out, /dev/zero, missing files, folders, deep chains) and command-line options.
The oracle for INVALID is the contract as documented: the schema's bounds and choices
(`param(...)`), `simfed.spec.limits`, and the rules of the issue (labels are names, ...).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import random
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union, get_args, get_origin

from simfed.spec import limits
from simfed.spec.loader import load_scenario_data
from simfed.spec.scenario import Scenario
from simfed.spec.yamlio import dump_yaml

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"

VALID, INVALID, EITHER = "valid", "invalid", "either"
OUTSIDE = "simfed-fuzz-outside"  # /tmp/<this>...: a label that tries to write there

# the shipped scenarios, shrunk so a valid case simulates in well under a second
BASES: dict[str, dict[str, Any]] = {
    "cpu4": {"training.steps": 6},
    "512gpu": {"training.steps": 4, "cluster.nodes": 16},
    "h100-1024": {"training.steps": 4, "cluster.nodes": 8},
    "testbed-tiny": {"training.steps": 4},
    "testbed": {"training.steps": 4},
    "2048gpu": {"training.steps": 4, "cluster.nodes": 8},
}


@dataclass
class Case:
    id: int
    kind: str  # family: key, yaml, encoding, include, cli
    what: str  # one line: the mutation
    expect: str
    files: dict[str, bytes] = field(default_factory=dict)  # relative path -> content
    argv: list[str] = field(default_factory=list)  # after `simfed`; {dir} is the case folder
    outputs: tuple[str, ...] = ()  # output paths/folders named on the command line (relative)
    prog: str = "simfed"  # or realrun
    # relative path -> what the runner makes there: chr (a character device like /dev/null;
    # root only), blk, fifo, sock, loop (a symlink to itself), link:TARGET; each must still be
    # what it was after the case (an output path never replaces what it names)
    specials: dict[str, str] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# the schema's keys


@dataclass(frozen=True)
class Key:
    path: tuple[str | int, ...]
    kind: str  # int, float, str, bool, choice, union, tuple, dict, spec
    meta: dict[str, Any]
    required: bool
    optional_none: bool  # its default is None

    @property
    def dotted(self) -> str:
        out = ""
        for p in self.path:
            out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
        return out

    @property
    def name(self) -> str:
        return next(p for p in reversed(self.path) if isinstance(p, str))


def _kind(tp: Any, meta: dict[str, Any]) -> str:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        return _kind(args[0], meta) if len(args) == 1 else "union"
    if tp is bool:
        return "bool"
    if tp is int:
        return "int"
    if tp is float:
        return "float"
    if tp is str:
        return "choice" if meta.get("choices") else "str"
    if origin is tuple:
        return "tuple"
    if origin is dict or tp is dict:
        return "dict"
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return "spec"
    return "other"


def schema_keys(cls: type = Scenario, data: Any = None,
                prefix: tuple[str | int, ...] = ()) -> list[Key]:
    """Every key of the schema under `cls` (list items: those present in `data`, else the
    first item of a list of specs)."""
    keys: list[Key] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = hints[f.name]
        meta = dict(f.metadata)
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        kind = _kind(tp, meta)
        path = (*prefix, f.name)
        keys.append(Key(path, kind, meta, required, f.default is None))
        sub = data.get(f.name) if isinstance(data, dict) else None
        if kind == "spec":
            keys += schema_keys(tp, sub, path)
        elif kind == "tuple":
            args = get_args(tp)
            item = args[0] if args else None
            if isinstance(item, type) and dataclasses.is_dataclass(item):
                n = max(1, len(sub)) if isinstance(sub, list) else 1
                for i in range(min(n, 4)):
                    keys += schema_keys(item, sub[i] if isinstance(sub, list) and i < len(sub)
                                        else None, (*path, i))
    return keys


# ---------------------------------------------------------------------------------------------
# mutations of one key


def _set(data: dict, path: tuple[str | int, ...], value: Any) -> None:
    cur: Any = data
    for p in path[:-1]:
        if isinstance(p, int):
            while len(cur) <= p:
                cur.append({"name": "fsdp"} if path[0] == "algorithms" else {})
            cur = cur[p]
        else:
            if not isinstance(cur.get(p), (dict, list)):
                cur[p] = [] if isinstance(path[path.index(p) + 1], int) else {}
            cur = cur[p]
    last = path[-1]
    if isinstance(last, int):
        while len(cur) <= last:
            cur.append({})
        cur[last] = value
    else:
        cur[last] = value


def _delete(data: dict, path: tuple[str | int, ...]) -> bool:
    cur: Any = data
    for p in path[:-1]:
        try:
            cur = cur[p]
        except (KeyError, IndexError, TypeError):
            return False
    if isinstance(cur, dict) and path[-1] in cur:
        del cur[path[-1]]
        return True
    return False


def _limit(key: Key) -> float | None:
    """The largest value the contract allows for a number key (None: unbounded but MAX_*)."""
    his = [r.hi for pat, r in limits.UNIT_RANGES if re.search(pat, key.name)]
    plain = re.sub(r"\[\d+\]", "", key.dotted)
    if plain in limits.PATH_LIMITS:
        his.append(limits.PATH_LIMITS[plain].hi)
    if key.meta.get("le") is not None:
        his.append(key.meta["le"])
    return min(his) if his else None


def _below_lower(key: Key, v: float) -> bool:
    """Whether `v` breaks the key's declared lower bound (ge/gt) or its unit range."""
    ge, gt = key.meta.get("ge"), key.meta.get("gt")
    if ge is not None and v < ge:
        return True
    if gt is not None and v <= gt:
        return True
    return limits.check(key.dotted, key.name, v) is not None


WRONG_TYPES = {
    "int": ["abc", [1, 2], {"a": 1}, True, 1.5],
    "float": ["abc", [1.0], {"a": 1}, True, "1e3"],
    "str": [123, [1], {"a": 1}, 1.5],
    "choice": [123, [1], {"a": 1}],
    "bool": ["abc", 1, [True], 0.0],
    "tuple": ["abc", 123, {"a": 1}],
    "dict": ["abc", 123, [1, 2]],
    "spec": ["abc", 123, [1, 2], True],
}


def key_mutations(key: Key, rng: random.Random) -> list[tuple[str, Any, str]]:
    """(label, value or a marker, expectation) for one key."""
    k = key.kind
    out: list[tuple[str, Any, str]] = []
    for v in WRONG_TYPES.get(k, []):
        out.append((f"type {v!r}", v, INVALID))
    for label, v in (("nan", math.nan), ("inf", math.inf), ("-inf", -math.inf),
                     ("1e308", 1e308), ("-1e308", -1e308), ("10**400", 10**400),
                     ("2**63", 2**63), ("-(2**63)", -(2**63))):
        out.append((label, v, INVALID if k != "other" else EITHER))
    if k in ("int", "float"):
        for label, v in (("zero", 0), ("-1", -1), ("-0.5", -0.5), ("tiny 1e-300", 1e-300),
                         ("5e-324", 5e-324), ("one", 1), ("random", rng.choice([2, 3, 7, 0.25,
                                                                                  0.75, 12.5]))):
            fraction = k == "int" and isinstance(v, float) and not float(v).is_integer()
            if fraction or _below_lower(key, v):
                out.append((label, v, INVALID))
            else:
                out.append((label, v, EITHER))
        hi = _limit(key)
        if hi is not None:
            out.append(("at its limit", int(hi) if k == "int" else hi, EITHER))
            over = int(hi) + 1 if k == "int" else hi * 4
            out.append(("over its limit", over, INVALID))
        else:
            out.append(("2**53 + 1", 2**53 + 1, INVALID))
    if k == "choice":
        out.append(("a bad choice", "bogus_choice", INVALID))
        for c in key.meta["choices"]:
            out.append((f"choice {c}", c, EITHER))
    if k == "str":
        # labels and shape names name files: they must be names (the contract)
        names_a_file = key.name == "label" or bool(
            re.fullmatch(r"validation\.(shapes|fit|check)\[\d+\]\.name", key.dotted))
        bad_name = INVALID if names_a_file else EITHER
        out.append(("empty string", "", INVALID if key.name == "name" and names_a_file
                    else EITHER))
        out.append(("a long string", "x" * 5000, bad_name))
        out.append(("path-like string", "../../etc/passwd", bad_name))
    if k == "bool":
        out.append(("off (bare)", "off", INVALID))
    scalar = k in ("int", "float", "str", "choice", "bool")
    out.append(("null", None, INVALID if scalar and not key.optional_none else EITHER))
    out.append(("missing", _MISSING, INVALID if key.required else EITHER))
    out.append(("unknown sibling key", _UNKNOWN, INVALID))
    if k == "tuple":
        out.append(("empty list", [], EITHER))
    if k in ("spec", "dict"):
        out.append(("empty mapping", {}, EITHER))
    return out


_MISSING = object()
_UNKNOWN = object()


def mutate_key(data: dict, key: Key, value: Any) -> bool:
    """Apply one mutation; False when it does not apply (the key's parent is absent)."""
    if value is _MISSING:
        return _delete(data, key.path)
    if value is _UNKNOWN:
        parent = key.path[:-1]
        cur: Any = data
        for p in parent:
            try:
                cur = cur[p]
            except (KeyError, IndexError, TypeError):
                return False
        if not isinstance(cur, dict):
            return False
        cur["bogus_key_" + str(key.path[-1])] = 1
        return True
    _set(data, key.path, value)
    return True


# ---------------------------------------------------------------------------------------------
# building cases


def _base(name: str) -> dict[str, Any]:
    data = load_scenario_data(SCENARIOS / f"{name}.yaml")
    for dotted, v in BASES[name].items():
        cur = data
        *head, last = dotted.split(".")
        for h in head:
            cur = cur[h]
        cur[last] = v
    return data


def _dump(data: Any) -> bytes:
    return dump_yaml(data, sort_keys=False, allow_unicode=True).encode("utf-8")


def _run_argv(extra: list[str] | None = None) -> list[str]:
    return ["run", "{dir}/s.yaml", "-q", "--json", "{dir}/out/result.json", *(extra or [])]


_OUT = ("out/result.json",)


class Generator:
    """Cases in a fixed order of families, each family's cases drawn from a seeded RNG."""

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)
        self.bases = {n: _base(n) for n in BASES}
        self.keys = {n: schema_keys(Scenario, d) for n, d in self.bases.items()}
        self.n = 0

    def _case(self, kind: str, what: str, expect: str, files: dict[str, bytes],
              argv: list[str] | None = None, outputs: tuple[str, ...] = _OUT) -> Case:
        self.n += 1
        return Case(self.n, kind, what, expect, files, argv or _run_argv(), outputs)

    # -- scenario keys
    def key_case(self) -> Case:
        """One key mutated (two or three keys in a quarter of the cases: invalid if any is)."""
        name = self.rng.choice(list(self.bases))
        data = copy.deepcopy(self.bases[name])
        n = 1 if self.rng.random() < 0.75 else self.rng.choice([2, 3])
        parts, expects = [], []
        chosen: list[Key] = []
        for key in self.rng.sample(self.keys[name], n):
            # distinct keys, none inside another (a later mutation would hide an earlier one)
            if any(key.path[:len(c.path)] == c.path or c.path[:len(key.path)] == key.path
                   for c in chosen):
                continue
            chosen.append(key)
            label, value, expect = self.rng.choice(key_mutations(key, self.rng))
            if not mutate_key(data, key, value):
                continue  # the key's parent is absent: nothing changed
            parts.append(f"{key.dotted} = {label}")
            expects.append(expect)
        if not parts:  # no mutation applied: the base scenario, which is valid
            return self._case("key", f"{name}: unchanged (mutations not applicable)", VALID,
                              {"s.yaml": _dump(data)})
        expect = (INVALID if INVALID in expects else VALID if set(expects) == {VALID}
                  else EITHER)
        return self._case("key", f"{name}: " + "; ".join(parts), expect,
                          {"s.yaml": _dump(data)})

    # -- whole-file YAML pathologies
    def yaml_case(self) -> Case:
        name = self.rng.choice(list(self.bases))
        text = _dump(self.bases[name]).decode()
        choices: list[tuple[str, str, str]] = [
            ("duplicate top-level key", text + "seed: 3\n" if "seed:" in text
             else text + "name: a\nname: b\n", INVALID),
            ("duplicate nested key", text.replace("cluster:\n", "cluster:\n  nodes: 1\n", 1)
             if "\n  nodes:" in text else text + "x: 1\nx: 2\n", INVALID),
            ("alias bomb in description", _bomb() + text, INVALID),
            ("self-referencing alias", "description: &a [1, *a]\n" + text, INVALID),
            ("deep nesting", "description: " + "[" * 500 + "]" * 500 + "\n" + text, INVALID),
            ("deep nesting 10^5", "description: " + "[" * 100000 + "]" * 100000 + "\n" + text,
             INVALID),
            ("empty file", "", INVALID),
            ("only a comment", "# nothing\n", INVALID),
            ("top-level list", "- 1\n- 2\n", INVALID),
            ("top-level scalar", "42\n", INVALID),
            ("bad syntax", text + "\n  : [unclosed\n", INVALID),
            ("tab indentation", text.replace("\n  ", "\n\t", 1), INVALID),
            ("python tag", "description: !!python/object/apply:os.system ['true']\n" + text,
             INVALID),
            ("a binary tag", "description: !!binary aGVsbG8=\n" + text, INVALID),
            ("non-ASCII description (UTF-8)",
             _with_description(text, "caf\u00e9 \u2603 \U0001f600"), VALID),
            ("merge key", "defaults: &d {seed: 1}\n" + text, INVALID),  # unknown key defaults
            ("4300+ digit integer", "seed: " + "1" * 5000 + "\n"
             + "\n".join(ln for ln in text.splitlines() if not ln.startswith("seed:")) + "\n",
             INVALID),
            ("the base scenario", text, VALID),
        ]
        what, content, expect = self.rng.choice(choices)
        return self._case("yaml", f"{name}: {what}", expect, {"s.yaml": content.encode()})

    # -- encodings
    def encoding_case(self) -> Case:
        name = self.rng.choice(list(self.bases))
        text = _with_description(_dump(self.bases[name]).decode(), "caf\u00e9")
        choices: list[tuple[str, bytes, str]] = [
            ("UTF-16 with BOM", text.encode("utf-16"), INVALID),
            ("UTF-16-LE without BOM", text.encode("utf-16-le"), INVALID),
            ("Latin-1", text.encode("latin-1"), INVALID),
            ("UTF-8 with BOM", b"\xef\xbb\xbf" + text.encode(), VALID),
            ("binary garbage", bytes(self.rng.randrange(256) for _ in range(2000)), INVALID),
            ("NUL bytes", text.encode() + b"\x00\x00", INVALID),
            ("truncated UTF-8", text.encode()[:-1] + b"\xc3", INVALID),
            ("UTF-32", text.encode("utf-32"), INVALID),
        ]
        what, content, expect = self.rng.choice(choices)
        return self._case("encoding", f"{name}: {what}", expect, {"s.yaml": content})

    # -- includes
    def include_case(self) -> Case:
        name = self.rng.choice(list(self.bases))
        data = copy.deepcopy(self.bases[name])
        cluster = data.pop("cluster")
        files: dict[str, bytes] = {}
        pick = self.rng.randrange(11)
        expect = INVALID
        if pick == 0:
            what = "include cycle a -> b -> a"
            data["cluster"] = {"include": "a.yaml"}
            files["a.yaml"] = b"include: b.yaml\n"
            files["b.yaml"] = b"include: a.yaml\n"
        elif pick == 1:
            what = "include fan-out 3^12"
            data["cluster"] = {"include": "f0.yaml"}
            for i in range(12):
                files[f"f{i}.yaml"] = "\n".join(
                    f"k{j}: {{include: f{i + 1}.yaml}}" for j in range(3)).encode() + b"\n"
            files["f12.yaml"] = b"z: 1\n"
        elif pick == 2:
            what = "include /dev/zero"
            data["cluster"] = {"include": "/dev/zero"}
        elif pick == 3:
            what = "include a missing file"
            data["cluster"] = {"include": "nope.yaml"}
        elif pick == 4:
            what = "include a folder"
            data["cluster"] = {"include": "sub"}
            files["sub/x.txt"] = b"x"
        elif pick == 5:
            what = "include a list"
            data["cluster"] = {"include": "l.yaml"}
            files["l.yaml"] = b"- 1\n- 2\n"
        elif pick == 6:
            what = "include chain 20 deep"
            data["cluster"] = {"include": "c0.yaml"}
            for i in range(20):
                files[f"c{i}.yaml"] = f"include: c{i + 1}.yaml\n".encode()
            files["c20.yaml"] = _dump(cluster)
        elif pick == 7:
            what = "include Latin-1 file"
            data["cluster"] = {"include": "l1.yaml"}
            files["l1.yaml"] = _dump(dict(cluster, name="caf\u00e9")).decode().encode("latin-1")
        elif pick == 8:
            what = "include self"
            data["cluster"] = {"include": "s.yaml"}
        elif pick == 9:
            what = "include a non-string"
            data["cluster"] = {"include": self.rng.choice([1, [1], {"a": 1}, None, ""])}
        else:
            what = "include a valid file, with an override"
            data["cluster"] = {"include": "c.yaml", "name": "over"}
            files["c.yaml"] = _dump(cluster)
            expect = VALID
        files["s.yaml"] = _dump(data)
        return self._case("include", f"{name}: {what}", expect, files)

    # -- command-line options
    def cli_case(self) -> Case:
        name = self.rng.choice(list(self.bases))
        data = copy.deepcopy(self.bases[name])
        files = {"s.yaml": _dump(data)}
        algs = data["algorithms"]
        first = algs[0].get("label") or algs[0]["name"]
        blocker = {"blocker": b"x"}
        choices: list[tuple[str, list[str], str, dict[str, bytes], tuple[str, ...]]] = [
            ("--algorithm ''", _run_argv(["--algorithm", ""]), INVALID, {}, _OUT),
            ("--algorithm ' '", _run_argv(["--algorithm", " "]), INVALID, {}, _OUT),
            ("--algorithm bogus", _run_argv(["--algorithm", "bogus"]), INVALID, {}, _OUT),
            ("--algorithm first", _run_argv(["--algorithm", first]), VALID, {}, _OUT),
            ("--trace-steps -5", _run_argv(["--trace", "{dir}/tr", "--trace-steps", "-5"]),
             INVALID, {}, (*_OUT, "tr")),
            ("--trace-steps 0", _run_argv(["--trace", "{dir}/tr", "--trace-steps", "0"]),
             INVALID, {}, (*_OUT, "tr")),
            ("--trace-steps 1", _run_argv(["--trace", "{dir}/tr", "--trace-steps", "1"]),
             VALID, {}, (*_OUT, "tr")),
            ("--trace-steps huge", _run_argv(["--trace", "{dir}/tr", "--trace-steps",
                                              str(10**30)]), EITHER, {}, (*_OUT, "tr")),
            ("--trace into a file", _run_argv(["--trace", "{dir}/blocker"]), INVALID, blocker,
             (*_OUT, "blocker")),
            ("--json under a file", ["run", "{dir}/s.yaml", "-q", "--json",
                                     "{dir}/blocker/x.json"], INVALID, blocker, ()),
            ("--json a folder", ["run", "{dir}/s.yaml", "-q", "--json", "{dir}"], INVALID, {},
             ()),
            ("--json in /proc", ["run", "{dir}/s.yaml", "-q", "--json", "/proc/simfed.json"],
             INVALID, {}, ()),
            ("--json nested new folders", ["run", "{dir}/s.yaml", "-q", "--json",
                                           "{dir}/a/b/c.json"], VALID, {}, ("a",)),
            ("--json ''", ["run", "{dir}/s.yaml", "-q", "--json", ""], INVALID, {}, ()),
            ("--seed -1", _run_argv(["--seed", "-1"]), INVALID, {}, _OUT),
            ("--seed 2**70", _run_argv(["--seed", str(2**70)]), INVALID, {}, _OUT),
            ("--seed abc", _run_argv(["--seed", "abc"]), INVALID, {}, _OUT),
            ("--set no =", _run_argv(["--set", "cluster.nodes"]), INVALID, {}, _OUT),
            ("--set bad YAML", _run_argv(["--set", "cluster.nodes=[1,"]), INVALID, {}, _OUT),
            ("--set .inf", _run_argv(["--set", "cluster.nodes=.inf"]), INVALID, {}, _OUT),
            ("--set 1e400", _run_argv(["--set", "training.lr=1e400"]), INVALID, {}, _OUT),
            ("--set .nan", _run_argv(["--set", "training.lr=.nan"]), INVALID, {}, _OUT),
            ("--set unknown key", _run_argv(["--set", "cluster.nodez=3"]), INVALID, {}, _OUT),
            ("--set through a scalar", _run_argv(["--set", "seed.x=3"]), INVALID, {}, _OUT),
            ("--set list item 99", _run_argv(["--set", "algorithms.99.name=fsdp"]), INVALID,
             {}, _OUT),
            ("--set alias bomb", _run_argv(["--set", "description=" + _bomb_flow()]), INVALID,
             {}, _OUT),
            ("--set deep", _run_argv(["--set", "description=" + "[" * 3000 + "]" * 3000]),
             INVALID, {}, _OUT),
            ("--profile missing", _run_argv(["--profile", "{dir}/nope.yaml"]), INVALID, {},
             _OUT),
            ("--profile with an unknown section", _run_argv(["--profile", "{dir}/p.yaml"]),
             INVALID, {"p.yaml": b"model: {layers: 3}\n"}, _OUT),
            ("--profile Latin-1", _run_argv(["--profile", "{dir}/p.yaml"]), INVALID,
             {"p.yaml": "cluster: {name: caf\u00e9}\n".encode("latin-1")}, _OUT),
            ("--profile /dev/zero", _run_argv(["--profile", "/dev/zero"]), INVALID, {}, _OUT),
            ("--profile NaN", _run_argv(["--profile", "{dir}/p.yaml"]), INVALID,
             {"p.yaml": b"runtime: {comm: {nic_efficiency: .nan}}\n"}, _OUT),
            ("scenario /dev/zero", ["run", "/dev/zero", "-q"], INVALID, {}, ()),
            ("scenario missing", ["run", "{dir}/none.yaml", "-q"], INVALID, {}, ()),
            ("scenario a folder", ["run", "{dir}", "-q"], INVALID, {}, ()),
            ("schema", ["schema"], VALID, {}, ()),
            ("collective", ["collective", "{dir}/s.yaml", "--max-bytes", "16M"], EITHER, {},
             ()),
            ("collective --min-bytes abc", ["collective", "{dir}/s.yaml", "--min-bytes", "abc"],
             INVALID, {}, ()),
            ("collective --min-bytes 1e400", ["collective", "{dir}/s.yaml", "--min-bytes",
                                              "1e400"], INVALID, {}, ()),
            ("collective --min-bytes nan", ["collective", "{dir}/s.yaml", "--min-bytes", "nan"],
             INVALID, {}, ()),
            ("collective --min-bytes 0", ["collective", "{dir}/s.yaml", "--min-bytes", "0"],
             INVALID, {}, ()),
            ("collective --min-bytes -8", ["collective", "{dir}/s.yaml", "--min-bytes", "-8"],
             INVALID, {}, ()),
            ("collective --max-bytes 1e30", ["collective", "{dir}/s.yaml", "--max-bytes",
                                             "1e30"], INVALID, {}, ()),
            ("collective --nodes 0", ["collective", "{dir}/s.yaml", "--nodes", "0"], INVALID,
             {}, ()),
            ("collective --nodes 10**9", ["collective", "{dir}/s.yaml", "--nodes",
                                          str(10**9)], INVALID, {}, ()),
            ("collective --gpus-per-node -1", ["collective", "{dir}/s.yaml", "--gpus-per-node",
                                               "-1"], INVALID, {}, ()),
            ("calibrate, no inputs", ["calibrate", "{dir}/missing", "--scenario", "{dir}/s.yaml",
                                      "--out", "{dir}/p.yaml"], INVALID, {}, ("p.yaml",
                                                                              "p.json")),
            ("calibrate a UTF-16 trace", _cal("t.json", "{}".encode("utf-16")), INVALID,
             {"t.json": "{}".encode("utf-16")}, _CAL_OUT),
            ("calibrate a garbage .jsonl", _cal("t.jsonl", b""), INVALID,
             {"t.jsonl": b"garbage\n{]\n"}, _CAL_OUT),
            ("calibrate a .jsonl with a list header", _cal("t.jsonl", b""), INVALID,
             {"t.jsonl": b"[1, 2]\n"}, _CAL_OUT),
            ("calibrate a bench summary that is a list", _cal("b/bench-summary.json", b""),
             INVALID, {"b/bench-summary.json": b"[1]"}, _CAL_OUT),
            ("calibrate a Chrome trace of garbage events", _cal("t.json", b""), EITHER,
             {"t.json": b'{"traceEvents": [{"ph": "X", "args": {"Collective name": 3}}, 7]}'},
             _CAL_OUT),
            ("calibrate a bench summary with NaN", _cal("b/bench-summary.json", b""), EITHER,
             {"b/bench-summary.json": b'{"meta": {"nodes": NaN}, "cases": [NaN]}'}, _CAL_OUT),
            ("calibrate --out under a file", ["calibrate", "{dir}/s.yaml", "--scenario",
                                              "{dir}/s.yaml", "--out", "{dir}/blocker/p.yaml"],
             INVALID, blocker, ()),
            ("sweep of a bad key", ["sweep", "{dir}/s.yaml", "--vary", "cluster.nodez=1,2",
                                    "--out", "{dir}/sw"], EITHER, {}, ("sw",)),
            ("sweep file named ../x", ["sweep", "{dir}/sw.yaml", "--out", "{dir}/o"], INVALID,
             {"sw.yaml": b"sweep:\n  scenario: s.yaml\n  name: ../x\n"
              b"  vary: {training.steps: [2, 3]}\n"}, ("o",)),
            ("sweep of NaN", ["sweep", "{dir}/s.yaml", "--vary", "training.lr=.nan,1e400",
                              "--out", "{dir}/sw"], EITHER, {}, ("sw",)),
        ]
        what, argv, expect, extra, outputs = self.rng.choice(choices)
        return self._case("cli", f"{name}: {what}", expect, {**files, **extra}, argv, outputs)

    # -- labels and other cross-key rules
    def label_case(self) -> Case:
        name = self.rng.choice(list(self.bases))
        data = copy.deepcopy(self.bases[name])
        algs = data["algorithms"]
        label = self.rng.choice(["../x", f"/tmp/{OUTSIDE}", "a/b", "..", "a\\b", "x" * 100,
                                 "", " ", "fl_hsdp", "hsdp", "\u2603", "ok-name", "ok name",
                                 "with\nnewline"])
        i = self.rng.randrange(len(algs))
        algs[i]["label"] = label
        other = {"fsdp", "hsdp", "fl_fsdp", "fl_hsdp"} - {algs[i]["name"]}
        bad = (label in other or "/" in label or "\\" in label or ".." in label
               or len(label) > 64 or label == " " or "\n" in label or label == "\u2603")
        expect = INVALID if bad else EITHER
        dup = self.rng.random() < 0.3 and len(algs) > 1
        if dup:
            j = (i + 1) % len(algs)
            algs[j]["label"] = label or "same"
            algs[i]["label"] = label or "same"
            expect = INVALID
        return self._case("label", f"{name}: algorithms[{i}].label = {label!r}"
                          + (" (twice)" if dup else ""), expect, {"s.yaml": _dump(data)},
                          _run_argv(["--trace", "{dir}/tr"]), (*_OUT, "tr"))

    # -- sizes that cost time: the shipped scenarios at full size, pushed to their limits
    def cost_case(self) -> Case:
        name = self.rng.choice(["512gpu", "2048gpu", "h100-1024", "h100-4096-70b"])
        data = load_scenario_data(SCENARIOS / f"{name}.yaml")
        gpus = data["cluster"]["node"]["gpus"]
        choices: list[tuple[str, dict[str, Any]]] = [
            ("GPUs at the world limit", {"cluster.nodes": limits.MAX_WORLD // gpus}),
            ("GPUs over the world limit", {"cluster.nodes": limits.MAX_WORLD // gpus + 1}),
            ("256 layers", {"model.layers": 256}),
            ("10^12 steps", {"training.steps": 10**12}),
            ("10^12 steps, K = 10^9", {"training.steps": 10**12,
                                       "algorithms": [{"name": "fl_fsdp", "group_nodes": 1,
                                                       "aggregate_every": 10**9}]}),
            ("per-rank node jitter", {"stragglers.method": "per_rank",
                                      "stragglers.jitter.sigma": 0.05}),
            ("per-rank GPU jitter", {"stragglers.method": "per_rank",
                                     "stragglers.jitter.sigma": 0.05,
                                     "stragglers.jitter.level": "gpu"}),
            ("order-stats GPU jitter", {"stragglers.jitter.sigma": 0.2,
                                        "stragglers.jitter.level": "gpu"}),
            ("host cores at the limit", {"cluster.host_cores": 1024,
                                         "cluster.node.cpu_cores": 1024}),
        ]
        what, sets = self.rng.choice(choices)
        for dotted, v in sets.items():
            _set(data, tuple(dotted.split(".")), v)
        # at the world limit (524,288 GPUs) a run takes 2.7-6.3 s on a quiet 2-core host, inside
        # the time limit like every other case
        return self._case("cost", f"{name}: {what}",
                          INVALID if "over the world limit" in what else EITHER,
                          {"s.yaml": _dump(data)})

    def generate(self, n: int, kind: str = "scenario") -> list[Case]:
        """`n` cases of one kind: "scenario" (the families above) or a family of
        tests/fuzz/families.py (results, trace, bench, published, converge, outputs, and any
        appended to its EXTRA_FAMILIES)."""
        if kind == "scenario":
            families = [(self.key_case, 60), (self.yaml_case, 8), (self.encoding_case, 6),
                        (self.include_case, 8), (self.cli_case, 12), (self.label_case, 6),
                        (self.cost_case, 3)]
        else:
            from .families import Families, all_families

            fam = Families(self)
            families = [(functools.partial(maker, fam), w) for name, maker, w in all_families()
                        if name == kind]
            if not families:
                raise ValueError(f"no fuzz family {kind!r}; kinds: {', '.join(kinds())}")
        makers = [m for m, _ in families]
        weights = [w for _, w in families]
        return [self.rng.choices(makers, weights)[0]() for _ in range(n)]


def kinds() -> list[str]:
    """Every kind of input the fuzzer generates ("scenario" first)."""
    from .families import all_families

    return ["scenario", *dict.fromkeys(name for name, _, _ in all_families())]


_CAL_OUT = ("p.yaml", "p.json")


def _cal(name: str, _content: bytes) -> list[str]:
    """`simfed calibrate` of one input file of the case folder."""
    target = name.split("/")[0] if "/" in name else name
    return ["calibrate", "{dir}/" + target, "--scenario", "{dir}/s.yaml", "--out",
            "{dir}/p.yaml"]


def _bomb() -> str:
    lines = ["x0: &x0 [a, a, a, a, a, a, a, a, a]"]
    lines += [f"x{i}: &x{i} [" + ", ".join([f"*x{i - 1}"] * 9) + "]" for i in range(1, 9)]
    return "\n".join(lines) + "\ndescription: *x8\n"


def _bomb_flow() -> str:
    return "[" + ", ".join(["&a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"] + [
        f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]) + "]"


def _with_description(text: str, desc: str) -> str:
    lines = [ln for ln in text.splitlines() if not ln.startswith("description:")]
    return f"description: {dump_yaml(desc, allow_unicode=True).splitlines()[0]}\n" + \
        "\n".join(lines) + "\n"


def generate(n: int, seed: int = 0, kind: str = "scenario") -> list[Case]:
    return Generator(seed).generate(n, kind)
