"""The Python API (simfed.load / simulate / sweep / collective) against the command line it
underlies: the same numbers, the same JSON byte for byte, the same one-line errors."""

import json

import pytest
from click.testing import CliRunner

import simfed
from simfed.analysis.report import dumps
from simfed.api.results import AlgorithmResult, SimulationResult
from simfed.cli import main
from simfed.engine import simulate as engine_simulate
from simfed.spec import load_scenario

from .conftest import ROOT, SCENARIOS

TINY = ROOT / "tests" / "fixtures" / "tiny2x2.yaml"


@pytest.mark.parametrize("name", ["512gpu.yaml", "tiny-time-to-target.yaml", "testbed.yaml"])
def test_result_is_the_engines_json_unchanged(name):
    """Typed records read every field; to_dict() gives the engine's result back (keys the
    records do not name kept in `extra`), to_json() the bytes simfed run --json writes."""
    out, _ = engine_simulate(load_scenario(SCENARIOS / name, {"training.steps": 8}))
    res = SimulationResult.from_dict(out)
    assert res.to_dict() == out
    assert res.to_json() == dumps(out)
    assert [a.name for a in res.algorithms] == [a["name"] for a in out["algorithms"]]
    a = res.algorithms[-1]
    assert isinstance(a, AlgorithmResult)
    assert a.step_time_s == out["algorithms"][-1]["step_time_s"]
    assert a.phases_s.forward == out["algorithms"][-1]["phases_s"]["forward"]
    assert a.plan.world == out["cluster"]["world"]


def test_simulate_is_simfed_run_json(tmp_path):
    path = tmp_path / "out.json"
    cli = CliRunner().invoke(main, ["run", str(TINY), "--json", str(path), "-q",
                                    "--set", "training.steps=4", "-a", "fsdp", "-a", "fl_fsdp"])
    assert cli.exit_code == 0, cli.output
    res = simfed.simulate(simfed.load(TINY, {"training.steps": 4}), ["fsdp", "fl_fsdp"])
    assert res.to_json() == path.read_text()
    assert res.algorithm("FL+FSDP").speedup == json.loads(res.to_json())["algorithms"][1][
        "speedup"]
    with pytest.raises(KeyError, match="no algorithm 'hsdp'"):
        res.algorithm("hsdp")


def test_time_to_target_fields():
    res = simfed.simulate(simfed.load(SCENARIOS / "tiny-time-to-target.yaml"))
    assert res.convergence is not None and res.convergence["target_loss"] is not None
    first = res.first_to_target
    reached = [a for a in res.algorithms if a.time_to_target_s is not None]
    assert first == min(reached, key=lambda a: a.time_to_target_s).label
    assert all(a.steps_to_target is not None for a in reached)


def test_load_errors_are_one_line_spec_errors_with_the_key_path():
    with pytest.raises(simfed.SpecError, match=r"^training\.seq_len: must be >= 1, got -1$"):
        simfed.load(TINY, {"training.seq_len": -1})
    with pytest.raises(simfed.SpecError, match=r"^scenario: file not found: "):
        simfed.load(ROOT / "no-such.yaml")
    with pytest.raises(simfed.SpecError, match="expected a file path or a mapping"):
        simfed.load(42)  # type: ignore[arg-type]


def test_load_a_dict_resolves_includes_against_base_dir():
    import yaml

    data = yaml.safe_load((SCENARIOS / "512gpu.yaml").read_text())
    from_dict = simfed.load(data, {"training.steps": 4}, base_dir=SCENARIOS)
    from_file = simfed.load(SCENARIOS / "512gpu.yaml", {"training.steps": 4})
    assert from_dict == from_file
    with pytest.raises(simfed.SpecError, match="include"):
        simfed.load(data, base_dir=ROOT)  # its includes are relative to scenarios/


def test_sweep_rows_and_frame(tmp_path):
    rows = simfed.sweep(simfed.load(TINY), {"cluster.nodes": [2, 3]}, {"training.steps": 1},
                        algorithms=["fsdp", "fl_fsdp"], jobs=1)
    assert [(r["params"]["cluster.nodes"], r["name"]) for r in rows.rows] == [
        (2, "fsdp"), (2, "fl_fsdp"), (3, "fsdp"), (3, "fl_fsdp")]
    assert rows.meta["name"] == "tiny2x2"
    csv_text = rows.to_csv()
    assert "step_times_s" not in csv_text.splitlines()[0]  # arrays stay in the JSON
    assert "step_times_s" in rows.to_json()
    pd = pytest.importorskip("pandas")
    frame = rows.to_frame()
    assert isinstance(frame, pd.DataFrame) and len(frame) == 4
    assert list(frame["params.cluster.nodes"]) == [2, 2, 3, 3]
    written = rows.write(csv=tmp_path / "s.csv", json=tmp_path / "s.json")
    assert [p.name for p in written] == ["s.csv", "s.json"]
    assert (tmp_path / "s.csv").read_text() == csv_text


def test_sweep_from_a_dict_and_a_linked_axis():
    import yaml

    data = yaml.safe_load(TINY.read_text())
    rows = simfed.sweep(data, set={"training.steps": 1}, algorithms=["fl_fsdp"], jobs=1,
                        linked=[{"cluster.nodes": [2, 4],
                                 "algorithms.fl_fsdp.group_nodes": [1, 2]}])
    assert [r["params"] for r in rows.rows] == [
        {"cluster.nodes": 2, "algorithms.fl_fsdp.group_nodes": 1},
        {"cluster.nodes": 4, "algorithms.fl_fsdp.group_nodes": 2}]
    assert rows.meta["scenario"] == "<dict>"
    with pytest.raises(simfed.SpecError, match="nothing to vary"):
        simfed.sweep(data)


def test_collective_is_simfed_collective():
    table = simfed.collective(SCENARIOS / "h100-1024.yaml", nodes=2, max_bytes="4M")
    cli = CliRunner().invoke(main, ["collective", str(SCENARIOS / "h100-1024.yaml"),
                                    "--nodes", "2", "--max-bytes", "4M"])
    assert cli.exit_code == 0, cli.output
    lines = [ln.split() for ln in cli.output.splitlines() if not ln.startswith("#")]
    assert [int(r[0]) for r in lines] == [r.size_bytes for r in table.rows] == [2**20, 2**21,
                                                                               2**22]
    assert [float(r[3]) for r in lines] == [round(r.busbw_GBps, 2) for r in table.rows]
    assert table.ranks == 16
    with pytest.raises(simfed.SpecError, match="is above --max-bytes"):
        simfed.collective(SCENARIOS / "h100-1024.yaml", min_bytes="8M", max_bytes="1M")


def test_sweep_names_the_function_and_the_package_stays_importable():
    from simfed.sweep import run_sweep  # the subpackage

    assert callable(simfed.sweep) and simfed.sweep.__module__ == "simfed.api"
    assert run_sweep.__module__ == "simfed.sweep.runner"


def test_how_sure_gives_the_lines_simfed_run_prints():
    scn = simfed.load(SCENARIOS / "512gpu.yaml", set={"training.steps": 4})
    res = simfed.simulate(scn)
    lines = res.how_sure(scn)
    printed = CliRunner().invoke(main, ["run", str(SCENARIOS / "512gpu.yaml"),
                                        "--set", "training.steps=4"]).output
    flat = " ".join(printed.split())
    assert lines and all(" ".join(line.split()) in flat for line in lines)
    assert lines[0].startswith("how sure: on ")
    cpu = simfed.load(TINY)
    assert simfed.simulate(cpu).how_sure(cpu) == []  # not the kernel model: no published claim
