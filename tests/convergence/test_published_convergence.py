"""validation/convergence/: published runs and laws as data.

Oracles: the shipped folder loads and its recorded fit/check split is the one the stated rule
gives; the rule itself on hand-made pools; every malformed variant of a shipped file (missing
field, unknown key, NaN, negative steps, unknown split, ...) is one SpecError line that names the
file, the entry and the field."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import yaml

from simfed.convergence.published import (
    Run,
    assign_split,
    coverage_of,
    load_file,
    load_published_convergence,
    split_mismatches,
    summary,
    summary_rows,
)
from simfed.spec import SpecError

from ..conftest import ROOT

FOLDER = ROOT / "validation" / "convergence"
SMALL = FOLDER / "douillard2023-diloco-tables2-3.yaml"   # a runs file
LAWS = FOLDER / "kaplan2020-laws.yaml"                     # a law file


@pytest.fixture(scope="module")
def shipped():
    return load_published_convergence(FOLDER)


def test_shipped_folder_loads(shipped):
    files = sorted(p.name for p in FOLDER.glob("*.yaml"))
    assert [s.path.name for s in shipped] == files
    assert len(files) >= 10
    for src in shipped:
        assert src.entries(), src.path
        assert {e.split for e in src.entries()} <= {"fit", "check"}
    runs = [r for s in shipped if s.kind == "runs" for r in s.runs]
    laws = [w for s in shipped if s.kind == "law" for w in s.laws]
    assert sum(r.split == "check" for r in runs) > 0 and sum(r.split == "fit" for r in runs) > 0
    assert len(laws) > 0
    # every run has an evaluation value in its metric's physical range
    for r in runs:
        assert all(math.isfinite(v) and v > 0 for _, v in r.eval)


def test_recorded_split_is_the_rule(shipped):
    assert split_mismatches(shipped) == []


def test_summary_counts_every_entry(shipped):
    rows = summary_rows(shipped)
    assert len(rows) == len(shipped)
    for row, src in zip(rows, shipped, strict=True):
        assert row["fit"] + row["check"] == len(src.entries())
    text = summary(shipped)
    assert all(r["file"] in text for r in rows)
    total_runs = sum(len(s.runs) for s in shipped if s.kind == "runs")
    line = next(x for x in text.splitlines() if x.startswith("total runs"))
    assert sum(int(v) for v in line.split()[2:4]) == total_runs


def test_what_each_file_can_test(shipped):
    by_name = {s.path.name: coverage_of(s) for s in shipped}
    assert by_name["kaplan2020-laws.yaml"] == ["law"]
    assert {"size", "replicas"} <= set(by_name["charles2025-diloco-table4.yaml"])
    assert {"horizon", "batch", "schedule"} <= set(by_name["li2025-steplaw-dense-grid.yaml"])
    assert {"horizon", "schedule"} <= set(by_name["luo2025-multipower-curves.yaml"])


# ---- the split rule on hand-made pools --------------------------------------------------------

def _run(name, size, *, replicas=1, sync=0, batch=None, tokens=None, steps=None):
    return Run.model_validate({
        "name": name, "split": "fit", "params": size, "replicas": replicas, "sync_every": sync,
        "outer_optimizer": "nesterov" if sync else "none", "optimizer": "adamw",
        "batch_tokens": batch, "tokens": tokens, "steps": steps, "eval": [[None, 3.0]],
        "eval_metric": "loss"})


def test_rule_size_clause():
    two = [_run("a", 1e8), _run("b", 4e8)]
    assert assign_split(two) == {"a": "fit", "b": "check"}
    five = [_run(f"s{i}", 10 ** (6 + i)) for i in range(5)]
    assert [assign_split(five)[f"s{i}"] for i in range(5)] == ["fit"] * 3 + ["check"] * 2
    one = [_run("x", 1e8), _run("y", 1e8, replicas=2, sync=30)]
    assert set(assign_split(one).values()) == {"fit"}          # one size: no size clause


def test_rule_horizon_clause():
    runs = [_run("short", 1e8, batch=1e6, tokens=1e10), _run("long", 1e8, batch=1e6, tokens=4e10),
            _run("other-batch", 1e8, batch=2e6, tokens=8e10),  # its own group: no clause
            _run("steps-a", 1e8, steps=1000), _run("steps-b", 1e8, steps=3000)]
    rule = assign_split(runs)
    assert rule == {"short": "fit", "long": "check", "other-batch": "fit",
                    "steps-a": "fit", "steps-b": "check"}
    # horizon is per model copy: two replicas on twice the tokens is the same horizon
    same = [_run("dp", 1e8, batch=1e6, tokens=1e10),
            _run("m2", 1e8, replicas=2, sync=30, batch=1e6, tokens=2e10),
            _run("m2-long", 1e8, replicas=2, sync=30, batch=1e6, tokens=4e10)]
    assert assign_split(same) == {"dp": "fit", "m2": "fit", "m2-long": "check"}


def test_rule_replicas_clause():
    runs = [_run("dp", 1e8), _run("m2", 1e8, replicas=2, sync=30),
            _run("m8", 1e8, replicas=8, sync=30)]
    assert assign_split(runs) == {"dp": "fit", "m2": "fit", "m8": "check"}
    only = [_run("dp", 1e8), _run("m4", 1e8, replicas=4, sync=30)]
    assert set(assign_split(only).values()) == {"fit"}   # one replica count above one


# ---- malformed files: one line naming file, entry and field -----------------------------------

def _write(tmp_path: Path, data: dict, name: str = "bad.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _load_error(path: Path) -> str:
    with pytest.raises(SpecError) as info:
        load_file(path)
    msg = str(info.value)
    assert "\n" not in msg
    assert str(path) in msg
    return msg


@pytest.fixture()
def runs_doc():
    return yaml.safe_load(SMALL.read_text(encoding="utf-8"))


def _mutated(doc, fn):
    doc = copy.deepcopy(doc)
    fn(doc)
    return doc


@pytest.mark.parametrize("mutate, expect", [
    (lambda d: d["runs"][1].pop("replicas"), "runs[1] (dp-8x-batch-150m).replicas: missing"),
    (lambda d: d["runs"][0].update(gpus=8), "runs[0] (baseline-150m).gpus: unknown key"),
    (lambda d: d["runs"][2].update(eval=[[None, float("nan")]]),
     "runs[2] (dp-8x-updates-150m).eval[0][1]: input should be a finite number, got nan"),
    (lambda d: d["runs"][0].update(steps=-5), "runs[0] (baseline-150m).steps: input should be "
                                              "greater than or equal to 1, got -5"),
    (lambda d: d["runs"][3].update(split="train"), "runs[3] (diloco-k4-noniid-150m).split: "
                                                  "input should be 'fit' or 'check', got 'train'"),
    (lambda d: d["runs"][0].update(lr=float("inf")), "runs[0] (baseline-150m).lr"),
    (lambda d: d["runs"][0].update(params=12.0),
     "runs[0] (baseline-150m).params: must be in [1000, 1e+13], got 12.0"),
    (lambda d: d["runs"][0].update(eval=[[88000, 0.5]]), "perplexity 0.5 outside the physical "
                                                         "range"),
    (lambda d: d["runs"][3].update(sync_every=0), "runs[3] (diloco-k4-noniid-150m).sync_every: 0 "
                                                  "with outer_optimizer 'nesterov'"),
    (lambda d: d["runs"][0].update(eval=[[90000, 16.2], [80000, 16.3]]),
     "evaluation steps must increase"),
    (lambda d: d["runs"][0].update(eval=[[99000, 16.2]]),
     "runs[0] (baseline-150m).eval: evaluation step 99000 is past the run's 88000 steps"),
    (lambda d: d.pop("pool"), "pool: missing"),
    (lambda d: d["runs"][0].pop("params"), "runs[0] (baseline-150m).params: params or "
                                           "non_embedding_params is required"),
    (lambda d: d["source"].update(how="figure"), "source.reading_uncertainty: a value digitised "
                                                 "from a figure"),
    (lambda d: d["source"].update(how="file"), "source.commit: a repository file needs the commit"),
    (lambda d: d.update(kind="law"), "laws: kind law needs a non-empty laws list"),
    (lambda d: d["runs"].append(copy.deepcopy(d["runs"][0])), "runs[11].name: 'baseline-150m' "
                                                               "repeats runs[0]"),
])
def test_malformed_runs_file_is_one_line(tmp_path, runs_doc, mutate, expect):
    msg = _load_error(_write(tmp_path, _mutated(runs_doc, mutate)))
    assert expect in msg, msg


def test_malformed_law_file_is_one_line(tmp_path):
    doc = yaml.safe_load(LAWS.read_text(encoding="utf-8"))
    bad = _mutated(doc, lambda d: d["laws"][3]["constants"].update(alpha_B=float("nan")))
    msg = _load_error(_write(tmp_path, bad))
    assert "laws[3] (b-crit-of-loss).constants.alpha_B" in msg, msg
    bad = _mutated(doc, lambda d: d["laws"][0].pop("equation"))
    assert "laws[0] (loss-of-n).equation: missing" in _load_error(_write(tmp_path, bad))


def test_long_values_are_cut(tmp_path, runs_doc):
    bad = _mutated(runs_doc, lambda d: d["runs"][0].update(split="x" * 1000))
    msg = _load_error(_write(tmp_path, bad))
    assert "x" * 190 in msg and "x" * 300 not in msg and msg.endswith("...")


def test_unreadable_files(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("runs: [unclosed", encoding="utf-8")
    assert "not valid YAML" in _load_error(path)
    path.write_text("- a list\n", encoding="utf-8")
    assert "expected a mapping" in _load_error(path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SpecError, match=r"no \*\.yaml files"):
        load_published_convergence(empty)
    with pytest.raises(SpecError, match="not a folder"):
        load_published_convergence(tmp_path / "missing")


def test_same_run_name_in_two_files_of_a_pool(tmp_path, runs_doc):
    _write(tmp_path, runs_doc, "a.yaml")
    _write(tmp_path, runs_doc, "b.yaml")
    with pytest.raises(SpecError, match=r"also in a\.yaml"):
        load_published_convergence(tmp_path)
