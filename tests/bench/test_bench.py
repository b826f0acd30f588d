"""realrun bench: argument parsing, the summary's arithmetic on hand-made traces, one-line errors,
auto sizes, and real 2-process runs on loopback (collectives, the model's units, the optimizer)."""

from __future__ import annotations

import itertools
import json
import math

import pytest
from click.testing import CliRunner

from realrun import bench, bench_summary
from realrun.bench import BenchError, bench_command, parse_nbytes, summarize
from simfed.spec import Span, load_scenario, read_trace, write_trace


def test_parse_sizes():
    assert parse_nbytes("4096") == 4096
    assert parse_nbytes("64K") == 65536
    assert parse_nbytes("1MiB") == 1 << 20
    assert bench.parse_sizes("4K, 2M") == [4096, 2 << 20]
    for bad in ("x", "4Q", "2G", "2"):
        with pytest.raises(BenchError, match=repr(bad)):
            parse_nbytes(bad)
    with pytest.raises(BenchError, match="at least one size"):
        bench.parse_sizes(" , ")


def test_bus_factor_is_the_nccl_tests_convention():
    assert bench_summary.bus_factor("all_gather", 4) == pytest.approx(3 / 4)
    assert bench_summary.bus_factor("reduce_scatter", 2) == pytest.approx(1 / 2)
    assert bench_summary.bus_factor("all_reduce", 4) == pytest.approx(2 * 3 / 4)


def _comm(rank: int, rep: int, dur_s: float, group_index: int = 0) -> Span:
    return Span(name="all_reduce", cat="comm", rank=rank, step=rep, start_s=0.0, dur_s=dur_s,
                nbytes=1_000_000, group="inter",
                attrs={"group_size": 2, "nodes": 2, "ranks": [0, 1], "group_index": group_index,
                       "concurrent_groups": 1, "impl": "gloo_allreduce", "case": 1})


def test_summary_takes_the_slowest_rank_then_the_median(tmp_path):
    meta = {"world_size": 2, "nodes": 2, "network": "loopback", "host_cores": 2}
    # rep 0: ranks take 1 and 3 ms -> 3 ms; rep 1: 2 and 2 -> 2; rep 2: 10 and 1 -> 10
    write_trace(tmp_path / "bench-rank0.jsonl", meta, [
        _comm(0, 0, 1e-3), _comm(0, 1, 2e-3), _comm(0, 2, 10e-3),
        Span(name="forward", cat="compute", rank=0, step=0, start_s=0, dur_s=0.5,
             attrs={"flops": 1e9, "concurrent": 2, "hidden": 8, "ffn_hidden": 16}),
        Span(name="all_reduce_tiny", cat="host", rank=0, step=0, start_s=0, dur_s=1e-3,
             group="check", attrs={"group_size": 2, "nodes": 1, "debug": "off"}),
        Span(name="all_reduce_tiny", cat="host", rank=0, step=0, start_s=0, dur_s=4e-3,
             group="check", attrs={"group_size": 2, "nodes": 1, "debug": "detail"}),
    ])
    write_trace(tmp_path / "bench-rank1.jsonl", meta,
                [_comm(1, 0, 3e-3), _comm(1, 1, 2e-3), _comm(1, 2, 1e-3)])
    s = summarize(tmp_path)
    (row,) = s["comm"]
    assert row["time_s"] == pytest.approx(3e-3)  # median of 3, 2, 10 ms
    assert row["min_time_s"] == pytest.approx(2e-3)
    assert row["samples"] == 3
    assert row["algbw_Gbps"] == pytest.approx(8e6 / 3e-3 / 1e9)
    assert row["busbw_Gbps"] == pytest.approx(row["algbw_Gbps"])  # all-reduce, p = 2
    (comp,) = s["compute"]
    assert comp["gflops_per_s"] == pytest.approx(2.0)
    (check,) = s["checks"]
    assert check["detail_check_s"] == pytest.approx(3e-3)
    assert "all_reduce" in bench.format_summary(s)


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    return lines[0]


