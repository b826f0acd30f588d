"""Scenario loading: includes, overrides, and one-line errors naming the key path and value."""

import pytest
import yaml

from simfed.spec import SpecError, load_scenario

from ..conftest import SCENARIOS


def test_paper_scenario_loads():
    s = load_scenario(SCENARIOS / "512gpu.yaml")
    assert s.cluster.world == 512
    assert s.model.total_params == 7_504_924_672
    assert [a.name for a in s.algorithms] == ["fsdp", "hsdp", "fl_fsdp", "fl_hsdp"]
    assert s.runtime.comm.nic_efficiency == pytest.approx(0.92)


def test_overrides():
    s = load_scenario(SCENARIOS / "512gpu.yaml",
                      {"cluster.nodes": 64, "algorithms.fl_hsdp.group_nodes": 4})
    assert s.cluster.world == 256 and s.algorithm("fl_hsdp").group_nodes == 4


def _write(tmp_path, data):
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _base():
    return yaml.safe_load((SCENARIOS / "cpu4.yaml").read_text())


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["training"].update(sequence_length=5),
         "training.sequence_length: unknown key"),
        (lambda d: d["training"].update(seq_len="long"),
         "training.seq_len: expected an integer, got 'long'"),
        (lambda d: d.update(cluster={"include": "clusters/cpu4.yaml",
                                     "node": {"nics": {"bw_Gbps": -5}}}),
         "cluster.node.nics.bw_Gbps: must be > 0, got -5.0"),
        (lambda d: d.pop("model"), "model: missing required key"),
        (lambda d: d["algorithms"].append({"name": "zero3"}),
         "algorithms[4].name: must be one of fsdp, hsdp, fl_fsdp, fl_hsdp, got 'zero3'"),
        (lambda d: d["algorithms"].__setitem__(2, {"name": "fl_fsdp", "group_nodes": 3,
                                                   "aggregate_every": 2}),
         "group_nodes: 3 does not divide the cluster's 2 nodes"),
    ],
)
def test_malformed_scenarios_give_one_line_errors(tmp_path, mutate, message):
    data = _base()
    mutate(data)
    path = _write(tmp_path, data)
    # includes are relative to the including file: copy the referenced folders' files
    (tmp_path / "clusters").mkdir()
    (tmp_path / "models").mkdir()
    for sub in ("clusters", "models"):
        for f in (SCENARIOS / sub).glob("*.yaml"):
            (tmp_path / sub / f.name).write_text(f.read_text())
    with pytest.raises(SpecError) as exc:
        load_scenario(path)
    text = str(exc.value)
    assert message in text
    assert "\n" not in text


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(SpecError, match="file not found"):
        load_scenario(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(SpecError, match="invalid YAML"):
        load_scenario(bad)


def test_a_bad_value_from_a_profile_names_the_profile(tmp_path):
    from simfed.spec import load_scenario
    from simfed.spec.schema import SpecError

    prof = tmp_path / "p.yaml"
    prof.write_text("runtime:\n  comm:\n    launch_us: -5\n")
    with pytest.raises(SpecError, match=rf"^{prof}: runtime\.comm\.launch_us: must be >= 0"):
        load_scenario("scenarios/h100-1024.yaml", profile=prof)
    # a --set that replaces it is the user's value: no profile named
    with pytest.raises(SpecError, match=r"^runtime\.comm\.launch_us: must be >= 0, got -3"):
        load_scenario("scenarios/h100-1024.yaml", {"runtime.comm.launch_us": -3}, profile=prof)
