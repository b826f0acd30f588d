"""Validation on pydantic: one-line errors naming the key path and the value, the objects it
builds, and the JSON Schema that `simfed schema --json` exports for editors."""

import copy
import dataclasses
import json

import jsonschema
import pytest
from click.testing import CliRunner

from simfed.cli import main
from simfed.spec import SpecError, limits, load_scenario_data, scenario_from_dict
from simfed.spec.scenario import Scenario
from simfed.spec.schema import json_schema, validate
from simfed.spec.yamlio import read_yaml

from ..conftest import SCENARIOS

SHIPPED = sorted(SCENARIOS.glob("*.yaml"))


def _cpu4():
    return load_scenario_data(SCENARIOS / "cpu4.yaml")


def _error(mutate) -> str:
    data = _cpu4()
    mutate(data)
    with pytest.raises(SpecError) as info:
        scenario_from_dict(data)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def _set(*path_and_value):
    *path, value = path_and_value

    def mutate(d):
        for p in path[:-1]:
            d = d.setdefault(p, {}) if isinstance(d, dict) else d[p]
        d[path[-1]] = value
    return mutate


@pytest.mark.parametrize("mutate, expect", [
    # a misspelt key: named, not the required key it leaves missing
    (lambda d: d["cluster"].update(nodez=d["cluster"].pop("nodes")),
     "cluster.nodez: unknown key; valid keys here: fabric, host_cores, name, node, nodes"),
    (lambda d: d["cluster"].pop("nodes"), "cluster.nodes: missing required key"),
    (_set("cluster", "node", "gpus", True), "cluster.node.gpus: expected an integer, got True"),
    (_set("cluster", "node", "gpus", "4"), "cluster.node.gpus: expected an integer, got '4'"),
    (_set("training", "lr", "1e-3"), "training.lr: expected a number, got '1e-3'"),
    (_set("runtime", "host", "debug_checks", False),
     "runtime.host.debug_checks: expected a string, got False (YAML reads a bare off/on"),
    (_set("runtime", "host", "sync_per_phase", "yes"),
     "runtime.host.sync_per_phase: expected true or false, got 'yes'"),
    (_set("algorithms", [{"name": "fsdp"}, {"name": "zero3"}]),
     "algorithms[1].name: must be one of fsdp, hsdp, fl_fsdp, fl_hsdp, got 'zero3'"),
    (_set("training", "betas", [0.9]), "training.betas: expected 2 items, got 1"),
    (_set("training", "activation_checkpointing", 5),
     "training.activation_checkpointing: expected true or false or one of none, full, "
     "selective, op, got 5"),
    (_set("training", "activation_checkpointing", "fulll"),
     "training.activation_checkpointing: expected true or false or one of none, full, "
     "selective, op, got 'fulll'"),
    (_set("validation", "rebench", ["units", "comm"]),
     "validation.rebench[1]: must be one of compute, units, optimizer, got 'comm'"),
    # cross-field rules (the dataclass's __post_init__) run inside pydantic, at their key
    (_set("model", "heads", 7), "model.hidden: "),
    # rules that were hand-written in CommRuntime / ComputeRuntime are types now
    (_set("runtime", "comm", "nccl_algorithms", ["ring", "foo"]),
     "runtime.comm.nccl_algorithms[1]: must be one of ring, tree, pat, nvls, got 'foo'"),
    (_set("runtime", "comm", "nccl_algorithms", []),
     "runtime.comm.nccl_algorithms: expected at least 1 item(s), got 0"),
    (_set("runtime", "comm", "nccl_version", "two"), "runtime.comm.nccl_version: 'two' does"),
    (_set("runtime", "comm", "op_bw_factor", {"broadcast": 0.5}),
     "runtime.comm.op_bw_factor.broadcast: must be one of all_gather, reduce_scatter, "
     "all_reduce, got 'broadcast'"),
    (_set("runtime", "comm", "op_bw_factor", {"all_gather": {"intra": -1}}),
     "runtime.comm.op_bw_factor.all_gather.intra: must be > 0, got -1.0"),
    (_set("runtime", "comm", "op_bw_factor", {"all_gather": {"intrx": 1}}),
     "runtime.comm.op_bw_factor.all_gather.intrx: must be one of intra, inter, intra_pair, "
     "inter_pair, got 'intrx'"),
    (_set("runtime", "compute", "gemm_tiles", [[128, 0, 1.0]]),
     "runtime.compute.gemm_tiles[0][1]: must be >= 1, got 0"),
    # limits.py's physical ranges keep their reasons
    (_set("cluster", "node", "nvlink", "latency_us", 1e9),
     "cluster.node.nvlink.latency_us: must be <= 1e+07, got 1000000000.0 (a time in "
     "microseconds is at most 10 s)"),
    (_set("stragglers", [1]), "stragglers: expected a mapping, got [1]"),
])
def test_errors_are_one_line_with_the_key_path_and_the_value(mutate, expect):
    msg = _error(mutate)
    assert msg.startswith(expect), msg


