"""`simfed plot` and `simfed figures` on damaged result files: one line naming the file, the key
and the value, exit 2, and nothing drawn or written. Before: plot phases drew results with a NaN
step time or a missing key (exit 0), crashed on a phases_s string, an algorithm or cluster of the
wrong type or a 100,000-deep file (exit 3); plot scaling crashed on a row or params of the wrong
type or a JSON list (exit 3); plot heatmap coloured a cell by a string; figures wrote a figure
and then crashed on a truncated convergence study (JSONDecodeError)."""

import copy
import json

import pytest
from click.testing import CliRunner

from simfed.cli import main

from ..conftest import SCENARIOS

CPU4 = str(SCENARIOS / "cpu4.yaml")


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    d = tmp_path_factory.mktemp("results")
    r = CliRunner()
    assert r.invoke(main, ["run", CPU4, "-q", "--set", "training.steps=2", "--json",
                           str(d / "run.json")]).exit_code == 0
    assert r.invoke(main, ["sweep", CPU4, "--vary", "training.steps=2,3", "--vary",
                           "cluster.nodes=1,2", "-q", "--jobs", "1", "--json",
                           str(d / "sw.json")]).exit_code == 0
    return {"run": json.loads((d / "run.json").read_text()),
            "sweep": json.loads((d / "sw.json").read_text())}


def _mutated(data, change):
    data = copy.deepcopy(data)
    change(data)
    return data


def _refused(res, *needles):
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and "internal error" not in res.output, res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, res.output
    for n in needles:
        assert n in lines[0], lines[0]


def _alg(i, key, value):
    return lambda d: d["algorithms"][i].__setitem__(key, value)


PHASES = [
    ("nan step time", None, '"step_time_s": NaN', ["NaN is not a JSON number"]),
    ("missing phases", lambda d: d["algorithms"][0].pop("phases_s"), None,
     ["algorithms[0].phases_s: field required"]),
    ("missing step time", lambda d: d["algorithms"][0].pop("step_time_s"), None,
     ["algorithms[0].step_time_s: field required"]),
    ("phases a string", _alg(0, "phases_s", "x"), None,
     ["algorithms[0].phases_s: input should be a valid dictionary"]),
    ("negative phase", lambda d: d["algorithms"][0]["phases_s"].__setitem__("forward", -1), None,
     ["algorithms[0].phases_s.forward: input should be greater than or equal to 0, got -1"]),
    ("speedup a string", _alg(1, "speedup", "x"), None, ["algorithms[1].speedup"]),
    ("algorithm a number", lambda d: d["algorithms"].__setitem__(0, 3), None,
     ["algorithms[0]: input should be a valid dictionary"]),
    ("cluster a string", lambda d: d.__setitem__("cluster", "x"), None, ["cluster:"]),
    ("world a string", lambda d: d["cluster"].__setitem__("world", "x"), None,
     ["cluster.world"]),
    ("no algorithms", lambda d: d.__setitem__("algorithms", []), None, ["algorithms:"]),
    ("a list", lambda d: None, "[1, 2]", ["the top level"]),
    ("100,000 deep", lambda d: None, "[" * 100_000 + "]" * 100_000,
     ["nested deeper than 64"]),
    ("a long label", _alg(0, "label", 5), None, ["algorithms[0].label"]),
]


@pytest.mark.parametrize("what, change, raw, needles", PHASES, ids=[p[0] for p in PHASES])
def test_plot_phases_refuses_damaged_results(tmp_path, made, what, change, raw, needles):
    p = tmp_path / "run.json"
    if raw is not None and raw.startswith('"step_time_s"'):
        text = json.dumps(made["run"]).replace('"step_time_s": ', raw + ', "x": ', 1)
    elif raw is not None:
        text = raw
    else:
        text = json.dumps(_mutated(made["run"], change))
    p.write_text(text)
    out = tmp_path / "out.png"
    _refused(CliRunner().invoke(main, ["plot", "phases", str(p), "--out", str(out)]),
             str(p), *needles)
    assert not out.exists()


SWEEPS = [
    ("rows a string", lambda d: d.__setitem__("rows", "x"), None, ["rows:"]),
    ("a row a number", lambda d: d["rows"].__setitem__(0, 5), None, ["rows[0]:"]),
    ("params a string", lambda d: d["rows"][0].__setitem__("params", "x"), None,
     ["rows[0].params"]),
    ("tokens/s a string", lambda d: d["rows"][1].__setitem__("tokens_per_s", "fast"), None,
     ["rows[1].tokens_per_s", "'fast'"]),
    ("status unknown", lambda d: d["rows"][0].__setitem__("status", "great"), None,
     ["rows[0].status"]),
    ("a list", None, "[1, 2]", ["the top level"]),
    # before: TypeError in plot scaling (exit 3), found by the fuzzer
    ("an ok row without its per-GPU throughput",
     lambda d: d["rows"][0].__setitem__("tokens_per_s_per_gpu", None), None,
     ["rows[0]", "tokens_per_s_per_gpu is missing, but the row's status is ok"]),
    ("NaN", None, "NaN", ["NaN is not a JSON number"]),
    ("deep", None, "[" * 100_000 + "]" * 100_000, ["nested deeper than 64"]),
    # before: AttributeError / unhashable list in the figures (exit 3), found by the fuzzer
    ("model a string", lambda d: d["rows"][0].__setitem__("model", "x"), None,
     ["rows[0].model"]),
    ("a swept value a list", lambda d: d["rows"][0]["params"].__setitem__(
        next(iter(d["rows"][0]["params"])), [1, 2]), None, ["rows[0].params"]),
]


