"""`simfed calibrate`'s readers have size, nesting and event limits, each named in a one-line
refusal (exit 2). Before: a Chrome trace nested 100,000 deep was a RecursionError (exit 3), as
were a bench summary, a realrun trace line or a "Process Group Ranks" string nested that deep;
a trace had no size or event cap (about 0.1 ms an event: a 110 MB trace ran for minutes)."""

import gzip
import json

import pytest

from simfed.calibration import profiler
from simfed.calibration.profiler import read as profiler_read

from .test_bad_inputs import HEAD, NCCL, SPAN, _calibrate, _refused

DEEP = "[" * 100_000 + "]" * 100_000


def test_a_chrome_trace_nested_deeper_than_64_is_refused(tmp_path):
    p = tmp_path / "trace.json"
    p.write_text('{"traceEvents": ' + DEEP + "}")
    _refused(_calibrate(tmp_path, p), "trace.json", "nested deeper than 64")
    seventy = json.loads("[" * 70 + "]" * 70)  # parses, but deeper than the limit
    p.write_text(json.dumps({"traceEvents": [NCCL, {"args": {"x": seventy}}]}))
    _refused(_calibrate(tmp_path, p), "trace.json", "nested deeper than 64")


def test_a_process_group_ranks_string_nested_deep_is_refused(tmp_path):
    p = tmp_path / "trace.json"
    event = {**NCCL, "args": {**NCCL["args"], "Process Group Ranks": DEEP}}
    p.write_text(json.dumps({"traceEvents": [event]}))
    _refused(_calibrate(tmp_path, p), "trace.json", "NCCL kernel", "nested deeper than 64")


def test_a_trace_over_the_event_or_size_limit_is_refused(tmp_path, monkeypatch):
    p = tmp_path / "trace.json"
    p.write_text(json.dumps({"traceEvents": [NCCL] * 20}))
    monkeypatch.setattr(profiler_read, "MAX_TRACE_EVENTS", 10)
    _refused(_calibrate(tmp_path, p), "holds 20 events; the limit is 10",
             "profile fewer steps")
    monkeypatch.setattr(profiler_read, "MAX_TRACE_EVENTS", 10**6)
    monkeypatch.setattr(profiler_read, "MAX_TRACE_BYTES", 1000)
    _refused(_calibrate(tmp_path, p), "trace.json", "the limit is 1,000")
    gz = tmp_path / "trace.json.gz"
    gz.write_bytes(gzip.compress(p.read_bytes()))
    _refused(_calibrate(tmp_path, gz), "unpacks to more than 1,000 bytes")
    gz.write_bytes(gzip.compress(p.read_bytes())[:40])  # cut short
    _refused(_calibrate(tmp_path, gz), "not a readable gzip file")
    assert profiler.MAX_TRACE_EVENTS == 2_000_000  # the package exports the module's limits


def test_a_bench_summary_or_trace_line_nested_deep_is_refused(tmp_path):
    folder = tmp_path / "bench"
    folder.mkdir()
    (folder / "bench-summary.json").write_text('{"meta": ' + DEEP + "}")
    _refused(_calibrate(tmp_path, folder), "bench-summary.json", "nested deeper than 64")
    t = tmp_path / "trace_rank0.jsonl"
    deep_span = json.dumps(SPAN)[:-1] + ', "x": ' + DEEP + "}"
    t.write_text("\n".join([json.dumps(HEAD), deep_span, json.dumps(SPAN)]) + "\n")
    _refused(_calibrate(tmp_path, t), "trace_rank0.jsonl:2", "nested deeper than 64")
    t.write_text(DEEP + "\n" + json.dumps(SPAN) + "\n")
    _refused(_calibrate(tmp_path, t), "trace_rank0.jsonl:1", "header is not JSON")


@pytest.mark.parametrize("module, limit", [("read", 600), ("ops", 600), ("fit", 600)])
def test_the_profiler_modules_stay_small(module, limit):
    import importlib
    import inspect

    src = inspect.getsource(importlib.import_module(f"simfed.calibration.profiler.{module}"))
    assert len(src.splitlines()) <= limit


@pytest.mark.parametrize("head, span, needle", [
    # before: TypeError (exit 3) or the header taken as empty; found by the fuzzer
    (HEAD, {**SPAN, "attrs": {"ranks": -1}}, "attrs.ranks -1 is not a list"),
    (HEAD, {**SPAN, "attrs": {"ranks": 0.5}}, "attrs.ranks 0.5 is not a list"),
    ({**HEAD, "meta": float("inf")}, SPAN, "meta is 'inf', not a JSON object"),
    ({**HEAD, "meta": 0}, SPAN, "meta is '0', not a JSON object"),
])
def test_a_trace_with_values_of_the_wrong_type_is_refused(tmp_path, head, span, needle):
    t = tmp_path / "trace_rank0.jsonl"
    t.write_text("\n".join(json.dumps(x) for x in (head, span, SPAN)) + "\n")
    _refused(_calibrate(tmp_path, t), "trace_rank0.jsonl", needle)
