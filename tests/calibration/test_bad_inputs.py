"""`simfed calibrate` on damaged inputs: one error line naming the file, the row and the field,
exit status 2; never an internal error (exit 3) and never a profile fitted to nonsense."""

import json

import pytest
from click.testing import CliRunner

from simfed.cli import main

from ..conftest import ROOT
from .test_validate import _bench

TINY = ROOT / "tests" / "fixtures" / "tiny2x2.yaml"


def _calibrate(tmp_path, *inputs):
    res = CliRunner().invoke(main, ["calibrate", *map(str, inputs), "--scenario", str(TINY),
                                    "--out", str(tmp_path / "p.yaml")])
    assert "Traceback" not in res.output and "internal error" not in res.output, res.output
    return res


def _refused(res, *needles):
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, res.output
    for n in needles:
        assert n in lines[0], lines[0]


def _damaged_bench(tmp_path, change):
    folder = tmp_path / "bench"
    _bench(folder, 0.4)
    p = folder / "bench-summary.json"
    data = json.loads(p.read_text())
    change(data)
    p.write_text(json.dumps(data))
    return folder


def _set(table, i, key, value):
    def change(d):
        d[table][i][key] = value
    return change


def _meta(key, value):
    def change(d):
        d["meta"][key] = value
    return change


@pytest.mark.parametrize("change, needles", [
    # before: ZeroDivisionError in ranks_per_core (exit 3)
    (_meta("ranks_per_node", 1e-9), ["meta.ranks_per_node", "1e-09"]),
    # before: ValueError max() of an empty sequence in the ring model (exit 3)
    (_meta("nodes", -1), ["meta.nodes", "-1"]),
    (_meta("nodes", True), ["meta.nodes"]),
    (_meta("link_rate_Gbps", -0.5), ["meta.link_rate_Gbps", "-0.5"]),
    # before: the fit overflowed, every unknown was set aside and covariance() of nothing
    # raised ValueError (exit 3)
    (_set("comm", 2, "nbytes", 10**30), ["comm[2].nbytes", "1000000000000000000000000000000"]),
    # before: residuals not finite in least_squares (exit 3)
    (_set("comm", 0, "time_s", 1e-300), ["comm[0].time_s", "1e-300"]),
    (_set("comm", 0, "time_s", float("nan")), ["comm[0].time_s", "finite"]),
    (_set("comm", 0, "time_s", -0.1), ["comm[0].time_s", "-0.1"]),
    (_set("comm", 0, "group_size", 0), ["comm[0].group_size", "0"]),
    # before: accepted silently (a group of another kind, a group larger than the nodes)
    (_set("comm", 0, "group", "abc"), ["group 'abc'"]),
    (_set("comm", 0, "group_size", 3), ["3 ranks", "2 ranks per node"]),
    # before: ZeroDivisionError in node_block_groups (exit 3)
    (_set("comm", 0, "group", "nodes0"), ["a block of 0 nodes"]),
    # before: an error that named no file
    (_set("comm", 0, "op", "abc"), ["bench-summary.json", "op 'abc'"]),
])
def test_a_damaged_bench_summary_is_one_line_naming_row_and_field(tmp_path, change, needles):
    folder = _damaged_bench(tmp_path, change)
    _refused(_calibrate(tmp_path, folder), "bench-summary.json", *needles)
    assert not (tmp_path / "p.yaml").exists()


def test_odd_but_possible_bench_numbers_still_fit(tmp_path):
    """Outliers a real bench can record (a 1 ns and a 10 day case, a 512 TiB buffer) are fitted,
    not refused (before: the 512 TiB case set every unknown aside and covariance() of none
    raised ValueError, exit 3)."""
    def change(d):
        d["comm"][0]["time_s"] = 1e-9
        d["comm"][1]["time_s"] = 1e6
        d["comm"][2]["nbytes"] = 2**49
    folder = _damaged_bench(tmp_path, change)
    res = _calibrate(tmp_path, folder)
    assert res.exit_code == 0, res.output
