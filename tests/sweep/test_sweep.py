"""Sweeps: value syntax, sweep files, impossible points as rows, one row per point and
algorithm, byte-identical output for any executor and worker count."""

import csv
import io
import json
import sys

import pytest
from click.testing import CliRunner

from simfed.cli import main
from simfed.spec import SpecError
from simfed.sweep import (
    Axis,
    SweepSpec,
    check_key,
    load_sweep_file,
    parse_values,
    parse_vary,
    read_rows,
    run_point,
    run_sweep,
    to_csv,
    to_json,
    write_outputs,
)

from ..conftest import ROOT

TINY = str(ROOT / "tests" / "fixtures" / "tiny2x2.yaml")
ALGS = ["fsdp", "hsdp", "fl_fsdp", "fl_hsdp"]


def tiny_spec(**kw) -> SweepSpec:
    """2 x 2 grid on the tiny cluster; nodes=3 with 2-node groups is impossible for FL+FSDP."""
    return SweepSpec(scenario=TINY, name="tiny", sets={"training.steps": 2},
                     axes=(parse_vary("cluster.nodes=2,3"),
                           parse_vary("algorithms.fl_fsdp.group_nodes=1,2")), **kw)


@pytest.fixture(scope="module")
def tiny_result():
    return run_sweep(tiny_spec(), jobs=1, progress=False)


# ---------------------------------------------------------------------------------------------
# values


@pytest.mark.parametrize("raw, expected", [
    ("16,32,64", [16, 32, 64]),
    ("1:4", [1, 2, 3, 4]),
    ("0:10:5", [0, 5, 10]),
    ("16:1024:x2", [16, 32, 64, 128, 256, 512, 1024]),
    ("1:64:x4", [1, 4, 16, 64]),
    ("0.5:1.0:0.25", [0.5, 0.75, 1.0]),
    ("0.1:0.3:0.1", [0.1, 0.2, 0.3]),  # no float drift (0.30000000000000004)
    ("detail", ["detail"]),
    ("'off',detail", ["off", "detail"]),
    ([1, 2], [1, 2]),
])
def test_values(raw, expected):
    assert parse_values(raw) == expected


@pytest.mark.parametrize("raw, message", [
    ("4:1", "need START <= STOP"),
    ("1:8:x1", "factor > 1"),
    ("a:b", "is not a number"),
    ("1,,2", "empty item"),
    ("1:2:3:4", "expected START:STOP"),
])
def test_bad_values(raw, message):
    with pytest.raises(SpecError, match=message):
        parse_values(raw)


def test_linked_keys_vary_together():
    ax = parse_vary("algorithms.fl_fsdp.group_nodes+algorithms.fl_hsdp.group_nodes=1,2")
    assert ax.keys == ("algorithms.fl_fsdp.group_nodes", "algorithms.fl_hsdp.group_nodes")
    spec = SweepSpec(scenario=TINY, axes=(parse_vary("cluster.nodes=2,4"), ax))
    points = spec.points()
    assert len(points) == 4
    assert points[1] == {"cluster.nodes": 2, "algorithms.fl_fsdp.group_nodes": 2,
                         "algorithms.fl_hsdp.group_nodes": 2}


