"""The input contract beyond scenario keys: YAML control characters and NUL bytes, choices of
the right type, Adam's betas, the collective's name, long values in messages, the JSON reader's
limits, and realrun's command line (one line and exit 2 for bad input, a crash log for a bug,
cost limits before anything is allocated)."""

import json
import os

import pytest
from click.testing import CliRunner

from simfed.cli import main
from simfed.spec import SpecError, load_scenario
from simfed.spec.jsonio import read_json
from simfed.spec.messages import MAX_SHOWN, one_line, shown

from ..conftest import ROOT, SCENARIOS

CPU4 = SCENARIOS / "cpu4.yaml"


def _one_error_line(res, *needles):
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and "internal error" not in res.output, res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, res.output
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


# ---- YAML --------------------------------------------------------------------------------------
def test_a_control_character_in_yaml_is_one_line_naming_the_line(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_bytes(b"description: ok\nname: a\x07b\n" + CPU4.read_bytes().split(b"\n", 1)[1])
    res = CliRunner().invoke(main, ["run", str(p), "-q"])
    _one_error_line(res, str(p), "line 2", "#x0007")


def test_a_nul_byte_in_an_include_path_is_refused(tmp_path):
    text = CPU4.read_text().replace("include: clusters/cpu4.yaml",
                                    'include: "clusters/cpu4\\0.yaml"')
    assert "\\0" in text
    p = tmp_path / "s.yaml"
    p.write_text(text)
    res = CliRunner().invoke(main, ["run", str(p), "-q"])
    _one_error_line(res, "cluster.include", "expected a file path")


# ---- scenario keys ----------------------------------------------------------------------------
@pytest.mark.parametrize("sets, needle", [
    ({"training.fsdp_version": True}, "training.fsdp_version: expected an integer, got True"),
    ({"training.betas": [-0.5, 0.9]}, "training.betas: must be >= 0, got -0.5"),
    ({"training.betas": [0.9, 1.0]}, "training.betas: must be <= 0.999999"),
    ({"runtime.comm.model": "nccl", "runtime.comm.collective": "tree"},
     "runtime.comm.collective: must be one of ring, hierarchical, got 'tree'"),
    ({"runtime.comm.model": "nccl", "runtime.comm.collective": ""},
     "runtime.comm.collective: must be one of"),
])
def test_values_once_taken_silently_are_refused(sets, needle):
    with pytest.raises(SpecError) as exc:
        load_scenario(CPU4, sets)
    assert needle in str(exc.value)


def test_the_schema_names_every_collective_of_the_registry():
    import dataclasses

    from simfed.collectives import COLLECTIVES
    from simfed.spec.runtime import CommRuntime

    field = next(f for f in dataclasses.fields(CommRuntime) if f.name == "collective")
    assert set(field.metadata["choices"]) == set(COLLECTIVES)
    assert load_scenario(CPU4, {"training.betas": [0, 0.5],
                                "runtime.comm.collective": "hierarchical"}).training.betas[0] == 0


# ---- messages ---------------------------------------------------------------------------------
def test_a_long_value_is_cut_in_the_error_line(tmp_path):
    long = "x" * 10_000
    res = CliRunner().invoke(main, ["run", str(CPU4), "-q", "--set",
                                    f"algorithms.0.label={long}"])
    line = _one_error_line(res, "algorithms[0].label", "10,002 characters", "is not a name")
    assert len(line) < 600
    res = CliRunner().invoke(main, ["run", str(CPU4), "-q", "--set", f"{long}=1"])
    assert len(_one_error_line(res, "unknown key")) < 800


def test_shown_and_one_line():
    assert shown("a" * 1000).endswith("...(1,002 characters)")
    assert len(shown("a" * 1000)) < MAX_SHOWN + 30
    assert shown(3) == "3"
    assert one_line("a\nb") == "a\\nb"
    assert one_line("short") == "short"


# ---- the JSON reader ----------------------------------------------------------------------------
@pytest.mark.parametrize("text, needle", [
    ("[" * 100_000 + "]" * 100_000, "nested deeper than 64"),
    ("[" * 65 + "]" * 65, "nested deeper than 64"),
    ('{"a": NaN}', "NaN is not a JSON number"),
    ('{"a": -Infinity}', "-Infinity is not a JSON number"),
    ('{"a": [1, ', "not JSON (line 1, column 11"),
    ("1" * 5000, "4300 digits"),
    ("", "not JSON"),
])
def test_read_json_refuses_in_one_line(tmp_path, text, needle):
    p = tmp_path / "x.json"
    p.write_text(text)
    with pytest.raises(SpecError) as exc:
        read_json(p, "figures")
    msg = str(exc.value)
    assert msg.startswith(f"{p}: ") and needle in msg and "\n" not in msg


def test_read_json_limits_size_and_kind(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"a": list(range(1000))}))
    assert read_json(p, "t")["a"][-1] == 999
    with pytest.raises(SpecError, match="the limit is 100"):
        read_json(p, "t", max_bytes=100)
    with pytest.raises(SpecError, match="not a regular file"):
        read_json("/dev/zero", "t")
    with pytest.raises(SpecError, match="file not found"):
        read_json(tmp_path / "none.json", "t")
    assert read_json(_write(tmp_path, '{"a": NaN}'), "t", allow_nan=True)["a"] != 0


def _write(tmp_path, text):
    p = tmp_path / "y.json"
    p.write_text(text)
    return p