@pytest.mark.parametrize("kind", ["scaling", "heatmap"])
def test_a_huge_integer_is_drawn_as_the_number_it_is(tmp_path, made, kind):
    """An integer speedup of 10**30 (JSON allows it; within the checked range) reached numpy
    as a Python int: isfinite of an object array, TypeError (exit 3)."""
    def change(d):
        for r in d["rows"]:
            if r.get("speedup") is not None:
                r["speedup"] = 10**30
    p = tmp_path / "sw.json"
    p.write_text(json.dumps(_mutated(made["sweep"], change)))
    res = CliRunner().invoke(main, ["plot", kind, str(p), "--out", str(tmp_path / "o.png")])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("kind", ["scaling", "heatmap"])
@pytest.mark.parametrize("what, change, raw, needles", SWEEPS, ids=[s[0] for s in SWEEPS])
def test_plot_scaling_and_heatmap_refuse_damaged_sweeps(tmp_path, made, kind, what, change,
                                                        raw, needles):
    p = tmp_path / "sw.json"
    p.write_text(raw if raw is not None else json.dumps(_mutated(made["sweep"], change)))
    out = tmp_path / "out.png"
    _refused(CliRunner().invoke(main, ["plot", kind, str(p), "--out", str(out)]), *needles)
    assert not out.exists()


def test_plot_heatmap_refuses_a_colour_value_that_is_not_a_number(tmp_path, made):
    def change(d):
        for r in d["rows"]:
            r["memory_bytes"] = "lots"

    p = tmp_path / "sw.json"
    p.write_text(json.dumps(_mutated(made["sweep"], change)))
    res = CliRunner().invoke(main, ["plot", "heatmap", str(p), "--value", "memory_bytes",
                                    "--out", str(tmp_path / "h.png")])
    _refused(res, "memory_bytes is 'lots', not a finite number")
    p.write_text(json.dumps(made["sweep"]))
    res = CliRunner().invoke(main, ["plot", "heatmap", str(p), "--out", str(tmp_path / "h.png")])
    assert res.exit_code == 0, res.output


def test_figures_check_every_input_before_writing_anything(tmp_path):
    results = tmp_path / "results"
    (results / "convergence").mkdir(parents=True)
    (results / "convergence" / "a.json").write_text('{"runs": [{"algorithm": "fsdp", ')
    out = tmp_path / "figs"
    res = CliRunner().invoke(main, ["figures", "--scenario", CPU4, "--out", str(out),
                                    "--results", str(results), "--only", "phases", "--only",
                                    "convergence", "-q"])
    _refused(res, "a.json", "not JSON")
    assert not out.exists() or not any(out.iterdir())  # the phases figure was not written
    (results / "convergence" / "a.json").write_text(json.dumps({"runs": [{"algorithm": 3}]}))
    res = CliRunner().invoke(main, ["figures", "--scenario", CPU4, "--out", str(out),
                                    "--results", str(results), "--only", "convergence", "-q"])
    _refused(res, "a.json", "not a convergence study file")


@pytest.mark.parametrize("data, needle", [
    # before: TypeError (exit 3), found by the fuzzer
    ({"runs": [{"name": "a", "predicted_phases_s": {"forward": {"x": 1}},
                "measured_phases_s": {"forward": 1.0}}]},
     "predicted_phases_s.forward: expected seconds"),
    ({"speedups": True}, "speedups: expected a list"),
    ({"runs": 3}, "runs: expected a list"),
])
def test_plot_validation_refuses_values_of_the_wrong_type(tmp_path, data, needle):
    p = tmp_path / "v.json"
    p.write_text(json.dumps(data))
    res = CliRunner().invoke(main, ["plot", "validation", str(p), "--out",
                                    str(tmp_path / "o.png")])
    _refused(res, needle)


@pytest.mark.parametrize("data, needle", [
    # before: a phase or step time of 10^308 s took the figure over 10 s to draw (the fuzzer)
    ({"runs": [{"name": "a", "predicted_phases_s": {"forward": 1e308},
                "measured_phases_s": {"forward": 1.0}}]}, "expected seconds"),
    ({"runs": [{"name": "a", "predicted_step_time_s": 1e308, "measured_step_time_s": 1.0}]},
     "runs[0].predicted_step_time_s: expected a number above 0 and at most 1e+07"),
    ({"speedups": [{"name": "s", "predicted": "fast", "measured": 1.1}]},
     "speedups[0].predicted: expected a number above 0 and at most 1e+06, got 'fast'"),
])
def test_plot_validation_refuses_values_out_of_range(tmp_path, data, needle):
    p = tmp_path / "v.json"
    p.write_text(json.dumps(data))
    res = CliRunner().invoke(main, ["plot", "validation", str(p), "--out",
                                    str(tmp_path / "o.png")])
    _refused(res, needle)