def test_an_empty_section_takes_the_defaults():
    data = _cpu4()
    data["stragglers"] = None
    assert scenario_from_dict(data).stragglers == Scenario.__dataclass_fields__[
        "stragglers"].default


def test_the_objects_are_the_frozen_dataclasses():
    scn = scenario_from_dict(_cpu4())
    from simfed.spec.scenario import ClusterSpec

    assert type(scn) is Scenario and type(scn.cluster) is ClusterSpec  # not a pydantic model
    assert dataclasses.is_dataclass(scn.cluster)
    assert hash(scn.cluster) == hash(scenario_from_dict(_cpu4()).cluster)
    with pytest.raises(AttributeError):
        scn.cluster.nodes = 3  # type: ignore[misc]
    assert scn.runtime.comm.nccl_algorithms == ("ring", "tree", "pat", "nvls")
    assert isinstance(scn.training.lr, float) and isinstance(scn.cluster.nodes, int)


def test_validate_takes_any_declared_type():
    assert validate(tuple[int, ...], [1, 2.0], "sweep.values") == (1, 2)
    with pytest.raises(SpecError, match=r"^sweep\.values\[1\]: expected an integer, got 'x'$"):
        validate(tuple[int, ...], [1, "x"], "sweep.values")


@pytest.fixture(scope="module")
def schema():
    """Of a scenario with its includes resolved."""
    s = json_schema(Scenario, "simfed scenario", resolved=True)
    jsonschema.Draft202012Validator.check_schema(s)
    return s


@pytest.fixture(scope="module")
def editor_schema():
    """Of a scenario file as written (`include:` anywhere, no key required)."""
    s = json_schema(Scenario, "simfed scenario")
    jsonschema.Draft202012Validator.check_schema(s)
    return s


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_scenario_validates_against_the_json_schema(schema, editor_schema, path):
    resolved = load_scenario_data(path)
    assert not list(jsonschema.Draft202012Validator(schema).iter_errors(resolved))
    raw = read_yaml(path, "scenario")  # as an editor sees it: `include:` keys, partial mappings
    assert not list(jsonschema.Draft202012Validator(editor_schema).iter_errors(raw))
    # the file as written does not pass the resolved schema when its includes supply keys
    if "include" in raw:
        assert list(jsonschema.Draft202012Validator(schema).iter_errors(raw))


@pytest.mark.parametrize("mutate, where", [
    (_set("cluster", "nodes", 0), ["cluster", "nodes"]),
    (_set("cluster", "nodes", 10**6), ["cluster", "nodes"]),
    (_set("cluster", "nodez", 1), ["cluster"]),
    (_set("runtime", "comm", "model", "bogus"), ["runtime", "comm", "model"]),
    (_set("training", "steps", "many"), ["training", "steps"]),
    (lambda d: d["model"].pop("hidden"), ["model"]),
    (_set("runtime", "comm", "op_bw_factor", {"broadcast": 0.5}),
     ["runtime", "comm", "op_bw_factor"]),
])
def test_a_broken_scenario_does_not_validate(schema, editor_schema, mutate, where):
    data = _cpu4()
    mutate(data)
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(data))
    assert any(list(e.absolute_path)[:len(where)] == where for e in errors), \
        [list(e.absolute_path) for e in errors]
    with pytest.raises(SpecError):  # the loader agrees
        scenario_from_dict(data)
    missing = any(e.validator == "required" for e in errors)
    assert missing or list(jsonschema.Draft202012Validator(editor_schema).iter_errors(data))


def test_the_json_schema_has_the_docs_bounds_and_choices(schema):
    defs = schema["$defs"]
    nodes = defs["ClusterSpec"]["properties"]["nodes"]
    assert nodes["type"] == "integer" and nodes["minimum"] == 1
    assert nodes["maximum"] == limits.PATH_LIMITS["cluster.nodes"].hi
    topo = defs["FabricSpec"]["properties"]["topology"]
    assert topo["enum"] == ["ideal", "fat_tree", "dragonfly_plus"]
    assert "NVSwitch" in defs["NvlinkSpec"]["properties"]["topology"]["description"]
    assert defs["GpuSpec"]["properties"]["peak_tflops"]["exclusiveMinimum"] == 0


def test_simfed_schema_json_prints_the_schema(schema, editor_schema):
    res = CliRunner().invoke(main, ["schema", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == json.loads(json.dumps(editor_schema))
    res = CliRunner().invoke(main, ["schema", "--json", "--resolved"])
    assert json.loads(res.output) == json.loads(json.dumps(schema))
    text = CliRunner().invoke(main, ["schema"])
    assert text.exit_code == 0 and "nodes: int" in text.output


def test_a_copy_of_the_data_is_not_changed():
    data = _cpu4()
    before = copy.deepcopy(data)
    scenario_from_dict(data)
    assert data == before
