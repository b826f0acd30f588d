"""`simfed calibrate` on damaged inputs: one error line naming the file, the row and the field,
exit status 2; never an internal error (exit 3) and never a profile fitted to nonsense."""

import json

import pytest
from click.testing import CliRunner

from simfed.cli import main

from ..conftest import ROOT
from .test_validate import _bench

TINY = ROOT / "tests" / "fixtures" / "tiny2x2.yaml"


def _calibrate(tmp_path, *inputs):
    res = CliRunner().invoke(main, ["calibrate", *map(str, inputs), "--scenario", str(TINY),
                                    "--out", str(tmp_path / "p.yaml")])
    assert "Traceback" not in res.output and "internal error" not in res.output, res.output
    return res


def _refused(res, *needles):
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, res.output
    for n in needles:
        assert n in lines[0], lines[0]


def _damaged_bench(tmp_path, change):
    folder = tmp_path / "bench"
    _bench(folder, 0.4)
    p = folder / "bench-summary.json"
    data = json.loads(p.read_text())
    change(data)
    p.write_text(json.dumps(data))
    return folder


def _set(table, i, key, value):
    def change(d):
        d[table][i][key] = value
    return change


def _meta(key, value):
    def change(d):
        d["meta"][key] = value
    return change


@pytest.mark.parametrize("change, needles", [
    # before: ZeroDivisionError in ranks_per_core (exit 3)
    (_meta("ranks_per_node", 1e-9), ["meta.ranks_per_node", "1e-09"]),
    # before: ValueError max() of an empty sequence in the ring model (exit 3)
    (_meta("nodes", -1), ["meta.nodes", "-1"]),
    (_meta("nodes", True), ["meta.nodes"]),
    (_meta("link_rate_Gbps", -0.5), ["meta.link_rate_Gbps", "-0.5"]),
    # before: 1e-300 overflowed the fit (exit 3); 1e308 was fitted and written (exit 0)
    (_meta("link_rate_Gbps", 1e-300), ["meta.link_rate_Gbps", "1e-300"]),
    (_meta("link_rate_Gbps", 1e308), ["meta.link_rate_Gbps", "1e+308"]),
    # before: the fit overflowed, every unknown was set aside and covariance() of nothing
    # raised ValueError (exit 3)
    (_set("comm", 2, "nbytes", 10**30), ["comm[2].nbytes", "1000000000000000000000000000000"]),
    # before: residuals not finite in least_squares (exit 3)
    (_set("comm", 0, "time_s", 1e-300), ["comm[0].time_s", "1e-300"]),
    (_set("comm", 0, "time_s", float("nan")), ["comm[0].time_s", "finite"]),
    (_set("comm", 0, "time_s", -0.1), ["comm[0].time_s", "-0.1"]),
    (_set("comm", 0, "group_size", 0), ["comm[0].group_size", "0"]),
    # before: accepted silently (a group of another kind, a group larger than the nodes)
    (_set("comm", 0, "group", "abc"), ["group 'abc'"]),
    (_set("comm", 0, "group_size", 3), ["3 ranks", "2 ranks per node"]),
    # before: ZeroDivisionError in node_block_groups (exit 3)
    (_set("comm", 0, "group", "nodes0"), ["a block of 0 nodes"]),
    # before: an error that named no file
    (_set("comm", 0, "op", "abc"), ["bench-summary.json", "op 'abc'"]),
])
def test_a_damaged_bench_summary_is_one_line_naming_row_and_field(tmp_path, change, needles):
    folder = _damaged_bench(tmp_path, change)
    _refused(_calibrate(tmp_path, folder), "bench-summary.json", *needles)
    assert not (tmp_path / "p.yaml").exists()


def test_odd_but_possible_bench_numbers_still_fit(tmp_path):
    """Outliers a real bench can record (a 1 ns and a 10 day case, a 512 TiB buffer) are fitted,
    not refused (before: the 512 TiB case set every unknown aside and covariance() of none
    raised ValueError, exit 3)."""
    def change(d):
        d["comm"][0]["time_s"] = 1e-9
        d["comm"][1]["time_s"] = 1e6
        d["comm"][2]["nbytes"] = 2**49
    folder = _damaged_bench(tmp_path, change)
    res = _calibrate(tmp_path, folder)
    assert res.exit_code == 0, res.output


# ---- realrun traces (.jsonl) -----------------------------------------------------------------
HEAD = {"schema": "simfed-trace", "version": 1, "meta": {"world_size": 4, "backend": "gloo"}}
SPAN = {"name": "all_gather", "cat": "comm", "rank": 0, "step": 1, "start_s": 0.5,
        "dur_s": 0.01, "nbytes": 65536, "group": "shard", "attrs": {"ranks": [0, 1]}}


def _trace(tmp_path, head=HEAD, **change):
    p = tmp_path / "trace_rank0.jsonl"
    span = {**SPAN, **change}
    p.write_text("\n".join(json.dumps(x) for x in (head, span, SPAN)) + "\n")
    return p