# ---- realrun's command line ---------------------------------------------------------------------
@pytest.fixture
def rr():
    from realrun.cli import main as realrun_main

    return realrun_main


@pytest.mark.parametrize("argv, needles", [
    (["--set", "cluster.nodes=100000"], ["FSDP: 1 group x", "GiB in the emulator",
                                         "the limit is", "80% of this host's memory"]),
    (["-a", "fl_fsdp", "--set", "cluster.nodes=100000"], ["100,000 groups x 108,864"]),
    (["--set", "training.steps=1000000000"], ["FLOPs; the limit is 1e+15"]),
    (["--set", "training.betas=[-0.1,0.9]"], ["training.betas: must be >= 0"]),
    (["--seeds", "1,x"], ["--seeds '1,x': expected integers"]),
    (["--seeds", str(2**70)], ["is not a seed"]),
    (["--eval-every", "-1"], ["--eval-every: must be >= 0"]),
])
def test_realrun_converge_refuses_before_allocating(tmp_path, rr, argv, needles, monkeypatch):
    import realrun.emulator_cost as cost

    monkeypatch.setattr(cost, "free_bytes", lambda: None)  # the host's share, not its load
    out = tmp_path / "c.json"
    res = CliRunner().invoke(rr, ["converge", str(CPU4), *argv, "--json", str(out)])
    _one_error_line(res, *needles)
    assert not out.exists()


def test_realrun_converge_study_unknown_experiment_is_exit_2(tmp_path, rr):
    res = CliRunner().invoke(rr, ["converge-study", "--only", "bogus", "--out",
                                       str(tmp_path / "cs")])
    _one_error_line(res, "--only 'bogus': expected one of")
    assert not (tmp_path / "cs").exists()


def test_realrun_converge_study_refuses_a_run_too_large_for_the_host(tmp_path, rr,
                                                                      monkeypatch):
    """A study run whose estimate exceeds the host's limit is refused in one line naming the
    experiment and the run, before anything is allocated; the runs already made stay as they
    were (the seventh check's study, resumed: only FL+FSDP 32 x 4 at hidden 1280 is left)."""
    import shutil

    import realrun.emulator_cost as cost

    monkeypatch.setattr(cost, "max_converge_bytes", lambda: 20 * 2**30)
    monkeypatch.setattr(cost, "free_bytes", lambda: None)
    out = tmp_path / "cs"
    out.mkdir()
    shutil.copy(ROOT / "results/convergence/kjv-h1280.json", out)
    before = (out / "kjv-h1280.json").read_bytes()
    res = CliRunner().invoke(rr, ["converge-study", "--only", "kjv-h1280", "--seeds", "0",
                                  "--out", str(out)])
    _one_error_line(res, "kjv-h1280 fl_fsdp/n32/k8/lr0.0003: FL+FSDP: 32 groups x",
                    "GiB in the emulator; the limit is 20 GiB (80% of this host's memory")
    assert (out / "kjv-h1280.json").read_bytes() == before


def test_realrun_internal_error_is_one_line_with_a_crash_log(tmp_path, rr, monkeypatch):
    import realrun.converge as converge

    def boom(*a, **k):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(converge, "emulate", boom)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    res = CliRunner().invoke(rr, ["converge", str(CPU4), "-a", "fsdp"])
    from realrun.errors import EXIT_INTERNAL

    assert res.exit_code == EXIT_INTERNAL, res.output
    assert "Traceback" not in res.output
    line = res.output.strip().splitlines()[-1]
    assert line.startswith("internal error (a bug in realrun, not in the input): "
                           "ZeroDivisionError: a bug (traceback in ")
    log = line.rsplit("traceback in ", 1)[1].rstrip(")")
    assert os.path.dirname(log) == str(tmp_path)
    with open(log, encoding="utf-8") as f:
        assert "ZeroDivisionError" in f.read()


def test_converge_refuses_what_does_not_fit_in_the_memory_free_now(monkeypatch, tmp_path, rr):
    """A second study process beside a first: the limit is the memory free now where that is
    below the host's share, and the message says so."""
    import realrun.emulator_cost as cost

    monkeypatch.setattr(cost, "free_bytes", lambda: 2**30)
    res = CliRunner().invoke(rr, ["converge", str(CPU4), "-a", "fsdp", "--set",
                                  "cluster.nodes=64", "--json", str(tmp_path / "c.json")])
    _one_error_line(res, "GiB in the emulator; the limit is 1 GiB (the memory free now: other "
                    "processes hold the rest")
    assert not (tmp_path / "c.json").exists()


def test_one_model_costs_more_activation_memory_than_stacked_groups():
    """The estimate's activation bytes per value: measured 34 for one model, 16 for groups
    under vmap (realrun/emulator_cost.py)."""
    from realrun.emulator_cost import ACT_BYTES_GROUPS, ACT_BYTES_ONE_MODEL, converge_cost
    from simfed.spec import load_scenario

    sc = load_scenario(CPU4, {"cluster.nodes": 8})
    g1, t1, b1, _ = converge_cost(sc, sc.algorithm("fsdp"))
    g8, t8, b8, _ = converge_cost(sc, sc.algorithm("fl_fsdp"))
    assert g1 == 1 and g8 > 1 and t1 == t8
    params = sc.model.total_params
    assert (b1 - 20 * params) / ACT_BYTES_ONE_MODEL == (b8 - 20 * g8 * params) / ACT_BYTES_GROUPS
