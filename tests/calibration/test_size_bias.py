"""simfed.calibration.size_bias: the A100 40GB table's error by model size."""

from __future__ import annotations

import json

from simfed.calibration import size_bias as sb


def test_the_size_trend_was_composers_training_metrics():
    """Before Composer's training metrics were modelled (results-kernels-v14.json) the smallest
    model was the most too fast by a wide margin, the trend outside attention; with them (the
    newest results) MPT-125M and MPT-3B are within 5 points of each other."""
    before = json.loads((sb.DEFAULT_DIR / "results-kernels-v14.json").read_text())
    rows = {d["model"]: d for d in sb.size_bias(before)}
    small, mid = rows["mpt-125m"], rows["mpt-3b"]
    assert small["median_error_no_checkpointing"] > mid["median_error_no_checkpointing"] + 0.1
    assert small["alpha"] > mid["alpha"] + 0.1
    assert small["split_runs"] >= 2 and small["beta"] is not None
    now = {d["model"]: d for d in sb.size_bias(json.loads(sb.newest_results().read_text()))}
    assert abs(now["mpt-125m"]["median_error_no_checkpointing"]
               - now["mpt-3b"]["median_error_no_checkpointing"]) < 0.05
    # every model of the table, in order of parameters
    params = [d["params"] for d in sb.size_bias(before)]
    assert len(params) == 9 and params == sorted(params)


def test_size_bias_cli_prints_and_refuses_bad_input(tmp_path, capsys):
    assert sb.main([]) == 0
    assert "mpt-125m" in capsys.readouterr().out
    bad = tmp_path / "r.json"
    bad.write_text("{not json")
    assert sb.main([str(bad)]) == 2
    assert "cannot read results" in capsys.readouterr().out
    empty = tmp_path / "e.json"
    empty.write_text(json.dumps({"cases": []}))
    assert sb.main([str(empty)]) == 2
    empty.write_text("[1]")
    assert sb.main([str(empty)]) == 2
    assert "cases: expected a list" in capsys.readouterr().out
    empty.write_text(json.dumps({"cases": [{"name": "foundry-a100-40gb-mpt1b-s2048-8gpu"}]}))
    assert sb.main([str(empty)]) == 2
    assert "an entry lacks a field" in capsys.readouterr().out
