"""The input contract of the loader: every malformed or hostile file ends in one SpecError line
naming the file and the limit, quickly (no hang, no traceback, no silent acceptance)."""

import math

import pytest
import yaml

from simfed.spec import SpecError, load_scenario, load_scenario_data
from simfed.spec.scenario import ranks_per_core
from simfed.spec.yamlio import MAX_DEPTH, MAX_FILE_BYTES, parse_yaml, read_yaml

from ..conftest import SCENARIOS


def _err(fn, *args) -> str:
    with pytest.raises(SpecError) as info:
        fn(*args)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_duplicate_keys_are_refused_with_both_lines():
    msg = _err(parse_yaml, "a: 1\nb: 2\na: 3\n", "s.yaml")
    assert "duplicate key 'a'" in msg and "line 3" in msg and "first at line 1" in msg
    # a merge key's keys may be overridden: that is what merging is for
    assert parse_yaml("base: &b {x: 1}\nc:\n  <<: *b\n  x: 2\n", "s.yaml")["c"] == {"x": 2}


def test_deep_nesting_is_refused_not_a_recursion_error():
    assert "nesting deeper than" in _err(parse_yaml, "a: " + "[" * 5000 + "]" * 5000, "s")
    ok = "a: " + "[" * (MAX_DEPTH - 2) + "]" * (MAX_DEPTH - 2)
    data, depth = parse_yaml(ok, "s")["a"], 0
    while data:
        data, depth = data[0], depth + 1
    assert depth == MAX_DEPTH - 3  # every level kept


def test_alias_bomb_and_self_reference_are_refused():
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    assert "alias bomb" in _err(parse_yaml, "\n".join(lines), "bomb.yaml")
    assert "contains it" in _err(parse_yaml, "a: &a [1, *a]\n", "rec.yaml")
    # sharing a value a few times is fine
    assert parse_yaml("a: &a [1, 2]\nb: *a\n", "s") == {"a": [1, 2], "b": [1, 2]}


@pytest.mark.parametrize("raw, expect", [
    ("a: 1\n".encode("utf-16"), "UTF-16"),
    ("a: caf\xe9\n".encode("latin-1"), "not UTF-8"),
    (b"\x00\x01\x02garbage\xff", "not UTF-8"),
    (b"a: 1\x00\n", "NUL"),
])
def test_non_utf8_files_are_refused(tmp_path, raw, expect):
    p = tmp_path / "x.yaml"
    p.write_bytes(raw)
    assert expect in _err(read_yaml, p, "scenario")


def test_utf8_with_bom_is_read(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_bytes("\ufeffa: 1\n".encode())
    assert read_yaml(p, "scenario") == {"a": 1}


def test_devices_directories_and_big_files_are_refused_before_reading(tmp_path):
    assert "not a regular file" in _err(read_yaml, "/dev/zero", "scenario")
    assert "directory" in _err(read_yaml, tmp_path, "scenario")
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)
    assert f"{MAX_FILE_BYTES:,}" in _err(read_yaml, big, "scenario")


def test_include_cycle_is_named(tmp_path):
    (tmp_path / "a.yaml").write_text("include: b.yaml\nx: 1\n")
    (tmp_path / "b.yaml").write_text("include: a.yaml\ny: 1\n")
    assert "include cycle: a.yaml -> b.yaml -> a.yaml" in _err(load_scenario_data,
                                                               tmp_path / "a.yaml")


def test_include_fan_out_is_bounded(tmp_path):
    for i in range(13):  # 3**13 includes if expanded
        (tmp_path / f"f{i}.yaml").write_text(
            "\n".join(f"k{j}: {{include: f{i + 1}.yaml}}" for j in range(3)) + "\n")
    (tmp_path / "f13.yaml").write_text("z: 1\n")
    assert "included files in all" in _err(load_scenario_data, tmp_path / "f0.yaml")


def test_include_of_a_device_is_refused(tmp_path):
    (tmp_path / "s.yaml").write_text("cluster:\n  include: /dev/zero\n")
    assert "cluster.include: /dev/zero is not a regular file" in _err(
        load_scenario_data, tmp_path / "s.yaml")


def _cpu4():
    return load_scenario_data(SCENARIOS / "cpu4.yaml")  # includes resolved


@pytest.mark.parametrize("dotted, value, expect", [
    ("cluster.node.gpu.peak_tflops", math.inf, "must be a finite number"),
    ("cluster.node.gpu.hbm_bw_GBps", math.nan, "must be a finite number"),
    ("cluster.node.gpu.memory_GiB", 10**400, "out of range"),
    ("cluster.node.nics.bw_Gbps", 1e308, "out of range"),
    ("training.steps", 2**63, "out of range"),
    ("training.lr", -math.inf, "must be a finite number"),
])
def test_numbers_must_be_finite_and_bounded(tmp_path, dotted, value, expect):
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(_cpu4()))
    msg = _err(load_scenario, p, {dotted: value})
    assert msg.startswith(dotted) and expect in msg