def test_sweep_file(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(f"""
sweep:
  scenario: {TINY}
  set: {{training.steps: 2}}
  vary:
    cluster.nodes: "2:4:x2"
  linked:
    - algorithms.fl_fsdp.group_nodes: [1, 2]
      algorithms.fl_fsdp.aggregate_every: [1, 2]
  algorithms: [fsdp, fl_fsdp]
""")
    spec = load_sweep_file(f)
    assert spec.name == "s" and spec.algorithms == ("fsdp", "fl_fsdp")
    assert spec.axes[1] == Axis(keys=("algorithms.fl_fsdp.group_nodes",
                                      "algorithms.fl_fsdp.aggregate_every"),
                                values=((1, 1), (2, 2)))
    assert len(spec.points()) == 4
    f.write_text("sweep:\n  scenario: x.yaml\n  linked:\n    - {a.b: [1, 2], a.c: [1]}\n")
    with pytest.raises(SpecError, match="equally many values"):
        load_sweep_file(f)


def test_unknown_key_fails_before_running():
    with pytest.raises(SpecError, match="unknown key 'nodez' under cluster; valid keys there"):
        check_key("cluster.nodez")
    check_key("algorithms.fl_fsdp.group_nodes")
    check_key("runtime.comm.nic_efficiency")
    spec = SweepSpec(scenario=TINY, axes=(parse_vary("algorithms.nope.group_nodes=1"),))
    with pytest.raises(SpecError, match="no list item 'nope'"):
        run_sweep(spec, progress=False)


# ---------------------------------------------------------------------------------------------
# rows


def test_one_row_per_point_and_algorithm(tiny_result):
    rows = tiny_result.rows
    assert len(rows) == 4 * len(ALGS)
    assert [(r["point"], r["name"]) for r in rows] == [(p, a) for p in range(4) for a in ALGS]
    table = list(csv.DictReader(io.StringIO(to_csv(rows))))
    assert len(table) == 16
    assert {"point", "params.cluster.nodes", "params.algorithms.fl_fsdp.group_nodes", "status",
            "error", "step_time_s", "tokens_per_s", "phases_s.forward", "bytes_by_link.nvlink",
            "cluster.world", "speedup", "fits"} <= set(table[0])


def test_impossible_point_is_a_row_not_a_crash(tiny_result):
    bad = [r for r in tiny_result.rows if r["status"] != "ok"]
    assert [(r["params"], r["name"]) for r in bad] == [
        ({"cluster.nodes": 3, "algorithms.fl_fsdp.group_nodes": 2}, "fl_fsdp")]
    assert bad[0]["status"] == "invalid"
    assert bad[0]["error"] == ("algorithms.fl_fsdp.group_nodes: 2 does not divide the "
                               "cluster's 3 nodes")
    # the other algorithms of that point ran, with speedups against FSDP
    same = [r for r in tiny_result.rows if r["point"] == bad[0]["point"] and r is not bad[0]]
    assert all(r["status"] == "ok" and r["step_time_s"] > 0 for r in same)
    fsdp = same[0]
    assert fsdp["speedup"] == 1.0
    assert same[1]["speedup"] == pytest.approx(fsdp["step_time_s"] / same[1]["step_time_s"])
    assert tiny_result.counts() == {"ok": 15, "does_not_fit": 0, "invalid": 1, "error": 0}


def test_does_not_fit_keeps_the_numbers():
    rows = run_point(TINY, {"training.steps": 1, "cluster.node.gpu.memory_GiB": 0.5},
                     ("fsdp", "hsdp"))
    assert [r["status"] for r in rows] == ["does_not_fit", "does_not_fit"]
    assert "GiB per GPU" in rows[0]["error"] and rows[0]["step_time_s"] > 0


def test_invalid_baseline_gives_no_speedup():
    rows = run_point(TINY, {"training.steps": 1, "cluster.nodes": 3,
                            "algorithms.fl_fsdp.group_nodes": 2}, ("fl_fsdp", "fsdp"))
    assert [r["status"] for r in rows] == ["invalid", "ok"]
    assert rows[1]["speedup"] is None


def test_unexpected_failure_is_an_error_row(monkeypatch):
    import simfed.engine

    def boom(*a, **k):
        raise RuntimeError("simulator bug\nsecond line")

    monkeypatch.setattr(simfed.engine, "simulate", boom)
    rows = run_point(TINY, {"training.steps": 1}, ("fsdp",))
    assert rows == [{"status": "error", "error": "RuntimeError: simulator bug", "name": "fsdp",
                     "label": "fsdp"}]


def test_bad_scenario_value_is_invalid_for_every_algorithm():
    rows = run_point(TINY, {"training.seq_len": -1}, ("fsdp", "hsdp"))
    assert {r["status"] for r in rows} == {"invalid"}
    assert rows[0]["error"].endswith("training.seq_len: must be >= 1, got -1")


# ---------------------------------------------------------------------------------------------
# determinism, parallel workers, executors


def test_deterministic_and_parallel(tmp_path, tiny_result):
    """Two workers (process pool) write byte-identical files to the in-process run."""
    par = run_sweep(tiny_spec(), jobs=2, progress=False)
    a = write_outputs(tiny_result, csv_path=tmp_path / "a.csv", json_path=tmp_path / "a.json")
    b = write_outputs(par, csv_path=tmp_path / "b.csv", json_path=tmp_path / "b.json")
    for x, y in zip(a, b, strict=True):
        assert x.read_bytes() == y.read_bytes()
    again = run_sweep(tiny_spec(), jobs=2, progress=False)
    assert to_json(again) == to_json(par)


def test_dask_executor_matches_local(tiny_result):
    pytest.importorskip("distributed")
    res = run_sweep(tiny_spec(), executor="dask", jobs=2, progress=False)
    assert to_csv(res.rows) == to_csv(tiny_result.rows)


def test_missing_extra_is_a_one_line_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(SpecError, match=r"needs the 'distributed' extra: pip install"):
        run_sweep(tiny_spec(), executor="dask", progress=False)
    with pytest.raises(SpecError, match="--executor ray needs Ray"):
        run_sweep(tiny_spec(), executor="ray", progress=False)


def test_csv_reads_back(tmp_path, tiny_result):
    p = tmp_path / "s.csv"
    write_outputs(tiny_result, csv_path=p)
    rows = read_rows(p)
    assert len(rows) == 16
    assert rows[0]["params"] == {"cluster.nodes": 2, "algorithms.fl_fsdp.group_nodes": 1}
    assert rows[0]["phases_s"]["forward"] == tiny_result.rows[0]["phases_s"]["forward"]
    assert rows[0]["fits"] is True


# ---------------------------------------------------------------------------------------------
# the command


def test_cli_sweep(tmp_path):
    res = CliRunner().invoke(main, ["sweep", TINY, "--vary", "cluster.nodes=2,3",
                                    "--vary", "algorithms.fl_fsdp.group_nodes=2",
                                    "--set", "training.steps=1", "-a", "fsdp", "-a", "fl_fsdp",
                                    "--out", str(tmp_path), "-j", "1"])
    assert res.exit_code == 0, res.output
    assert "2 points x 2 algorithms = 4 rows: 3 ok, 0 do not fit, 1 invalid" in res.output
    data = json.loads((tmp_path / "tiny2x2.json").read_text())
    assert data["sweep"]["algorithms"] == ["fsdp", "fl_fsdp"]
    assert len(data["rows"]) == 4
    assert len((tmp_path / "tiny2x2.csv").read_text().splitlines()) == 5


@pytest.mark.parametrize("args, message", [
    (["--vary", "cluster.nodez=1,2"], "error: cluster.nodez: unknown key 'nodez' under cluster"),
    ([], "error: nothing to vary"),
    (["--vary", "cluster.nodes=1", "-a", "nope"], "error: algorithm 'nope' is not in this"),
    (["--vary", "cluster.nodes=4:1"], "need START <= STOP"),
])
def test_cli_sweep_errors_are_one_line(tmp_path, args, message):
    res = CliRunner().invoke(main, ["sweep", TINY, "--out", str(tmp_path), "-q", *args])
    assert res.exit_code == 2
    assert message in res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize("text", ["foo: [\n", "sweep:\n  scenario: [\n"])
def test_cli_sweep_of_a_file_that_does_not_parse_says_so(tmp_path, text):
    """A malformed scenario or sweep file without --vary is named with its YAML error, not
    taken for a scenario with nothing to vary."""
    f = tmp_path / "broken.yaml"
    f.write_text(text)
    res = CliRunner().invoke(main, ["sweep", str(f), "--out", str(tmp_path), "-q"])
    assert res.exit_code == 2
    assert f"error: {f}: line " in res.output and "invalid YAML" in res.output
    assert "nothing to vary" not in res.output and "Traceback" not in res.output
    assert list(tmp_path.iterdir()) == [f]  # nothing written


def test_cli_sweep_file_plus_command_line_axes(tmp_path):
    f = tmp_path / "grid.yaml"
    f.write_text(f"sweep:\n  scenario: {TINY}\n  set: {{training.steps: 1}}\n"
                 "  vary: {cluster.nodes: [1, 2]}\n  algorithms: [fsdp]\n")
    res = CliRunner().invoke(main, ["sweep", str(f), "--vary", "training.micro_batch=1,2",
                                    "--out", str(tmp_path), "-q", "-j", "1"])
    assert res.exit_code == 0, res.output
    rows = read_rows(tmp_path / "grid.csv")
    assert [r["params"] for r in rows] == [
        {"cluster.nodes": n, "training.micro_batch": b} for n in (1, 2) for b in (1, 2)]
    assert {r["steps"] for r in rows} == {1}


def test_sweep_set_is_parsed_as_simfed_run_parses_it(tmp_path):
    """One `--set` parser for every command: `off` stays the word (YAML 1.1 would read False)."""
    from simfed.spec.overrides import parse_sets

    assert parse_sets(["runtime.host.debug_checks=off", "cluster.nodes=3"]) == {
        "runtime.host.debug_checks": "off", "cluster.nodes": 3}
    # a version stays as typed (YAML would read 2.20 as the number 2.2)
    assert parse_sets(["runtime.comm.nccl_version=2.20", "training.lr=2.5"]) == {
        "runtime.comm.nccl_version": "2.20", "training.lr": 2.5}
    with pytest.raises(SpecError, match=r"--set 'cluster\.nodes': expected KEY=VALUE"):
        parse_sets(["cluster.nodes"])
    res = CliRunner().invoke(main, ["sweep", TINY, "--vary", "cluster.nodes=2",
                                    "--set", "runtime.host.debug_checks=off",
                                    "--set", "training.steps=1", "-a", "fsdp",
                                    "--out", str(tmp_path), "-j", "1", "-q"])
    assert res.exit_code == 0, res.output
    assert "1 ok" in res.output


@pytest.mark.parametrize("body, message", [
    ("  scenario: x.yaml\n  bogus: 1\n",
     r"s\.yaml: sweep\.bogus: unknown key; valid keys: algorithms, linked, name, scenario, set, "
     r"vary$"),
    ("  set: {a.b: 1}\n", r"sweep\.scenario: required \(the scenario file to vary"),
    ("  scenario: x.yaml\n  set: [1]\n",
     r"sweep\.set: input should be a valid dictionary, got \[1\]"),
    ("  scenario: x.yaml\n  linked: [{}]\n", r"sweep\.linked\[0\]: .*at least 1 item"),
    ("  scenario: x.yaml\n  name: ../up\n", r"sweep\.name: '\.\./up' is not a name"),
    ("  scenario: x.yaml\n  vary: {a.b: '4:1'}\n", r"sweep\.vary\.a\.b: range '4:1'"),
])
def test_sweep_file_mistakes_are_one_line(tmp_path, body, message):
    f = tmp_path / "s.yaml"
    f.write_text("sweep:\n" + body)
    with pytest.raises(SpecError, match=message) as exc:
        load_sweep_file(f)
    assert "\n" not in str(exc.value)


def test_axis_and_spec_are_frozen_and_checked():
    ax = Axis(keys=("cluster.nodes",), values=([2], [4]))  # lists become tuples
    assert ax.values == ((2,), (4,)) and hash(ax) == hash(Axis(keys=("cluster.nodes",),
                                                               values=((2,), (4,))))
    with pytest.raises(SpecError, match=r"^a\+b: 2 keys but a value tuple of 1$"):
        Axis(keys=("a", "b"), values=((1,),))
    with pytest.raises(SpecError, match=r"^a: no values$"):
        Axis(keys=("a",), values=())
    with pytest.raises(SpecError, match=r"^nodes: unknown key; valid keys: algorithms, axes"):
        SweepSpec(scenario=TINY, nodes=4)
    with pytest.raises(Exception, match="frozen"):
        ax.keys = ("b",)  # type: ignore[misc]