@pytest.mark.parametrize("change, needles", [
    # before: OverflowError int(inf) (exit 3)
    ({"step": float("inf")}, [":2:", "malformed span"]),
    # before: TypeError in ranks_per_core (exit 3)
    ({"attrs": {"ranks": [0, [1]]}}, ["rank 0 step 1 all_gather", "attrs.ranks"]),
    ({"attrs": {"ranks": [0, 9]}}, ["rank 9 of a world of 4"]),
    ({"attrs": {"ranks": [1, 1]}}, ["distinct"]),
    # before: residuals not finite in least_squares (exit 3); NaN: fitted
    ({"dur_s": float("inf")}, [":2:", "dur_s", "inf"]),
    ({"dur_s": float("nan")}, [":2:", "dur_s", "nan"]),
    ({"dur_s": -1.0}, [":2:", "dur_s", "-1.0"]),
    ({"dur_s": 1e-300}, ["1e-300 s"]),
    # before: covariance() of an empty Jacobian (exit 3)
    ({"nbytes": 10**30}, ["1000000000000000000000000000000 B"]),
])
def test_a_damaged_trace_is_one_line_naming_the_span(tmp_path, change, needles):
    _refused(_calibrate(tmp_path, _trace(tmp_path, **change)), "trace_rank0.jsonl", *needles)


@pytest.mark.parametrize("meta, needles", [
    ({"world_size": "four"}, ["meta.world_size", "'four'"]),
    # before: these three were fitted and written (exit 0)
    ({"world_size": 0}, ["meta.world_size", "got 0"]),
    ({"rank": -1}, ["meta.rank", "got -1"]),
    ({"backend": "[" * 100 + "]" * 100}, ["header is not JSON", "deeper than 64"]),
])
def test_a_trace_with_a_bad_header_is_refused(tmp_path, meta, needles):
    head = {**HEAD, "meta": meta}
    path = _trace(tmp_path, head=head)
    if "backend" in meta:  # a value nested 100 deep, written as it is
        text = path.read_text().replace(json.dumps(meta["backend"]), meta["backend"], 1)
        path.write_text(text)
    _refused(_calibrate(tmp_path, path), *needles)


@pytest.mark.parametrize("name, body", [
    ("t.json", "{}"), ("t.json", "[1, 2, 3]"), ("t.json", '{"traceEvents": []}'),
    ("t.jsonl", json.dumps(HEAD) + "\n"),
    ("bench-summary.json", '{"meta": {}}'),
])
def test_an_input_with_nothing_to_fit_is_refused(tmp_path, name, body):
    """Before: exit 0 and a profile that is the scenario's own, fitted to nothing."""
    p = tmp_path / name
    p.write_text(body)
    _refused(_calibrate(tmp_path, p), str(p), "nothing to fit")
    assert not (tmp_path / "p.yaml").exists()


# ---- PyTorch profiler Chrome traces ----------------------------------------------------------
NCCL = {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL", "ts": 10.0,
        "dur": 250.0, "args": {"Collective name": "_allgather_base", "In msg nelems": 1024,
                               "Out msg nelems": 4096, "dtype": "BFloat16", "Group size": 2,
                               "Process Group Ranks": "[0, 1]"}}


def _chrome(tmp_path, event):
    p = tmp_path / "trace.json"
    p.write_text(json.dumps({"traceEvents": [event, NCCL]}))
    return p


@pytest.mark.parametrize("change, needles", [
    # before: non-finite residuals in least_squares (exit 3), or a negative time fitted
    ({"dur": float("nan")}, ["event 0", "dur nan"]),
    ({"dur": "NaN"}, ["event 0", "dur 'NaN'"]),
    ({"dur": -250.0}, ["event 0", "dur -250.0"]),
    ({"dur": 1e-300}, ["event 0", "dur 1e-300"]),
    ({"ts": float("inf")}, ["event 0", "ts inf"]),
    # before: OverflowError int(inf) (exit 3)
    ({"args": {**NCCL["args"], "In msg nelems": float("inf")}}, ["malformed input"]),
    # before: accepted silently
    ({"args": {**NCCL["args"], "In msg nelems": -5}}, ["In/Out msg nelems -5/4096"]),
    ({"args": {**NCCL["args"], "Process Group Ranks": "[0, 0]"}}, ["[0, 0]", "distinct"]),
    ({"args": {**NCCL["args"], "Process Group Ranks": "[0, -1]"}}, ["[0, -1]"]),
    ({"args": {**NCCL["args"], "Group size": 10**9}}, ["Group size 1000000000"]),
])
def test_a_damaged_nccl_kernel_is_one_line(tmp_path, change, needles):
    _refused(_calibrate(tmp_path, _chrome(tmp_path, {**NCCL, **change})), "trace.json",
             *needles)


def test_operators_nested_deeper_than_the_recursion_limit_are_read(tmp_path):
    """Before: RecursionError (exit 3) walking a call tree of operators with equal spans."""
    from simfed.calibration.profiler import op_samples

    ops = [{"ph": "X", "cat": "cpu_op", "name": "aten::add_", "ts": 5.0, "dur": 2.0, "pid": 1,
            "tid": 1, "args": {"Input Dims": [[4, 4], [4, 4]], "Input type": ["float", "float"],
                               "External id": i}} for i in range(1500)]
    op_samples({"traceEvents": ops}, "deep.json")  # ends, without RecursionError


