"""`simfed validate` on measurements already on disk (no testbed): calibration from the bench
folders only, medians over launches, paired speedups, and bench sets at other link rates."""

import json
import statistics

import pytest

from simfed.calibration.validate import validate
from simfed.spec import load_scenario
from simfed.spec.trace import Span, write_trace

from ..conftest import ROOT
from .test_fit import TRUE, _time_at

TINY = ROOT / "tests" / "fixtures" / "tiny2x2.yaml"
# FSDP and FL+FSDP per launch (s/step after the warm-up): the medians' ratio (2.2x) differs from
# the median of the per-launch ratios (2.0x), which is the one a drifting machine needs
LAUNCHES = {"fsdp": [1.0, 1.2, 1.1], "fl_fsdp": [0.5, 0.5, 0.6]}


def _bench(folder, rate_Gbps: float) -> None:
    """A bench folder in `realrun bench`'s summary format, timed by the simulator's truth."""
    rows = []
    for group, pg, size in (("intra", "shard", 2), ("inter", "replicate", 2)):
        for op in ("all_gather", "all_reduce"):
            for nbytes in (65_536, 1_048_576, 8_388_608):
                rows.append({"op": op, "group": group, "group_size": size, "nodes": 2,
                             "concurrent_groups": 1, "nbytes": nbytes,
                             "time_s": _time_at(TRUE, rate_Gbps, op, pg, nbytes)})
    folder.mkdir(parents=True)
    meta = {"nodes": 2, "ranks_per_node": 2, "world_size": 4, "backend": "gloo",
            "link_rate_Gbps": rate_Gbps, "network": "testbed", "cores": 1, "host_cores": 2,
            "impl": {"reduce_scatter": "gloo_allreduce"}, "overlap": "none"}
    (folder / "bench-summary.json").write_text(json.dumps({"meta": meta, "comm": rows}))


def _launches(out) -> None:
    """The end-to-end launches of shape `base` (LAUNCHES), as realrun writes them."""
    for alg, times in LAUNCHES.items():
        for rep, t in enumerate(times):
            d = out / "runs" / "base" / f"rep{rep}" / alg
            d.mkdir(parents=True)
            # the slowest rank's step times (the ranks take turns being late by 0.2 s)...
            (d / "summary.json").write_text(json.dumps({"step_times_s": [9, 9, t + .2, t + .2]}))
            for rank, comm in enumerate((0.3, 0.5)):  # time in collectives per step
                # ... and their step spans: the job's wall time per step is t after the warm-up
                ends = [9.0, 18.0, 18.0 + t + (0.2 if rank == 0 else -0.2), 18.0 + 2 * t]
                write_trace(d / f"trace_rank{rank}.jsonl", {"rank": rank}, [
                    Span("step", "step", rank, step, start, end - start) for step, (start, end)
                    in enumerate(zip([0.0, *ends[:-1]], ends, strict=True))] + [
                    sp for step in range(4) for sp in (
                        Span("backward", "phase", rank, step, 0.0, t),
                        Span("reduce_scatter", "comm", rank, step, 0.1, comm - 0.1,
                             attrs={"phase": "backward"}),
                        Span("all_gather", "comm", rank, step, 0.0, 0.1,
                             attrs={"phase": "backward"}),
                        Span("all_gather", "comm", rank, step, 0.0, 5.0,  # not training
                             attrs={"phase": "eval"}))])


def _measured(tmp_path, shapes: str, rates: tuple[float, ...] = (10.0, 5.0),
              copies: tuple[str, ...] = ()):
    """A tiny scenario with these validation shapes (YAML lines), benchmarks at `rates` and the
    base shape's launches, copied as the measurements of the shapes named in `copies`."""
    import shutil

    scn_path = tmp_path / "scn.yaml"
    bench_sets = ("  bench_sets: [{cluster.node.nics.bw_Gbps: 5.0, skip: units}]\n"
                  if len(rates) > 1 else "")
    scn_path.write_text(f"include: {TINY}\nvalidation:\n  repeats: 3\n{bench_sets}{shapes}")
    out = tmp_path / "out"
    for i, rate in enumerate(rates):
        _bench(out / "bench" / f"set{i}", rate)
    _launches(out)
    for name in copies:
        shutil.copytree(out / "runs" / "base", out / "runs" / name)
    return scn_path, out