@pytest.mark.parametrize(("args", "expected"), [
    (["--nproc", "1"], "--nproc: must be 2..64, got 1"),
    (["--ops", "all_gather,broadcast"], "--ops: unknown broadcast; valid: all_gather,"),
    (["--sizes", "12Q"], "size '12Q'"),
    (["--iters", "0"], "--iters: must be >= 1, got 0"),
    (["--testbed"], "no testbed 'tnone' is up; give a SCENARIO"),
    (["--rate-Gbps", "1"], "--rate-Gbps applies to the testbed; add --testbed"),
    # before: nan ran the bench with no time limit, -1 launched the ranks then "timed out"
    (["--timeout-s", "nan"], "--timeout-s: must be a finite number > 0, got nan"),
    (["--timeout-s", "-1"], "--timeout-s: must be a finite number > 0, got -1"),
    (["--case-budget-s", "nan"], "--case-budget-s: must be a finite number >= 0, got nan"),
    (["--testbed", "--rate-Gbps", "-1"], "--rate-Gbps: must be a finite rate > 0, got -1"),
])
def test_bad_input_is_one_line_and_runs_nothing(tmp_path, args, expected):
    out = tmp_path / "out"
    line = _one_line_error(CliRunner().invoke(bench_command, [*args, "--out", str(out),
                                                              "--prefix", "tnone"]))
    assert expected in line
    assert not out.exists()  # bad input leaves nothing behind


@pytest.mark.slow
def test_loopback_bench_writes_every_case(tmp_path):
    out = tmp_path / "bench"
    sizes = [4096, 8 << 20]  # far apart: small messages on a busy host vary by milliseconds
    result = CliRunner().invoke(bench_command, [
        "--nproc", "2", "--out", str(out), "--sizes", "4K,8M", "--iters", "3",
        "--flops", "1e5,1e7", "--check-iters", "2", "--timeout-s", "120"])
    assert result.exit_code == 0, result.output + (out / "launch.log").read_text()[-3000:]
    spans_of: dict[int, list[Span]] = {}
    for rank in (0, 1):
        meta, spans = read_trace(out / f"bench-rank{rank}.jsonl")
        assert meta["world_size"] == 2 and meta["backend"] == "gloo"
        assert meta["network"] == "loopback" and meta["nodes"] == 1
        assert meta["impl"]["reduce_scatter"] == "gloo_allreduce"
        assert meta["threads"] == 1
        spans_of[rank] = spans
    comm = [s for s in spans_of[0] if s.cat == "comm"]
    # one node of 2 ranks: the intra-node group only; 3 ops x 2 sizes x 3 repetitions
    assert len(comm) == 3 * 2 * 3
    assert {(s.name, s.nbytes) for s in comm} == {
        (op, n) for op in ("all_gather", "reduce_scatter", "all_reduce") for n in sizes}
    for s in comm:
        assert s.group == "intra" and s.dur_s > 0 and s.stream == "comm"
        assert s.attrs["group_size"] == 2 and s.attrs["ranks"] == [0, 1]
        assert s.attrs["nodes"] == 1 and s.attrs["concurrent_groups"] == 1
    # interleaved (3 rounds by default): every case once per round, one repetition each, so a
    # disturbance of the machine costs one sample of several cases, not all three of one
    rounds = [s.attrs["round"] for s in comm]
    assert rounds == sorted(rounds) and rounds.count(0) == rounds.count(2) == 3 * 2
    assert [(s.name, s.nbytes) for s in comm if s.attrs["round"] == 0] == \
        [(s.name, s.nbytes) for s in comm if s.attrs["round"] == 2]
    assert len({s.step for s in comm if (s.name, s.nbytes) == ("all_reduce", 4096)}) == 3
    # both ranks timed the same repetitions of the same cases
    key = [(s.name, s.nbytes, s.step, s.attrs["case"]) for s in comm]
    assert key == [(s.name, s.nbytes, s.step, s.attrs["case"])
                   for s in spans_of[1] if s.cat == "comm"]
    # compute: backward = 2 x forward FLOPs, every rank at once and rank 0 alone
    fwd = [s for s in spans_of[0] if s.cat == "compute" and s.name == "forward"]
    bwd = [s for s in spans_of[0] if s.cat == "compute" and s.name == "backward"]
    assert len(fwd) == len(bwd) == 2 * 2 * 3
    assert {s.attrs["concurrent"] for s in fwd} == {1, 2}
    for f, b in zip(fwd, bwd, strict=True):
        assert b.attrs["flops"] == 2 * f.attrs["flops"]
        assert f.attrs["flops"] == 4 * f.attrs["tokens"] * 256 * 1024
    assert not [s for s in spans_of[1] if s.cat == "compute" and s.attrs["concurrent"] == 1]
    # debug checks on the 2-rank group: plain and DETAIL-wrapped collective, and the parts
    host = [s for s in spans_of[0] if s.cat == "host"]
    assert {(s.name, s.attrs.get("debug", "")) for s in host} == {
        ("all_reduce_tiny", "off"), ("all_reduce_tiny", "detail"), ("monitored_barrier", ""),
        ("all_gather_tiny", "")}
    assert all(s.attrs["group_size"] == 2 and s.group == "check" for s in host)
    # the summary: a bigger message takes longer (fastest repetition vs fastest)
    summary = json.loads((out / "bench-summary.json").read_text())
    ar = {r["nbytes"]: r for r in summary["comm"] if r["op"] == "all_reduce"}
    assert ar[8 << 20]["min_time_s"] > ar[4096]["min_time_s"]
    assert summary["checks"][0]["group_size"] == 2
    assert "all_reduce" in result.output and "GFLOP/s" in result.output


