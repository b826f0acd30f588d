"""The published nccl-tests tables (validation/published/collectives.yaml) against the NCCL model:
well-formed and sourced, compared row by row from 1 MiB, no worse than the claims of
collectives.yaml and as docs/collectives.md quotes them; plus the release-dependent protocol
factors taken from NCCL's tuning.cc."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from simfed.calibration.published_collectives import DEFAULT_FILE, compare, load, summarise
from simfed.collectives.nccl import NcclModel, bus_factor
from simfed.hardware import Hardware
from simfed.spec import load_scenario
from simfed.spec.schema import SpecError

ROOT = Path(__file__).resolve().parents[1]


def _entries():
    data = load()
    return [*(data.get("tables") or []), *(data.get("cases") or [])]


def test_every_entry_is_sourced_and_in_a_set():
    entries = _entries()
    assert {e["set"] for e in entries} == {"fit", "check"}
    assert len([e for e in load()["tables"] if len(e["rows"]) >= 7]) >= 4  # full tables
    for e in entries:
        src = e["source"]
        if "repository" in src:
            assert re.fullmatch(r"[0-9a-f]{40}", src["commit"]) and src["path"], e["name"]
        else:
            assert src["url"].startswith("https://github.com/NVIDIA/nccl"), e["name"]
        assert src["where"]
        assert (DEFAULT_FILE.parent / e["scenario"]).is_file()
    for t in load()["tables"]:
        assert t["hardware"] and t["nccl_version"] and t["env"] and t["column"]
        sizes = [s for s, _ in t["rows"]]
        assert sizes == sorted(sizes) and all(b > 0 for _, b in t["rows"])


@pytest.fixture(scope="module")
def rows():
    return compare()


def test_rows_from_1_mib_with_errors_over_published(rows):
    assert rows and min(r["size_bytes"] for r in rows) >= 1 << 20
    for r in rows:
        assert r["error"] == pytest.approx(r["predicted_GBps"] / r["published_GBps"] - 1.0)
    published = sum(1 for e in _entries() for s, _ in (e.get("rows") or [[e["nbytes"], 0]])
                    if s >= 1 << 20)
    assert len(rows) == published


def test_medians_and_worst_within_the_documented_claims(rows):
    claims = yaml.safe_load(DEFAULT_FILE.read_text())["claims"]
    summary = summarise(rows)
    doc = (ROOT / "docs" / "collectives.md").read_text()
    for name in ("fit", "check"):
        s, c = summary[name], claims[name]
        assert s["median_abs_error"] <= c["median_abs_error"], (name, s)
        assert abs(s["worst"]["error"]) <= c["worst_abs_error"], (name, s)
        # the doc quotes what simfed validate --published prints, and the claim it is held to
        assert (f"{name} set: median |busbw error| {100 * s['median_abs_error']:.1f}% over "
                f"{s['rows']} rows") in doc
        assert f"{100 * c['median_abs_error']:.1f}%" in doc


def test_a_bad_set_is_a_one_line_error(tmp_path):
    data = yaml.safe_load(DEFAULT_FILE.read_text())
    data["tables"][0]["set"] = "train"
    bad = tmp_path / "collectives.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError,
                       match=r"tables\[0\]\.set: input should be 'fit' or 'check', got 'train'"):
        load(bad)


def _hw(scenario: str) -> Hardware:
    scn = load_scenario(DEFAULT_FILE.parent / scenario, {"cluster.nodes": 2})
    return Hardware.from_spec(scn.cluster, scn.runtime)


def _ring_busbw(model: NcclModel, op: str, proto: str, n: int, nodes: int) -> float:
    ch = next(c for c in model.candidates(op, 1 << 20, n, nodes)
              if c.algorithm == "ring" and c.protocol == proto)
    return ch.algbw_Bps * bus_factor(op, n)


def test_ring_ll_share_of_the_link_follows_the_release():
    """tuning.cc v2.18.5-1 line 178: LL x 1/4 (all-reduce or multi-node), x 1/3 otherwise;
    v2.23.4-1 line 187: x 0.5."""
    hw = _hw("collectives-a100.yaml")
    ring = NcclModel(hw=hw).ring_busbw_Bps(8, 1)
    m18, m23 = NcclModel(hw=hw, version="2.18"), NcclModel(hw=hw, version="2.23")
    assert _ring_busbw(m18, "all_reduce", "LL", 8, 1) == pytest.approx(ring / 4)
    assert _ring_busbw(m18, "all_gather", "LL", 8, 1) == pytest.approx(ring / 3)
    # llMaxBw caps it (A100 87.7 GB/s)
    assert _ring_busbw(m23, "all_reduce", "LL", 8, 1) == pytest.approx(min(ring / 2, 87.7e9))
    assert ring / 2 > 87.7e9


def test_ring_ll128_with_one_gpu_per_node_follows_the_release():
    """tuning.cc v2.18.5-1 line 179: LL128 x 0.7 with fewer than 2 GPUs per node (x 0.92
    otherwise); v2.23.4-1 line 188: x 0.92 always."""
    hw = _hw("collectives-h100.yaml")
    ring1 = NcclModel(hw=hw).ring_busbw_Bps(1, 2)
    for version, f in (("2.18", 0.7), ("2.23", 0.92)):
        got = _ring_busbw(NcclModel(hw=hw, version=version), "all_gather", "LL128", 2, 2)
        assert got == pytest.approx(min(ring1 * f, 16 * 36.7e9))


def test_validate_published_prints_the_calibrated_collectives_too():
    """`simfed validate --published` also reports the collectives with the efficiency curve
    fitted on the fit tables only (as `simfed calibrate` fits nccl-tests output), each set
    apart, within collectives.yaml's calibrated claims."""
    import io

    from rich.console import Console

    from simfed.calibration.published import collective_cases, print_published

    calibrated = collective_cases(DEFAULT_FILE.parent, calibrated=True)
    claims = yaml.safe_load(DEFAULT_FILE.read_text())["calibrated_claims"]
    summary = summarise(calibrated)
    for name in ("fit", "check"):
        assert summary[name]["median_abs_error"] <= claims[name]["median_abs_error"]
    # the curves move the prediction: not the uncalibrated rows
    plain = collective_cases(DEFAULT_FILE.parent)
    assert [r["size_bytes"] for r in plain] == [r["size_bytes"] for r in calibrated]
    assert summary["fit"]["median_abs_error"] < summarise(plain)["fit"]["median_abs_error"]
    out = io.StringIO()
    print_published({"cases": [], "summary": {}, "collectives": [],
                     "collectives_calibrated": calibrated}, Console(file=out, width=300))
    text = out.getvalue()
    assert re.search(r"collectives check, calibrated on the fit tables \(simfed calibrate\): "
                     r"median \|busbw error\| \d+\.\d% over \d+ rows", text), text