def test_validate_reads_measurements_and_pairs_speedups_by_launch(tmp_path):
    scn_path, out = _measured(
        tmp_path, "  shapes: [{name: base, set: {}, algorithms: [fsdp, fl_fsdp]}]\n")
    res = validate(scn_path, out, echo=lambda _m: None, skip_runs=True, draws=4, mechanisms=False)

    rows = {r["algorithm"]: r for r in res["runs"]}
    # warm-up steps dropped; the wall time per step, not the slowest rank's
    assert rows["fsdp"]["measured_step_time_s"] == pytest.approx(1.1)
    assert rows["fl_fsdp"]["measured_launches_s"] == pytest.approx(LAUNCHES["fl_fsdp"])
    sp = next(s for s in res["speedups"] if s["pair"] == "fl_fsdp/fsdp")
    assert sp["measured"] == pytest.approx(2.0)
    assert sp["measured_of_medians"] == pytest.approx(2.2)
    assert sp["predicted"] == pytest.approx(
        rows["fsdp"]["predicted_step_time_s"] / rows["fl_fsdp"]["predicted_step_time_s"])
    # why: collectives (mean over ranks, warm-up and evaluation left out) and the rest
    assert rows["fsdp"]["measured_comm_s"] == pytest.approx(0.4)
    assert rows["fsdp"]["measured_rest_s"] == pytest.approx(1.1 - 0.4)
    assert rows["fsdp"]["predicted_comm_s"] > 0
    assert rows["fsdp"]["predicted_rest_s"] == pytest.approx(
        rows["fsdp"]["predicted_step_time_s"] - rows["fsdp"]["predicted_comm_s"])
    errs = [abs(r["error"]) for r in res["runs"]]
    assert res["summary"]["fit"]["median_abs_error"] == pytest.approx(statistics.median(errs))
    assert "check" not in res["summary"]  # `shapes:` is the fit set
    # calibrated on both link rates (10 and 5 Gb/s, each sample scaled to its own), never on
    # the runs: the wire comes out at the scenario's 10 Gb/s, the bench's latencies as TRUE's
    prof = load_scenario(scn_path, profile=res["profile"])
    assert prof.cluster.node.nics.bw_Gbps * prof.runtime.comm.nic_efficiency == \
        pytest.approx(10.0, rel=1e-2)
    assert prof.cluster.node.nics.latency_us == pytest.approx(80.0, rel=0.05)
    # ... and the testbed facts the bench recorded came along
    assert prof.cluster.host_cores == 2
    assert prof.runtime.comm.reduce_scatter_impl == "all_reduce"


def test_check_set_is_reported_apart_and_baselines_are_not_scored(tmp_path):
    scn_path, out = _measured(
        tmp_path,
        "  fit: [{name: base, set: {}, algorithms: [fsdp, fl_fsdp]}]\n"
        "  check: [{name: k1, set: {algorithms.fl_fsdp.aggregate_every: 1},\n"
        "           algorithms: [fsdp, fl_fsdp], baselines: [fsdp]}]\n",
        rates=(10.0,), copies=("k1",))
    res = validate(scn_path, out, echo=lambda _m: None, skip_runs=True, draws=4, mechanisms=False)
    splits = {r["name"]: (r["split"], r["baseline"]) for r in res["runs"]}
    assert splits == {"base/fsdp": ("fit", False), "base/fl_fsdp": ("fit", False),
                      "k1/fsdp": ("check", True), "k1/fl_fsdp": ("check", False)}
    fit, check = res["summary"]["fit"], res["summary"]["check"]
    assert (fit["runs"], check["runs"]) == (2, 1)  # the baseline FSDP run is not scored
    k1 = next(r for r in res["runs"] if r["name"] == "k1/fl_fsdp")
    assert check["median_abs_error"] == pytest.approx(abs(k1["error"]))
    assert check["fl_fsdp_over_fsdp_pairs"] == 1
    assert [s["split"] for s in res["speedups"] if s["pair"] == "fl_fsdp/fsdp"] == \
        ["fit", "check"]
    assert [c["name"] for c in res["check_shapes"]] == ["k1"]


