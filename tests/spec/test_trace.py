"""The trace schema: JSONL round trip, torn-line tolerance, Chrome export."""

import json

import pytest

from simfed.spec import Span, SpecError, TraceWriter, read_trace, to_chrome


def test_roundtrip_and_torn_last_line(tmp_path):
    p = tmp_path / "rank0.jsonl"
    spans = [Span(name="all_gather", cat="comm", rank=0, step=1, start_s=0.5, dur_s=0.25,
                  nbytes=1024, group="shard", stream="comm", attrs={"group_size": 4}),
             Span(name="forward", cat="phase", rank=0, step=1, start_s=0.0, dur_s=1.0)]
    with TraceWriter(p, {"source": "test", "world_size": 4}) as w:
        for s in spans:
            w.write(s)
    with open(p, "a") as fh:
        fh.write('{"name": "all_red')  # a crash mid-line
    meta, back = read_trace(p)
    assert meta == {"source": "test", "world_size": 4}
    assert back == spans


def test_wrong_schema(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text(json.dumps({"schema": "other"}) + "\n")
    with pytest.raises(SpecError, match="schema is 'other'"):
        read_trace(p)


def test_chrome_export():
    spans = [Span(name="fwd", cat="compute", rank=3, step=0, start_s=1e-3, dur_s=2e-3,
                  stream="compute")]
    trace = to_chrome(spans)
    x = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert x[0]["ts"] == 1000.0 and x[0]["dur"] == 2000.0 and x[0]["pid"] == 3
