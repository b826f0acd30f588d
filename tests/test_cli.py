"""The simfed command line: results, JSON, traces, and one-line errors without tracebacks."""

import json
import subprocess
import sys

from click.testing import CliRunner

from simfed.cli import main
from simfed.spec import read_trace

from .conftest import ROOT, SCENARIOS

TINY = str(ROOT / "tests" / "fixtures" / "tiny2x2.yaml")


def test_run_writes_json_with_the_contract_fields(tmp_path):
    out = tmp_path / "out.json"
    res = CliRunner().invoke(main, ["run", TINY, "--json", str(out), "-q"])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    names = [a["name"] for a in data["algorithms"]]
    assert names == ["fsdp", "hsdp", "fl_fsdp", "fl_hsdp"]
    for a in data["algorithms"]:
        for key in ("step_time_s", "tokens_per_s", "samples_per_s", "peak_memory_bytes",
                    "global_batch_sequences", "aggregations", "epoch_time_s"):
            assert isinstance(a[key], (int, float)), key
        assert set(a["phases_s"]) >= {"forward", "backward", "optimizer", "aggregation"}
        assert set(a["bytes_by_link"]) >= {"nvlink", "inter_node"}


def test_run_writes_traces(tmp_path):
    res = CliRunner().invoke(main, ["run", TINY, "-a", "fsdp", "--trace", str(tmp_path), "-q"])
    assert res.exit_code == 0, res.output
    meta, spans = read_trace(tmp_path / "fsdp.jsonl")
    assert meta["algorithm"] == "fsdp" and meta["source"] == "simfed"
    assert {s.cat for s in spans} >= {"compute", "comm", "phase", "step"}
    chrome = json.loads((tmp_path / "fsdp.trace.json").read_text())
    assert any(e["ph"] == "X" for e in chrome["traceEvents"])


def test_algorithms_as_a_comma_list_as_realrun_takes_them(tmp_path):
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, ["run", TINY, "-a", "fsdp,fl_fsdp", "-q", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert [a["name"] for a in json.loads(out.read_text())["algorithms"]] == ["fsdp", "fl_fsdp"]
    res = CliRunner().invoke(main, ["run", TINY, "-a", "fsdp,bogus", "-q"])
    assert res.exit_code == 2 and "bogus" in res.output


def test_bad_scenario_is_one_line_and_nonzero(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((SCENARIOS / "cpu4.yaml").read_text().replace("seq_len: 32", "seq_len: -1")
                   .replace("include: clusters/", f"include: {SCENARIOS}/clusters/")
                   .replace("include: models/", f"include: {SCENARIOS}/models/"))
    out = tmp_path / "out.json"
    out.write_text("precious")
    proc = subprocess.run([sys.executable, "-m", "simfed.cli", "run", str(bad), "--json",
                           str(out)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: training.seq_len: must be >= 1, got -1"
    assert "Traceback" not in proc.stderr
    assert out.read_text() == "precious"  # nothing already written is lost


def test_bad_set_value():
    res = CliRunner().invoke(main, ["run", TINY, "--set", "algorithms.fl_fsdp.group_nodes=3",
                                    "-q"])
    assert res.exit_code == 2
    assert "group_nodes: 3 does not divide the cluster's 2 nodes" in res.output


def test_run_with_a_profile_uses_its_numbers(tmp_path):
    prof = tmp_path / "p.yaml"
    prof.write_text("cluster: {node: {nics: {bw_Gbps: 1.0}}}\nruntime: {comm: {launch_us: 0}}\n")
    fast, slow = tmp_path / "fast.json", tmp_path / "slow.json"
    assert CliRunner().invoke(main, ["run", TINY, "-q", "--json", str(fast)]).exit_code == 0
    res = CliRunner().invoke(main, ["run", TINY, "-q", "--json", str(slow), "--profile",
                                    str(prof)])
    assert res.exit_code == 0, res.output
    f = json.loads(fast.read_text())["algorithms"][0]["step_time_s"]
    s = json.loads(slow.read_text())["algorithms"][0]["step_time_s"]
    assert s > f  # 1 Gb/s rails instead of the fixture's 10 Gb/s


def test_validate_show_prints_a_saved_validation(tmp_path):
    """`validate --show FILE` prints a validation saved with --json as validate prints it, and
    runs nothing; a file that is not one is one line, exit 2."""
    import json

    saved = ROOT / "results" / "validate-run24.json"
    res = CliRunner().invoke(main, ["validate", "--show", str(saved)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    check = json.loads(saved.read_text())["summary"]["check"]
    assert (f"check set: median |error| {100 * check['median_abs_error']:.1f}% over "
            f"{check['runs']} runs") in res.output
    bad = tmp_path / "bad.json"
    for text, msg in (("{", "not JSON"), ("[1]", "not a validation"),
                      ('{"runs": [{}], "speedups": [], "summary": {}}', "damaged validation")):
        bad.write_text(text)
        res = CliRunner().invoke(main, ["validate", "--show", str(bad)])
        assert res.exit_code == 2 and msg in res.output, res.output