def test_intervals_from_parameter_draws_widen_where_a_shape_extrapolates(tmp_path):
    scn_path, out = _measured(
        tmp_path,
        "  fit: [{name: base, set: {}, algorithms: [fsdp, fl_fsdp]}]\n"
        "  check: [{name: fast, set: {cluster.node.nics.bw_Gbps: 40.0},\n"
        "           algorithms: [fsdp, fl_fsdp]}]\n",
        copies=("fast",))
    res = validate(scn_path, out, echo=lambda _m: None, skip_runs=True, draws=12)
    rows = {r["name"]: r for r in res["runs"]}
    base, fast = rows["base/fsdp"], rows["fast/fsdp"]
    # benchmarked at 5 and 10 Gb/s: the base shape's rate is inside, 40 Gb/s two doublings out;
    # both run FSDP over 4 ranks where the bench's groups had 2 (one doubling)
    assert [f["quantity"] for f in base["extrapolating"]] == ["group_ranks"]
    assert base["extrapolating"][0]["doublings"] == pytest.approx(1.0)
    flag = next(f for f in fast["extrapolating"] if f["quantity"] == "link_Gbps")
    assert flag["doublings"] == pytest.approx(2.0) and flag["range"] == [5.0, 10.0]
    assert fast["widening_rel_sd"] > base["widening_rel_sd"] > 0
    lo, hi = fast["predicted_p10_p90_s"]
    assert lo <= fast["predicted_step_time_s"] <= hi
    assert fast["predicted_interval_s"][0] < lo and fast["predicted_interval_s"][1] > hi
    inside = [r["inside_interval"] for r in res["runs"] if r["split"] == "check"]
    assert res["summary"]["check"]["inside_interval"] == pytest.approx(sum(inside) / 2)
    # seeded: the same intervals again
    again = validate(scn_path, out, echo=lambda _m: None, skip_runs=True, draws=12,
                     mechanisms=False)
    assert [r["predicted_interval_s"] for r in again["runs"]] == \
        [r["predicted_interval_s"] for r in res["runs"]]
    # no shared cores, nothing of theirs fitted: each mechanism on and off predict alike
    for mech, got in res["mechanisms"].items():
        assert got["on"]["check"]["median_abs_error"] == pytest.approx(
            got["off"]["check"]["median_abs_error"]), mech


def test_baselines_must_be_algorithms_of_the_shape(tmp_path):
    from simfed.spec import SpecError

    scn_path = tmp_path / "scn.yaml"
    scn_path.write_text(f"include: {TINY}\nvalidation: {{check: [{{name: a, algorithms: "
                        "[fl_fsdp], baselines: [fsdp]}]}\n")
    with pytest.raises(SpecError, match=r"validation.check\[0\].baselines\[0\]: 'fsdp' is not"):
        load_scenario(scn_path)


def test_validate_without_measurements_names_the_missing_shape(tmp_path):
    from simfed.spec import SpecError

    scn_path = tmp_path / "scn.yaml"
    scn_path.write_text(f"include: {TINY}\nvalidation: {{shapes: [{{name: base, set: {{}}}}]}}\n")
    _bench(tmp_path / "out" / "bench" / "set0", 10.0)
    with pytest.raises(SpecError, match="no measurements for shape 'base'"):
        validate(scn_path, tmp_path / "out", echo=lambda _m: None, skip_runs=True,
                 draws=0, mechanisms=False)


def _units(folder, flops_per_s: float) -> None:
    """Per-unit compute rows (forward and backward at two sizes) at a given speed."""
    p = folder / "bench-summary.json"
    data = json.loads(p.read_text())
    data["units"] = [{"phase": ph, "flops": f, "time_s": 1e-3 + f / flops_per_s, "kind": "unit"}
                     for ph in ("forward", "backward") for f in (1e9, 4e9)]
    p.write_text(json.dumps(data))


def test_rebench_predicts_each_shape_with_the_compute_measured_right_before_it(tmp_path):
    from simfed.spec import SpecError

    scn_path = tmp_path / "scn.yaml"
    text = (f"include: {TINY}\n"
            "validation:\n"
            "  repeats: 3\n"
            "  rebench: [units]\n"
            "  shapes: [{name: base, set: {}, algorithms: [fsdp, fl_fsdp]}]\n")
    scn_path.write_text(text)
    out = tmp_path / "out"
    _bench(out / "bench" / "set0", 10.0)
    _units(out / "bench" / "set0", 2e12)
    _launches(out)
    with pytest.raises(SpecError, match="no re-benchmark for shape 'base'"):
        validate(scn_path, out, echo=lambda _m: None, skip_runs=True, draws=4, mechanisms=False)
    # the host ran twice as fast right before the launches: the shape is predicted at that speed
    fresh = out / "bench" / "shape-base"
    fresh.mkdir(parents=True)
    (fresh / "bench-summary.json").write_text(json.dumps({"meta": {}}))
    _units(fresh, 4e12)
    res = validate(scn_path, out, echo=lambda _m: None, skip_runs=True, draws=4, mechanisms=False)
    first = load_scenario(scn_path, profile=res["profile"])
    assert all(r["profile"] == str(out / "profile-base.yaml") for r in res["runs"])
    shape = load_scenario(scn_path, profile=out / "profile-base.yaml")
    for ph in ("forward", "backward"):
        assert getattr(shape.runtime.compute, f"efficiency_{ph}") * \
            shape.cluster.node.gpu.peak_tflops == pytest.approx(
                2 * getattr(first.runtime.compute, f"efficiency_{ph}") *
                first.cluster.node.gpu.peak_tflops, rel=1e-3)
    # the collectives still come from the first benchmarks
    assert shape.runtime.comm.nic_efficiency == first.runtime.comm.nic_efficiency
    scn_path.write_text(text.replace("[units]", "[units, comm]"))
    with pytest.raises(SpecError, match=r"validation\.rebench\[1\]: must be one of compute, "
                       r"units, optimizer, got 'comm'"):
        load_scenario(scn_path)


