"""The published-measurements validation set: well-formed, sourced, and no worse than claimed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from simfed.calibration.published import DEFAULT_DIR, load_cases, validate_published

ROOT = Path(__file__).resolve().parents[1]


def test_every_case_has_a_scenario_and_a_source():
    cases = load_cases()
    assert len(cases) >= 12
    for c in cases:
        assert (DEFAULT_DIR / c["scenario"]).is_file()
        src = c["source"]
        assert src["repo"] and src["file"] and len(src["commit"]) == 40 and src["row"]
        assert c["published_tokens_per_s_per_gpu"] > 0
    sets = {c["set"] for c in cases}
    assert sets == {"fit", "check"}


def test_held_out_tables_are_not_used():
    for c in load_cases():
        table = c["source"].get("table", "")
        assert not table.startswith("A100 40GB") and "Large Scale" not in table
        assert "torchtitan" not in c["source"]["repo"]


@pytest.fixture(scope="module")
def result():
    return validate_published()


def test_median_error_within_the_documented_claim(result):
    claims = yaml.safe_load((DEFAULT_DIR / "cases.yaml").read_text())["claims"]
    s = result["summary"]["all"]
    assert s["median_abs_error"] <= claims["median_abs_error"]
    assert abs(s["worst"]["error"]) <= claims["worst_abs_error"]
    doc = (ROOT / "docs" / "accuracy.md").read_text()
    assert f"median |error| at most {100 * claims['median_abs_error']:.1f}%" in doc
    assert f"no case beyond {100 * claims['worst_abs_error']:.0f}%" in doc


def test_errors_are_predicted_over_published(result):
    for r in result["cases"]:
        assert r["error"] == pytest.approx(r["predicted"] / r["published"] - 1.0)


def test_scenarios_say_which_kernels_each_framework_ran():
    """llm-foundry's tables ran MPT with its Triton attention and a learned position table
    (validation/published/README.md); fms-fsdp ran Llama 2 with SDPA flash and RoPE."""
    from simfed.spec import load_scenario

    for c in load_cases():
        scn = load_scenario(DEFAULT_DIR / c["scenario"])
        foundry = c["source"]["repo"] == "mosaicml/llm-foundry"
        assert scn.training.attention == ("triton" if foundry else "flash"), c["name"]
        assert scn.model.position == ("learned" if foundry else "rope"), c["name"]


def test_published_speedups_within_their_claim(result):
    """float8 and torch.compile speedups (validation/published/speedups.yaml): each case's two
    runs simulated; the error is predicted over published speedup."""
    import statistics

    data = yaml.safe_load((DEFAULT_DIR / "speedups.yaml").read_text())
    rows = result["speedups"]
    assert [r["name"] for r in rows] == [c["name"] for c in data["cases"]]
    for r, c in zip(rows, data["cases"], strict=True):
        pub = c["published"]
        assert r["published"] == pytest.approx(pub["variant"] / pub["baseline"])
        base, var = r["predicted_tokens_per_s_per_gpu"]
        assert r["error"] == pytest.approx(var / base / r["published"] - 1.0)
        assert var > base  # every published setting made training faster
    errs = [abs(r["error"]) for r in rows]
    assert statistics.median(errs) <= data["claims"]["median_abs_error"]
    assert max(errs) <= data["claims"]["worst_abs_error"]


def test_a_malformed_speedup_case_is_one_clear_error(tmp_path):
    from simfed.calibration.published import speedup_cases
    from simfed.spec import SpecError

    (tmp_path / "speedups.yaml").write_text(
        "cases:\n  - {name: a, scenario: x.yaml, baseline: {}, published: {baseline: 1, "
        "variant: 2}, source: s}\n")
    with pytest.raises(SpecError, match=r"speedups\.yaml: cases\[0\]\.variant: missing"):
        speedup_cases(tmp_path)
    (tmp_path / "speedups.yaml").write_text(
        "cases:\n  - {name: a, scenario: x.yaml, baseline: {}, variant: {}, "
        "published: {baseline: 0, variant: 2}, source: s}\n")
    with pytest.raises(SpecError, match=r"cases\[0\]\.published\.baseline: input should be "
                       r"greater than 0, got 0"):
        speedup_cases(tmp_path)