def test_ranks_per_core_closed_form_matches_the_per_rank_count():
    """The per-core load is computed per node residue, not per rank and core: same numbers."""
    from simfed.spec.scenario import node_cores

    def per_rank(ranks, g, cpu, host):
        load: dict[int, float] = {}
        for r in ranks:
            cores = node_cores(r // g, cpu, host)
            for c in cores:
                load[c] = load.get(c, 0.0) + 1.0 / len(cores)
        return max([1.0, *load.values()])

    for g in (1, 2, 3):
        for nodes in (1, 2, 5, 7):
            for cpu in (0, 1, 2, 3, 5):
                for host in (0, 1, 2, 4, 6):
                    if not cpu and not host:
                        continue
                    ranks = range(0, nodes * g, 2)  # a subset, unevenly over the nodes
                    assert ranks_per_core(ranks, g, cpu, host) == pytest.approx(
                        per_rank(ranks, g, cpu, host))


@pytest.mark.parametrize("dotted, value, expect", [
    ("validation.shapes", [{"name": "a", "set": {"cluster.nodez": 2}}],
     "validation.shapes[0].set: cluster.nodez: unknown key"),
    ("validation.shapes", [{"name": "a", "algorithms": ["bogus"]}],
     "validation.shapes[0].algorithms[0]: algorithm 'bogus' is not in this scenario"),
    ("validation.bench_sets", [{"cluster.node.gpus": 2, "skip": "units,bogus"}],
     "validation.bench_sets[0].skip: 'bogus'"),
    ("validation.bench_sets", [{"training.stepz": 3}], "validation.bench_sets[0]: training.stepz"),
    ("validation.shapes", [{"name": "../x"}], "validation.shapes[0].name: '../x' is not a name"),
    ("validation.shapes", [{"name": "a"}, {"name": "a"}],
     "validation.shapes[1].name: 'a' is also validation.shapes[0]'s name"),
    ("algorithms", [{"name": "fsdp", "label": "hsdp"}, {"name": "hsdp"}],
     "algorithms[0].label: 'hsdp' is the name of another algorithm"),
    ("algorithms", [{"name": "fsdp", "label": "../x"}],
     "algorithms[0].label: '../x' is not a name"),
    ("algorithms", [{"name": "fsdp", "label": "X"}, {"name": "hsdp", "label": "x"}],
     "algorithms[1].label: 'x' names algorithms[0] too"),
    ("model.layers", 10_000, "model.layers: must be <= 256"),
    ("cluster.nodes", 600_000, "cluster.nodes: must be <= 524288"),
    ("stragglers.jitter.sigma", 30, "stragglers.jitter.sigma: must be <= 1"),
    ("cluster.node.nvlink.latency_us", 1e12, "at most 10 s"),
    ("runtime.comm.op_bw_factor", {"all_gather": 1e-9}, "a factor is between 0.001 and 1000"),
])
def test_scenario_level_faults_are_caught_at_load_time(tmp_path, dotted, value, expect):
    data = _cpu4()
    data["validation"] = {}
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data))
    assert expect in _err(load_scenario, p, {dotted: value})


def test_world_limit_names_the_numbers(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(_cpu4()))
    msg = _err(load_scenario, p, {"cluster.nodes": 2**18, "cluster.node.gpus": 4,
                                  "cluster.host_cores": 0})
    assert "262,144 nodes x 4 GPUs = 1,048,576 GPUs; the limit is 524,288" in msg
    msg = _err(load_scenario, p, {"cluster.nodes": 512, "cluster.host_cores": 8})
    assert "1,024 ranks is over the limit of 512" in msg


def test_algorithm_lookup_prefers_labels_and_refuses_ambiguity(tmp_path):
    data = _cpu4()
    data["algorithms"] = [{"name": "fsdp", "label": "A"}, {"name": "fsdp", "label": "B"}]
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data))
    scn = load_scenario(p)
    assert scn.algorithm("B").label == "B"
    assert "ambiguous" in _err(scn.algorithm, "fsdp")
    assert "empty" in _err(scn.algorithm, "")


def test_exponent_floats_without_a_dot_are_numbers():
    """YAML 1.2's floats (3e-5) in scenario files and --set values, not strings."""
    from simfed.spec.overrides import parse_sets
    from simfed.spec.yamlio import parse_yaml

    assert parse_yaml("lr: 3e-5\nb: 1E+3\nc: -2e3\nd: 1e5x\n", "x") == {
        "lr": 3e-5, "b": 1000.0, "c": -2000.0, "d": "1e5x"}
    assert parse_sets(["convergence.data_constants.optimal_lr=3e-5"]) == {
        "convergence.data_constants.optimal_lr": 3e-5}
    # what simfed writes reads back as it was: a string that looks like such a number is quoted
    from simfed.spec.yamlio import dump_yaml

    data = {"name": "1e3", "lr": 3e-5, "n": 2, "v": "2.20"}
    assert "'1e3'" in dump_yaml(data) and parse_yaml(dump_yaml(data), "x") == data