def test_host_drift_is_the_robust_pooled_spread_of_the_rebenched_compute_speed():
    import math

    from simfed.calibration.samples import Samples, UnitSample
    from simfed.calibration.validate import MAD_TO_SD, _host_drift, _Shape
    from simfed.spec.scenario import ValidationShape

    def shape(name: str, rate: float, sets: dict, bwd: float | None = None) -> _Shape:
        units = [UnitSample(phase=ph, flops=f, time_s=f / (bwd if bwd and ph == "backward"
                                                          else rate), source="s")
                 for ph in ("forward", "backward") for f in (1e8, 4e8)]
        return _Shape("check", ValidationShape(name=name, set=sets), sets, ["fsdp"],
                      Samples(units=units))

    scn = load_scenario(TINY)
    # one layout at 1, 2 and 4 GFLOP/s (ln residuals from the median: -ln 2, 0, ln 2), and
    # another micro-batch alone, whose speed is its own business: no spread, no degree of freedom
    shapes = [shape("a", 1e9, {}), shape("b", 2e9, {}), shape("c", 4e9, {}),
              shape("d", 9e9, {"training.micro_batch": 8})]
    assert _host_drift(TINY, scn, shapes) == pytest.approx(MAD_TO_SD * math.log(2), rel=1e-3)
    assert _host_drift(TINY, scn, shapes[:2]) == 0.0  # one degree of freedom: no estimate
    # robust: five re-benches within 2% and one at a third of the speed (run 25's outlier)
    steady = [shape(f"s{i}", r, {}) for i, r in enumerate((1.00e9, 1.01e9, 0.99e9, 1.02e9,
                                                           0.98e9))]
    slow = shape("slow", 0.33e9, {})
    spread = _host_drift(TINY, scn, [*steady, slow])
    assert spread < 0.03
    assert _host_drift(TINY, scn, steady) == pytest.approx(spread, abs=0.01)
    # the backward counts: the same forward speed with a backward at half the speed
    halved = [shape("a", 1e9, {}), shape("b", 1e9, {}, bwd=0.5e9), shape("c", 1e9, {}, bwd=0.25e9)]
    assert _host_drift(TINY, scn, halved) == pytest.approx(
        MAD_TO_SD * math.log((1 + 2 / 0.5) / (1 + 2)), rel=1e-3)


def test_rebenches_of_one_compute_configuration_are_pooled_by_their_median():
    """The shapes' re-benchmarks of one layout, model and micro-batch (1, 2 and 4 GFLOP/s)
    predict each of them at their median (2 GFLOP/s), sample by sample; another micro-batch
    keeps its own; each shape's own cases (loops, drifts) stay its own, and the host-speed
    spread still comes from the re-benchmarks one by one."""
    import math

    from simfed.calibration.samples import Samples, UnitSample
    from simfed.calibration.validate import MAD_TO_SD, _host_drift, _pool_rebenches, _Shape
    from simfed.spec.scenario import ValidationShape

    def units(rate: float) -> list[UnitSample]:
        return [UnitSample(phase=ph, flops=f, time_s=f / rate, source="s")
                for ph in ("forward", "backward") for f in (1e8, 4e8)]

    def shape(name: str, rate: float, sets: dict) -> _Shape:
        fresh = Samples(units=units(rate), loops=[{"name": name}], sources=[name])
        return _Shape("check", ValidationShape(name=name, set=sets), sets, ["fsdp"],
                      Samples(), fresh)

    base = Samples(units=units(0.5e9), sources=["base"])
    shapes = [shape("a", 1e9, {}), shape("b", 4e9, {}), shape("c", 2e9, {}),
              shape("d", 9e9, {"training.micro_batch": 8})]
    _pool_rebenches(TINY, base, shapes)
    for sh in shapes[:3]:
        assert [u.time_s for u in sh.samples.units] == pytest.approx(
            [u.time_s for u in units(2e9)])
        assert sh.samples.loops == [{"name": sh.shape.name}]
        assert sh.samples.sources == ["base", sh.shape.name]
    assert [u.time_s for u in shapes[3].samples.units] == pytest.approx(
        [u.time_s for u in units(9e9)])
    assert [u.time_s for u in base.units] == pytest.approx([u.time_s for u in units(0.5e9)])
    assert _host_drift(TINY, load_scenario(TINY), shapes) == pytest.approx(
        MAD_TO_SD * math.log(2), rel=1e-3)