def test_auto_sizes_are_the_models_unit_shard_and_fedavg_sizes():
    scn = load_scenario("scenarios/testbed.yaml")
    sizes = bench.auto_sizes(scn)
    root, layer = (u.nbytes for u in scn.model.units(scn.training.seq_len)[:2])
    assert sizes[0] == bench.LATENCY_NBYTES and sizes == sorted(set(sizes))
    assert {root, layer, root // 2, layer // 2} <= set(sizes)  # units; HSDP shard 2's all-reduce
    assert scn.model.total_params * 2 in sizes  # fl_hsdp (shard 1): the bf16 FedAvg buffer
    # fl_fsdp's buffer (half the model in bf16) is within 10% of a layer: one case for both
    assert scn.model.total_params not in sizes
    assert all(b > a * 1.1 for a, b in itertools.pairwise(sizes))
    assert bench.resolve_sizes(None, scn) == sizes
    assert bench.resolve_sizes(None, None) == bench.parse_sizes(bench.DEFAULT_SIZES)
    with pytest.raises(BenchError, match="needs a SCENARIO"):
        bench.resolve_sizes("auto", None)


def _unit(rank: int, rep: int, unit: int, phase: str, dur_s: float, **extra) -> Span:
    kind = "model" if unit < 0 else "root" if unit == 0 else "layer"
    attrs = {"bench": "units", "unit": unit, "unit_name": f"u{unit}", "kind": kind,
             "phase": phase, "hooks": extra.pop("hooks", True), "params": 10, "flops": 1e9,
             "tokens": 8, "ranks_per_node": 2, "cores": 1, "concurrent": 2,
             "cpu_s": dur_s / 2}
    return Span(name=phase, cat="compute", rank=rank, step=rep, start_s=0.0, dur_s=dur_s,
                attrs=attrs)


def test_summary_of_units_optimizer_and_fedavg(tmp_path):
    meta = {"world_size": 2, "nodes": 1, "network": "loopback", "host_cores": 2}
    spans = {0: [], 1: []}
    for rep, (a, b) in enumerate([(1.0, 3.0), (2.0, 2.0), (10.0, 1.0)]):  # slowest: 3, 2, 10
        for rank, d in ((0, a), (1, b)):
            spans[rank] += [_unit(rank, rep, 0, "forward", d * 1e-3),
                            _unit(rank, rep, 1, "forward", 2 * d * 1e-3),
                            _unit(rank, rep, -1, "forward", 2.5 * d * 1e-3, hooks=False)]
            opt = {"bench": "optimizer", "shard": 2, "params": 100, "tensors": 3, "cpu_s": d}
            spans[rank].append(Span(name="optimizer", cat="host", rank=rank, step=rep,
                                    start_s=0, dur_s=d, attrs=opt))
            fed = {"bench": "fedavg", "shard": 2, "params": 100, "tensors": 3,
                   "fedavg_dtype": "bf16"}
            spans[rank].append(Span(name="fedavg_local", cat="host", rank=rank, step=rep,
                                     start_s=0, dur_s=d, nbytes=200, attrs=fed))
    spans[0].append(Span(name="optimizer", cat="host", rank=0, step=-1, start_s=0, dur_s=7.0,
                         attrs={"bench": "optimizer", "shard": 2, "params": 100, "tensors": 3,
                                "first": True}))
    for rank in (0, 1):
        write_trace(tmp_path / f"bench-rank{rank}.jsonl", meta, spans[rank])
    s = summarize(tmp_path)
    root, layer = s["units"]
    assert (root["unit"], root["kind"], layer["kind"]) == (0, "root", "layer")
    assert root["time_s"] == pytest.approx(3e-3) and layer["time_s"] == pytest.approx(6e-3)
    assert root["cpu_time_s"] == pytest.approx(1.5e-3) and root["samples"] == 3
    assert root["alone_time_s"] is None  # no one-rank-per-node iterations in this trace
    assert root["gflops_per_s"] == pytest.approx(1e9 / 3e-3 / 1e9)
    (whole,) = s["model"]
    assert whole["time_s"] == pytest.approx(7.5e-3) and whole["hooked_time_s"] is None
    assert whole["units_sum_s"] == pytest.approx(9e-3)
    assert whole["units_sum_ratio"] == pytest.approx(9 / 7.5)
    (opt,) = s["optimizer"]
    assert (opt["shard"], opt["params"], opt["tensors"]) == (2, 100, 3)
    assert opt["time_s"] == pytest.approx(3.0) and opt["samples"] == 3
    assert opt["first_time_s"] == pytest.approx(7.0)
    (fed,) = s["fedavg"]
    assert fed["nbytes"] == 200 and fed["time_s"] == pytest.approx(3.0)
    assert fed["fedavg_dtype"] == "bf16"
    assert not s["checks"] and not s["compute"]  # bench spans are not mistaken for those
    text = bench.format_summary(s)
    assert "units sum" in text and "first_ms" in text


@pytest.mark.slow
def test_unit_and_optimizer_bench_of_the_tiny_model(tmp_path):
    out = tmp_path / "units"
    result = CliRunner().invoke(bench_command, [
        "scenarios/testbed-tiny.yaml", "--nproc", "2", "--out", str(out), "--skip",
        "comm,compute,checks", "--unit-iters", "4", "--opt-iters", "2", "--timeout-s", "120"])
    assert result.exit_code == 0, result.output + (out / "launch.log").read_text()[-3000:]
    scn = load_scenario("scenarios/testbed-tiny.yaml")
    specs = scn.model.units(scn.training.seq_len)
    tokens = scn.training.micro_batch * scn.training.seq_len
    s = json.loads((out / "bench-summary.json").read_text())
    assert not s["comm"] and not s["checks"] and s["meta"]["skip"] == ["checks", "comm",
                                                                        "compute"]
    assert [(r["phase"], r["unit"]) for r in s["units"]] == [
        (phase, u.index) for phase in ("forward", "backward") for u in specs]
    for r in s["units"]:
        u = specs[r["unit"]]
        per_token = u.fwd_flops_per_token if r["phase"] == "forward" else u.bwd_flops_per_token
        assert r["flops"] == pytest.approx(per_token * tokens) and r["params"] == u.params
        assert r["kind"] == ("root" if u.index == 0 else "layer")
        assert r["time_s"] > 0 and r["cpu_time_s"] > 0 and r["samples"] == 4
        assert r["ranks_per_node"] == 2 and r["concurrent"] == 2
        assert r["alone_time_s"] > 0 and r["alone_cpu_time_s"] > 0  # one rank per node
    for m in s["model"]:
        # the units' times add up to the whole pass's: the ratio is the sum over the phase's
        # units; its value is a timing (loose: the host may be loaded while this runs)
        units_sum = sum(r["time_s"] for r in s["units"] if r["phase"] == m["phase"])
        assert m["units_sum_s"] == pytest.approx(units_sum)
        assert m["units_sum_ratio"] == pytest.approx(units_sum / m["time_s"])
        assert m["time_s"] > 0 and 1 / 3 < m["units_sum_ratio"] < 3, m
        assert m["alone_time_s"] > 0
    assert [r["shard"] for r in s["optimizer"]] == [1, 2, 4]
    params = [r["params"] for r in s["optimizer"]]
    assert params[0] == scn.model.total_params and params[0] > params[1] > params[2]
    for r in s["optimizer"]:
        assert r["time_s"] > 0 and r["first_time_s"] > 0 and r["tensors"] > 0
    assert [(r["shard"], r["nbytes"]) for r in s["fedavg"]] == [
        (r["shard"], r["params"] * 2) for r in s["optimizer"]]  # bf16 buffers
    assert all(r["time_s"] > 0 for r in s["fedavg"])
    _, spans = read_trace(out / "bench-rank1.jsonl")
    firsts = [sp for sp in spans if sp.name == "optimizer" and sp.attrs["first"]]
    assert [sp.step for sp in firsts] == [-1, -1, -1]
    assert {sp.attrs["bench"] for sp in spans} == {"units", "optimizer", "fedavg"}


def test_fl_groups_of_several_nodes_are_benchmarked_as_the_plans_run_them():
    from realrun.bench_rank import Bench

    from ..conftest import SCENARIOS

    scn = load_scenario(SCENARIOS / "testbed.yaml", {
        "cluster.nodes": 4, "cluster.node.gpus": 1, "algorithms.fl_fsdp.group_nodes": 2})
    b = object.__new__(Bench)  # the layout needs no process group
    b.scenario, b.ranks_per_node, b.nodes, b.world = scn, 1, 4, 4
    layout = b.group_layout()
    assert layout["nodes2"] == [[0, 1], [2, 3]]  # FL+FSDP's shard groups on 4 nodes of 1 rank
    assert scn.algorithm("fl_fsdp").plan(scn.cluster).groups == 2
    assert "nodes1" not in layout and "nodes4" not in layout  # intra / inter cover those


def _reps_worker(rank: int, store: str, out: str) -> None:
    import time

    import torch
    import torch.distributed as dist

    from realrun.bench_rank import Bench

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    ran, busy = [], [0]

    def fn(i: int) -> None:
        time.sleep(0.05)  # the "collective" of the active rank
        ran.append(i)

    def work(barrier) -> None:  # until the active rank is done (it enters the barrier)
        while not barrier.is_completed():
            busy[0] += 1
            time.sleep(0.002)

    # two calls in a row (warm-up and timed, as repeat makes them), then a collective that
    # only lines up if every rank made the same barrier calls
    Bench._reps(range(-1, 0), rank == 0, fn, work)
    Bench._reps(range(3), rank == 0, fn, work)
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    with open(f"{out}.{rank}", "w") as fh:
        fh.write(json.dumps({"ran": ran, "busy": busy[0], "sum": float(t.item())}))
    dist.destroy_process_group()


def test_summary_of_the_free_running_loop_says_how_far_apart_ranks_arrive(tmp_path):
    """The loop case: per case (beside idle | busy), the median block and all-gather, and how
    far apart the ranks reached each all-gather (a rank's sd from each round's range)."""
    meta = {"world_size": 4, "nodes": 4, "network": "testbed", "host_cores": 2}
    attrs = {"flops": 5e8, "concurrent": 2, "hidden": 8, "ffn_hidden": 16, "nbytes": 4096}
    arrive = {"idle": [(0.0, 0.001), (1.0, 1.003)], "busy": [(0.0, 0.010), (1.0, 1.030)]}
    for rank in (0, 1):
        write_trace(tmp_path / f"bench-rank{rank}.jsonl", meta, [
            Span(name="loop", cat="compute", rank=rank, step=i, start_s=times[i][rank],
                 dur_s=0.01 * (rank + 1), attrs={**attrs, "beside": beside, "coll_s": 0.04})
            for beside, times in arrive.items() for i in range(2)])
    rows = {r["beside"]: r for r in summarize(tmp_path)["compute"]}
    d2 = 2 / math.sqrt(math.pi)  # E[range of 2 standard normal draws] = 2/sqrt(pi) = 1.128
    assert rows["idle"]["arrival_sd_s"] == pytest.approx((0.001 + 0.003) / 2 / d2)
    assert rows["busy"]["arrival_sd_s"] == pytest.approx((0.010 + 0.030) / 2 / d2)
    assert rows["busy"]["time_s"] == pytest.approx(0.015)  # median of the ranks' blocks
    assert rows["busy"]["coll_time_s"] == pytest.approx(0.04)
    assert rows["busy"]["samples"] == 2 and rows["busy"]["phase"] == "loop"


def test_summary_of_the_drift_case_says_how_far_apart_two_groups_finish(tmp_path):
    """The drift case: two groups (ranks 0-1 and 2-3) run the loop free from a common barrier;
    per round a group ends with its last member, and the rows give the rms of the two groups'
    end difference (a steady lead of one group counts) and the median round."""
    meta = {"world_size": 4, "nodes": 2, "network": "testbed", "host_cores": 2}
    attrs = {"flops": 5e8, "concurrent": 4, "hidden": 8, "ffn_hidden": 16, "nbytes": 4096,
             "group_size": 2, "loop_iters": 48}
    # round -> rank -> (start, duration): group 0 ends 0.03 s, then 0.05 s before group 1
    rounds = [{0: (0.0, 0.70), 1: (0.001, 0.70), 2: (0.0, 0.72), 3: (0.0, 0.73)},
              {0: (5.0, 0.80), 1: (5.0, 0.79), 2: (5.002, 0.85), 3: (5.0, 0.84)}]
    for rank in range(4):
        write_trace(tmp_path / f"bench-rank{rank}.jsonl", meta, [
            Span(name="drift", cat="compute", rank=rank, step=i, start_s=r[rank][0],
                 dur_s=r[rank][1], attrs={**attrs, "drift_group": rank // 2})
            for i, r in enumerate(rounds)])
    (row,) = [r for r in summarize(tmp_path)["compute"] if r["phase"] == "drift"]
    diffs = [0.701 - 0.73, 5.8 - 5.852]
    assert row["drift_rms_s"] == pytest.approx(math.sqrt((diffs[0] ** 2 + diffs[1] ** 2) / 2))
    assert row["drift_mean_s"] == pytest.approx(sum(diffs) / 2)
    assert row["drift_mean_abs_s"] == pytest.approx(-sum(diffs) / 2)
    assert row["samples"] == 2 and row["loop_iters"] == 48 and row["group_size"] == 2
    assert row["time_s"] == pytest.approx((0.73 + 0.8) / 2)  # median of the groups' rounds


def test_busy_ranks_work_until_the_active_ones_are_done(tmp_path):
    """The one-group-beside-busy bench: the inactive ranks enter the next barrier early and
    work until it completes; every rank still makes the same barrier calls."""
    import torch.multiprocessing as mp

    out = str(tmp_path / "res")
    mp.start_processes(_reps_worker, args=(str(tmp_path / "store"), out), nprocs=2,
                       start_method="spawn")
    r0 = json.loads((tmp_path / "res.0").read_text())
    r1 = json.loads((tmp_path / "res.1").read_text())
    assert r0["ran"] == [-1, 0, 1, 2] and r0["busy"] == 0
    assert r1["ran"] == [] and r1["busy"] >= 4 * 5  # busy through four 50 ms repetitions
    assert r0["sum"] == r1["sum"] == 3.0


def test_summary_rows_are_the_typed_rows_calibration_reads(tmp_path):
    """The summary's rows are simfed.spec.bench's: written by summarize, read back by
    calibration's read_bench unchanged (the JSON round-trips byte for byte), and a summary with
    a row that is not one is a one-line error naming the row and the field."""
    from simfed.calibration.samples import read_bench
    from simfed.spec import SpecError
    from simfed.spec.bench import BenchSummary, CommRow, ComputeRow

    test_summary_takes_the_slowest_rank_then_the_median(tmp_path)
    s = summarize(tmp_path)
    typed = BenchSummary.parse(s, "summary")
    assert isinstance(typed.comm[0], CommRow) and isinstance(typed.compute[0], ComputeRow)
    assert json.dumps(typed.to_json(), indent=1) == json.dumps(s, indent=1)
    assert "beside" not in s["comm"][0]  # an optional field left unset stays absent
    (tmp_path / "bench-summary.json").write_text(json.dumps(s))
    samples = read_bench(tmp_path)
    assert [(c.op, c.nbytes, c.time_s) for c in samples.comm] == [
        ("all_reduce", 1_000_000, pytest.approx(3e-3))]
    assert [c.time_s for c in samples.checks] == [pytest.approx(3e-3)]
    bad = {**s, "comm": [{**s["comm"][0], "time_s": "slow"}]}
    (tmp_path / "bench-summary.json").write_text(json.dumps(bad))
    with pytest.raises(SpecError, match=r"comm\[0\]\.time_s: input should be a valid number"):
        read_bench(tmp_path)
    typo = {**s, "comm": [{**s["comm"][0], "time_ms": 3}]}
    (tmp_path / "bench-summary.json").write_text(json.dumps(typo))
    with pytest.raises(SpecError, match=r"comm\[0\]\.time_ms: unknown key; valid keys: "):
        read_bench(tmp_path)
