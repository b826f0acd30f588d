"""simfed.calibration.size_bias: the A100 40GB table's error by model size."""

from __future__ import annotations

import json

from simfed.calibration import size_bias as sb


def test_size_bias_falls_with_model_size_on_the_shipped_results():
    results = json.loads(sb.newest_results().read_text())
    rows = {d["model"]: d for d in sb.size_bias(results)}
    small, mid = rows["mpt-125m"], rows["mpt-3b"]
    # without checkpointing the smallest model is the most too fast, and by a wide margin
    assert small["median_error_no_checkpointing"] > mid["median_error_no_checkpointing"] + 0.1
    # the split puts the trend in the time outside attention
    assert small["alpha"] > mid["alpha"] + 0.1
    assert small["split_runs"] >= 2 and small["beta"] is not None
    # every model of the table, in order of parameters
    params = [d["params"] for d in sb.size_bias(results)]
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
