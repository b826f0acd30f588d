"""fabric.tree_level_us: the latency a tree's levels across nodes pay beyond NCCL's model even
measured alone (rings pay none), and its data: validation/published/leonardo-allreduce.yaml
(De Sensi et al. SC24, NCCL all-reduce on Leonardo by message size, split by node count)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from simfed.calibration import published_collectives as pc
from simfed.calibration import shared_fabric
from simfed.collectives.nccl import NcclModel
from simfed.hardware import Hardware
from simfed.spec import load_scenario

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "scenarios" / "h100-1024.yaml"
PAPER = ROOT / "scenarios" / "512gpu.yaml"
TABLE = ROOT / "validation" / "published" / "leonardo-allreduce.yaml"
FIT_NODES, CHECK_NODES = {1, 2, 16, 64, 256}, {8, 32, 128}


def _model(algos, **sets) -> NcclModel:
    scn = load_scenario(H100, {"cluster.fabric.loaded_step_scope": "nodes", **sets})
    return NcclModel(hw=Hardware.from_spec(scn.cluster, scn.runtime), algorithms=algos)


@pytest.mark.parametrize("loaded", [0.0, 20.0, 150.0])
def test_a_tree_pays_the_larger_of_its_level_latency_and_the_loaded_step_a_ring_only_the_latter(
        loaded):
    level, nodes, size = 100.0, 16, 2**24
    for algos, steps, per in ((("tree",), 2 * math.log2(nodes), max(level, loaded)),
                              (("ring",), 2 * (8 * nodes - 1), loaded)):
        base = _model(algos).best("all_reduce", size, 8 * nodes, nodes)
        got = _model(algos, **{"cluster.fabric.tree_level_us": level,
                               "cluster.fabric.loaded_step_us": loaded}
                     ).best("all_reduce", size, 8 * nodes, nodes)
        assert (got.algorithm, got.protocol) == (base.algorithm, base.protocol)
        assert got.time_s - base.time_s == pytest.approx(steps * per * 1e-6)


def test_inside_one_leaf_switch_a_tree_pays_no_level_latency():
    scn = load_scenario(PAPER, {})
    hw = Hardware.from_spec(scn.cluster, scn.runtime)
    assert hw.tree_level_us > 0 and scn.cluster.fabric.nodes_per_leaf == 10
    assert hw.tree_level_s(10) == 0.0 and hw.tree_level_s(11) == pytest.approx(
        hw.tree_level_us * 1e-6)


def test_a_negative_level_latency_is_a_one_line_error():
    from simfed.spec.schema import SpecError

    with pytest.raises(SpecError, match="tree_level_us"):
        load_scenario(PAPER,
                      {"cluster.fabric.tree_level_us": -1})


def test_the_table_is_split_by_node_count_and_every_entry_names_its_source_lines():
    data = pc.load(TABLE)
    tables = data["tables"]
    assert {t["nodes"] for t in tables if t["set"] == "fit"} == FIT_NODES
    assert {t["nodes"] for t in tables if t["set"] == "check"} == CHECK_NODES
    for t in tables:
        assert "description.csv" in t["source"]["where"] and t["rows"]
        assert all(2**20 <= size <= 2**27 for size, _ in t["rows"])


def test_the_leonardo_value_is_the_fit_rows_grid_choice():
    """The cluster's tree_level_us is the 6.25 us grid value with the smallest median |busbw
    error| over the fit rows beyond two nodes (`python -m simfed.calibration.shared_fabric
    levels`), and it earns its place there."""
    grid = shared_fabric.level_grid()
    best = min(grid, key=lambda g: g[1])
    shipped = load_scenario(PAPER, {}).cluster.fabric
    assert best[0] == shipped.tree_level_us
    assert best[1] < 0.5 * dict(grid)[0.0]


def test_the_check_rows_scored_once_as_the_docs_state():
    """The held-out rows (8, 32, 128 nodes) with the fitted latency and without it, as
    docs/collectives.md and scenarios/clusters/leonardo.yaml state them."""
    rows = [r for r in shared_fabric.sizes() if r["set"] == "check"]
    on = statistics.median(abs(r["error"]) for r in rows)
    off = statistics.median(abs(r["off_error"]) for r in rows)
    assert len(rows) == 18 and on < off
    doc = " ".join((ROOT / "docs" / "collectives.md").read_text().split())
    assert f"{100 * off:.1f}% -> {100 * on:.1f}%" in doc
    quiet = [r for r in rows if r["nodes"] > 10 and "sl1" in r["table"]]
    q_on = statistics.median(abs(r["error"]) for r in quiet)
    q_off = statistics.median(abs(r["off_error"]) for r in quiet)
    assert f"{100 * q_off:.1f}% -> {100 * q_on:.1f}%" in doc
