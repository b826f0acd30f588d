"""Micro-batch sweeps: the published runs that differ only in their micro-batch, split into a
per-step part and a per-token part, published and predicted."""

from __future__ import annotations

import pytest

from simfed.calibration.micro_batch import sweeps


def _row(name, mb, fixed_s, per_token_s, model_fixed_s, model_per_token_s, sweep="s:a",
         seq=2048, gpus=8, which="fit"):
    tokens = mb * seq
    return {"name": name, "set": which, "scenario": sweep.split(":")[0], "sweep": sweep,
            "gpus": gpus, "micro_batch": mb, "tokens_per_gpu_step": tokens,
            "published": tokens / (fixed_s + per_token_s * tokens),
            "predicted": tokens / (model_fixed_s + model_per_token_s * tokens)}


def test_a_sweep_recovers_its_fixed_and_per_token_parts():
    rows = [_row(f"r{mb}", mb, 0.10, 50e-6, 0.04, 62.5e-6) for mb in (1, 2, 3, 4)]
    (s,) = sweeps(rows)
    assert s["published"]["fixed_s"] == pytest.approx(0.10)
    assert s["published"]["per_1k_tokens_s"] == pytest.approx(0.050)
    assert s["predicted"]["fixed_s"] == pytest.approx(0.04)
    assert s["per_token_ratio"] == pytest.approx(1.25)
    assert s["fixed_difference_s"] == pytest.approx(-0.06)
    assert s["micro_batches"] == [1, 2, 3, 4] and s["cases"] == ["r1", "r2", "r3", "r4"]


def test_a_sweep_needs_three_micro_batches_and_one_key():
    two = [_row(f"a{mb}", mb, 0.1, 5e-5, 0.1, 5e-5) for mb in (1, 2)]
    other = [_row("b3", 3, 0.1, 5e-5, 0.1, 5e-5, sweep="s:b")]
    same_mb = [_row(f"c{i}", 2, 0.1, 5e-5, 0.1, 5e-5, sweep="s:c") for i in range(3)]
    assert sweeps(two + other + same_mb) == []
    assert sweeps([{**r, "sweep": ""} for r in two + other]) == []


def test_the_published_sweeps_are_runs_that_differ_only_in_micro_batch():
    from simfed.calibration.published import DEFAULT_DIR, load_cases, predict_case

    cases = [c for c in load_cases() if c.get("study", "").startswith("modalities-mn5-2.7b")]
    rows = [predict_case(DEFAULT_DIR, c) for c in cases if c["gpus"] == 8]
    found = sweeps(rows)
    assert found, "the 2.7B FULL_SHARD rows at 8 GPUs vary only the micro-batch"
    for s in found:
        members = [r for r in rows if r["name"] in s["cases"]]
        assert len({r["sweep"] for r in members}) == 1
        assert len({r["micro_batch"] for r in members}) == len(s["micro_batches"]) >= 3
    # the 8,192-token row and the HYBRID_SHARD rows differ in more than the micro-batch
    assert all(not any("s8192" in n for n in s["cases"]) for s in found)