# ---- nccl-tests stdout -----------------------------------------------------------------------
NCCL_TESTS = ROOT / "tests" / "fixtures" / "nccl_tests" / "a3mega-h100-2node-all_reduce_perf.txt"
H100 = ROOT / "validation" / "published" / "collectives-h100.yaml"
ROW = "   268435456      67108864     float     sum      -1   2360.9  113.70  213.19      0"


@pytest.mark.parametrize("row, needles", [
    # before: each was fitted silently (exit 0)
    (ROW.replace("2360.9", "   0.0"), ["is not the algbw 113.7"]),
    (ROW.replace("2360.9", " 1e308"), ["1e+308 us"]),
    (ROW.replace("   268435456", "99999999999999999999"), ["99999999999999999999 B"]),
    (ROW.replace("113.70", "  1e30"), ["algbw 1e+30"]),
    (ROW.replace("213.19", "  1e30"), ["busbw / algbw is 8.795e+27", "1.875"]),
])
def test_a_damaged_nccl_tests_row_is_one_line_naming_the_line(tmp_path, row, needles):
    text = NCCL_TESTS.read_text()
    assert ROW.strip() in text
    p = tmp_path / "all_reduce_perf.txt"
    p.write_text(text.replace(ROW.strip(), row.strip()))
    res = CliRunner().invoke(main, ["calibrate", str(p), "--scenario", str(H100), "--out",
                                    str(tmp_path / "p.yaml")])
    _refused(res, f"{p}:", *needles)


# ---- validate --measured-only on a damaged folder --------------------------------------------
def _validate(tmp_path, out, *extra):
    scn = tmp_path / "scn.yaml"
    scn.write_text(f"include: {TINY}\nvalidation:\n  repeats: 3\n  shapes: [{{name: base, "
                   "set: {}, algorithms: [fsdp, fl_fsdp]}]\n")
    res = CliRunner().invoke(main, ["validate", str(scn), "--measured-only", "--out", str(out),
                                    "--draws", "0", *extra])
    assert "Traceback" not in res.output and "internal error" not in res.output, res.output
    return res


def test_measured_only_never_launches_a_benchmark(tmp_path, monkeypatch):
    """Before: a folder without a bench summary (missing, empty, or its bench deleted) made
    `validate --measured-only` launch `realrun bench --testbed` (minutes, network namespaces)."""
    import simfed.calibration.validate as v

    def launched(*a, **k):
        raise AssertionError("launched a benchmark")

    monkeypatch.setattr(v.Runner, "realrun", launched)
    _refused(_validate(tmp_path, tmp_path / "missing"), "does not exist")
    assert not (tmp_path / "missing").exists()
    (tmp_path / "empty").mkdir()
    _refused(_validate(tmp_path, tmp_path / "empty"), "no bench summary for bench set 0",
             "bench-summary.json")
    _refused(_validate(tmp_path, tmp_path / "empty", "--fresh"), "--measured-only", "--fresh")


def _measured_folder(tmp_path):
    from .test_validate import _launches

    out = tmp_path / "out"
    _bench(out / "bench" / "set0", 10.0)
    _launches(out)
    for t in (out / "runs").rglob("trace_rank*.jsonl"):  # as realrun writes: the world size
        lines = t.read_text().splitlines()
        head = json.loads(lines[0])
        head["meta"]["world_size"] = 2
        t.write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    return out


def test_a_missing_or_cut_short_rank_trace_is_refused(tmp_path):
    """Before: the job's wall time per step was taken from the ranks left (exit 0)."""
    out = _measured_folder(tmp_path)
    res = _validate(tmp_path, out)
    assert res.exit_code == 0, res.output
    run = out / "runs" / "base" / "rep1" / "fsdp"
    lines = (run / "trace_rank1.jsonl").read_text().splitlines()
    (run / "trace_rank1.jsonl").write_text("\n".join(
        ln for ln in lines if '"step":3' not in ln) + "\n")  # the rank's last step is gone
    _refused(_validate(tmp_path, out), "trace_rank1.jsonl", "its steps end at 2",
             "the other ranks' at 3")
    (run / "trace_rank1.jsonl").unlink()
    _refused(_validate(tmp_path, out), str(run), "missing trace_rank1.jsonl")


def test_a_cpu_benchmark_for_a_gpu_cluster_is_noted():
    from simfed.calibration.samples import Samples, device_note

    cpu = Samples(meta={"device": "cpu", "backend": "gloo"})
    assert "CPU ranks (gloo)" in device_note(cpu, "A100-SXM-64GB")
    assert device_note(cpu, "cpu-rank") is None
    gpu = Samples(meta={"device": "cuda:0", "backend": "nccl"})
    assert "ran on GPUs" in device_note(gpu, "cpu-rank")
    assert device_note(gpu, "H100-SXM") is None
    assert device_note(Samples(), "H100-SXM") is None  # nccl-tests, profiler: no device said
