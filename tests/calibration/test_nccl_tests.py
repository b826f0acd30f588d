"""Calibrating the NCCL model from nccl-tests output (simfed.calibration.nccl_tests): the parser
on a real published output, malformed input, the fit recovering a known curve from output the
model itself made, the curve off by default, and the held-out claim on published tables."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from simfed.calibration import published_collectives as published
from simfed.calibration.nccl_tests import (
    KNOTS,
    curve_samples,
    fit_curves,
    read_nccl_tests,
)
from simfed.cli import main
from simfed.collectives.nccl import bus_factor, curve_value
from simfed.spec.schema import SpecError

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "nccl_tests" / "a3mega-h100-2node-all_reduce_perf.txt"
H100 = ROOT / "validation" / "published" / "collectives-h100.yaml"
MiB = 1 << 20


def test_parser_reads_a_published_output():
    rows = read_nccl_tests(FIXTURE)
    assert len(rows) == 31  # 8 B .. 8 GiB, factor 2
    r = next(r for r in rows if r.nbytes == MiB)
    # out-of-place columns of the 1 MiB row: 203.2 us, 5.16 GB/s, 9.68 GB/s (not in-place 9.49)
    assert (r.time_us, r.algbw_GBps, r.busbw_GBps) == (203.2, 5.16, 9.68)
    assert (r.op, r.ranks, r.nodes) == ("all_reduce", 16, 2)
    assert r.gpu == "NVIDIA H100 80GB HBM3" and r.nccl_version is None
    assert r.source.endswith(":49")
    assert rows[-1].nbytes == 8 * 1024 * MiB and rows[-1].busbw_GBps == 338.82


def _output(rows, *, ranks=8, nodes=1, op="all_reduce", version_code=21805, test=True,
            root_col=True) -> str:
    """nccl-tests stdout (current format) for rows of (size, time us)."""
    lines = [f"# nccl-tests version 2.13.8 nccl-headers={version_code} "
             f"nccl-library={version_code}"]
    if test:
        lines.append(f"# Collective test starting: {op}_perf")
    lines += ["# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 "
              "iters: 20 agg iters: 1 validation: 1 graph: 0", "#", "# Using devices"]
    per = ranks // nodes
    for r in range(ranks):
        lines.append(f"#  Rank {r:2d} Group  0 Pid {1000 + r:6d} on node{r // per} device "
                     f"{r % per:2d} [0x{r:02x}] NVIDIA H100 80GB HBM3")
    root = "    root" if root_col else ""
    lines += ["#", f"#       size         count      type   redop{root}     time   algbw   busbw "
                   "#wrong     time   algbw   busbw #wrong",
              "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"]
    bf = bus_factor(op, ranks)
    for size, t_us in rows:
        alg = size / (t_us * 1e-6) / 1e9
        rc = "      -1" if root_col else ""
        lines.append(f"{size:12d}  {size // 4:12d}     float     sum{rc}  {t_us:8.2f}  "
                     f"{alg:6.2f}  {alg * bf:6.2f}      0  {t_us:8.2f}  {alg:6.2f}  "
                     f"{alg * bf * 0.99:6.2f}      0")
    lines.append("# Avg bus bandwidth    : 100.0")
    return "\n".join(lines) + "\n"


def _h100_model(nodes: int = 1, version: str = "2.18"):
    from simfed.collectives.nccl import nccl_model
    from simfed.hardware import Hardware
    from simfed.spec import load_scenario

    scn = load_scenario(H100, {"cluster.nodes": nodes, "runtime.comm.nccl_version": version})
    return nccl_model(Hardware.from_spec(scn.cluster, scn.runtime), scn.runtime.comm)


def test_the_fit_recovers_a_known_curve_from_the_models_own_output(tmp_path):
    """Output made by the model with a known curve on NVLS all-reduce: `simfed calibrate` fits
    it back (knots and busbw), and the profile carries it with its provenance and version."""
    truth = {"all_reduce": {"nvls/Simple": {"intra": [
        [MiB, 0.3], [4 * MiB, 0.45], [16 * MiB, 0.6], [64 * MiB, 0.8], [256 * MiB, 0.93],
        [1024 * MiB, 1.0]]}}}
    true_model = replace(_h100_model(), bw_curve=truth)
    sizes = [MiB << k for k in range(14)]  # 1 MiB .. 8 GiB
    rows = [(s, true_model.best("all_reduce", s, 8, 1).time_s * 1e6) for s in sizes]
    assert {true_model.best("all_reduce", s, 8, 1).algorithm for s in sizes} == {"nvls"}
    path = tmp_path / "all_reduce_perf.txt"
    path.write_text(_output(rows))
    out = tmp_path / "prof.yaml"
    res = CliRunner().invoke(main, ["calibrate", str(path), "--scenario", str(H100), "--out",
                                    str(out)])
    assert res.exit_code == 0, res.output
    assert "nccl-tests all_reduce nvls/Simple intra: n=14" in res.output
    prof = yaml.safe_load(out.read_text())
    comm = prof["runtime"]["comm"]
    assert comm["nccl_version"] == "2.18"  # nccl-library=21805 -> 2.18.5
    assert comm["model"] == "nccl"
    fitted = comm["nccl_bw_curve"]["all_reduce"]["nvls/Simple"]["intra"]
    want = dict(map(tuple, truth["all_reduce"]["nvls/Simple"]["intra"]))
    for size, c in fitted:
        assert c == pytest.approx(want.get(size, 1.0), abs=0.03), (size, fitted)
    assert "runtime.comm.nccl_bw_curve" in prof["runtime"]["provenance"]
    # the calibrated model reproduces the measured bus bandwidth within 1% at every size
    cal = replace(_h100_model(), bw_curve=comm["nccl_bw_curve"])
    for s, t_us in rows:
        assert cal.best("all_reduce", s, 8, 1).time_s * 1e6 == pytest.approx(t_us, rel=0.01)


def test_curve_is_off_by_default_and_only_scales_bandwidth():
    m = _h100_model()
    assert m.bw_curve is None
    ch = m.best("all_reduce", 8 * MiB, 8, 1)
    assert ch == m.nccl_choice("all_reduce", 8 * MiB, 8, 1)
    cal = replace(m, bw_curve={"all_reduce": {"nvls/Simple": {"intra": [[MiB, 0.5]]}}})
    c2 = cal.best("all_reduce", 8 * MiB, 8, 1)
    assert c2.latency_s == ch.latency_s and c2.algbw_Bps == pytest.approx(ch.algbw_Bps * 0.5)
    # other ops, choices and domains are untouched
    assert cal.best("all_gather", 8 * MiB, 8, 1) == m.best("all_gather", 8 * MiB, 8, 1)
    # piecewise-linear in log2(size), held beyond the ends
    knots = [[MiB, 0.4], [16 * MiB, 0.8]]
    assert curve_value(knots, 1024) == 0.4 and curve_value(knots, 1 << 40) == 0.8
    assert curve_value(knots, 4 * MiB) == pytest.approx(0.6)


def test_knots_past_the_samples_return_to_one():
    """A multi-node ring measured only near 128 MB: the curve is fitted there and back at 1
    one knot later (large sizes keep NCCL's bandwidth)."""
    m = _h100_model(nodes=2, version="2.23")
    rows = []
    for s in (100 * MiB, 128 * MiB, 150 * MiB):
        ch = m.nccl_choice("all_reduce", s, 16, 2)
        busbw = s / (ch.latency_s + s / (ch.algbw_Bps * 0.8)) * bus_factor("all_reduce", 16) / 1e9
        rows.append(("all_reduce", s, busbw, 16, 2, "synthetic"))
    curves, rep = fit_curves(curve_samples(m, rows))
    (_op, by_choice), = curves.items()
    (_choice, by_dom), = by_choice.items()
    knots = by_dom["inter"]
    assert [k for k, _ in knots] == [int(KNOTS[3]), int(KNOTS[4]), int(KNOTS[5])]
    assert knots[-1][1] == 1.0 and knots[0][1] == pytest.approx(0.8, abs=0.02)
    assert all(abs(r["calibrated_GBps"] / r["measured_GBps"] - 1) < 0.01
               for g in rep["groups"].values() for r in g["rows"])


@pytest.mark.parametrize(("text", "msg"), [
    ("       1048576  262144  float  sum  -1  10.0  1.0  1.0  0\n",
     "a table row before the column header"),
    (None, "expected numbers in the size/time/algbw/busbw columns"),
    (None, "columns, the header has"),
    (None, "no '#  Rank  r"),
    (None, "is not modelled"),
    (None, "busbw / algbw is"),
])
def test_malformed_input_is_a_one_line_error(tmp_path, text, msg):
    good = _output([(MiB, 40.0), (2 * MiB, 60.0)])
    if msg.startswith("expected numbers"):
        text = good.replace("  40.00  ", "  4x.00  ", 1)
    elif msg.startswith("columns"):
        lines = good.splitlines()
        text = "\n".join([*lines[:-2], " ".join(lines[-2].split()[:5]), *lines[-1:]]) + "\n"
    elif msg.startswith("no '#"):
        text = "\n".join(x for x in good.splitlines() if "Rank" not in x) + "\n"
    elif msg == "is not modelled":
        text = good.replace("all_reduce_perf", "broadcast_perf")
    elif msg.startswith("busbw"):  # an all-reduce table named all_gather
        text = good.replace("all_reduce_perf", "all_gather_perf")
    path = tmp_path / "out.txt"
    path.write_text(text)
    with pytest.raises(SpecError, match=msg.replace("(", r"\(").replace("*", r"\*")) as exc:
        read_nccl_tests(path)
    assert str(path) in str(exc.value) and "\n" not in str(exc.value)
    res = CliRunner().invoke(main, ["calibrate", str(path), "--scenario", str(H100), "--out",
                                    str(tmp_path / "p.yaml")])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1, res.output


def test_op_from_the_file_name_and_old_column_layout(tmp_path):
    """Older nccl-tests: no 'Collective test starting' line, no root column; the collective
    comes from the file name (all_gather_perf) and the busbw/algbw ratio agrees."""
    text = _output([(MiB, 40.0)], op="all_gather", test=False, root_col=False)
    path = tmp_path / "ag_all_gather_perf.log"
    path.write_text(text)
    (r,) = read_nccl_tests(path)
    assert r.op == "all_gather" and r.time_us == 40.0 and r.nccl_version == "2.18.5"


def test_rows_with_wrong_results_are_skipped_and_other_gpus_refused(tmp_path):
    text = _output([(MiB, 40.0), (2 * MiB, 60.0)])
    lines = text.splitlines()
    i = next(j for j, x in enumerate(lines) if x.strip().startswith(str(2 * MiB)))
    toks = lines[i].split()
    toks[8] = "17"  # out-of-place #wrong
    lines[i] = "  ".join(toks)
    path = tmp_path / "all_reduce_perf.txt"
    path.write_text("\n".join(lines) + "\n")
    assert [r.nbytes for r in read_nccl_tests(path)] == [MiB]
    # H100 output against an A100 scenario: a one-line error naming both GPUs
    a100 = ROOT / "validation" / "published" / "collectives-a100.yaml"
    res = CliRunner().invoke(main, ["calibrate", str(path), "--scenario", str(a100), "--out",
                                    str(tmp_path / "p.yaml")])
    assert res.exit_code == 2 and "H100 80GB HBM3" in res.output and "A100" in res.output
    assert len(res.output.strip().splitlines()) == 1, res.output


def test_mpirun_tagged_output(tmp_path):
    """mpirun --tag-output prefixes every line with [1,0]<stdout>:."""
    text = "".join(f"[1,0]<stdout>:{x}\n" for x in _output([(MiB, 40.0)]).splitlines())
    path = tmp_path / "tagged.txt"
    path.write_text(text)
    (r,) = read_nccl_tests(path)
    assert (r.op, r.ranks, r.nbytes, r.time_us) == ("all_reduce", 8, MiB, 40.0)


# ---- the published tables: fit on the fit set only, the check set held out ----

def test_check_set_rows_do_not_move_the_fitted_curves(tmp_path):
    """Held out for real: changing every check-set number leaves the curves as they were."""
    data = yaml.safe_load(published.DEFAULT_FILE.read_text())
    for kind in ("tables", "cases"):
        for e in data.get(kind) or []:
            if e["set"] == "check":
                if "rows" in e:
                    e["rows"] = [[s, b * 0.5] for s, b in e["rows"]]
                else:
                    e["published_busbw_GBps"] *= 0.5
    changed = tmp_path / "collectives.yaml"
    changed.write_text(yaml.safe_dump(data))
    for f in ("collectives-a100.yaml", "collectives-h100.yaml"):  # includes made absolute
        text = (published.DEFAULT_FILE.parent / f).read_text()
        (tmp_path / f).write_text(text.replace("../../scenarios", str(ROOT / "scenarios")))
    curves, _ = published.fit_set_curves(changed)
    assert curves  # the fit set does constrain curves
    assert curves == published.fit_set_curves()[0]


def test_calibrated_collectives_meet_the_claim_on_the_check_set():
    """The claim in validation/published/collectives.yaml (`calibrated_claims`): curves fitted on
    the fit tables only, the check tables predicted with them."""
    claims = yaml.safe_load(published.DEFAULT_FILE.read_text())["calibrated_claims"]
    curves, _ = published.fit_set_curves()
    cal = published.summarise(published.compare(curves=curves))
    raw = published.summarise(published.compare())
    for name in ("fit", "check"):
        got = cal[name]["median_abs_error"]
        assert got <= claims[name]["median_abs_error"], (name, got)
        assert abs(cal[name]["worst"]["error"]) <= claims[name]["worst_abs_error"], cal[name]
        assert got < raw[name]["median_abs_error"]
