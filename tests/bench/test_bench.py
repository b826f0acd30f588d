"""realrun bench: argument parsing, the summary's arithmetic on a hand-made trace, one-line errors,
and a real 2-process run on loopback whose traces must hold every case in the simfed schema."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from realrun import bench
from realrun.bench import BenchError, bench_command, parse_nbytes, summarize
from simfed.spec import Span, read_trace, write_trace


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
    assert bench.bus_factor("all_gather", 4) == pytest.approx(3 / 4)
    assert bench.bus_factor("reduce_scatter", 2) == pytest.approx(1 / 2)
    assert bench.bus_factor("all_reduce", 4) == pytest.approx(2 * 3 / 4)


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
    sizes = [4096, 1 << 20]
    result = CliRunner().invoke(bench_command, [
        "--nproc", "2", "--out", str(out), "--sizes", "4K,1M", "--iters", "3",
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
    assert ar[1 << 20]["min_time_s"] > ar[4096]["min_time_s"]
    assert summary["checks"][0]["group_size"] == 2
    assert "all_reduce" in result.output and "GFLOP/s" in result.output
