"""The trace schema: JSONL round trip, torn-line tolerance, Chrome export, wall step times."""

import json

import pytest

from simfed.spec import Span, SpecError, TraceWriter, read_trace, to_chrome, wall_step_times


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


def test_wall_step_times_add_up_to_the_wall_time_when_groups_run_out_of_phase():
    # two federation groups meet every 2 steps (FedAvg): group A's first step is long, group
    # B's second; both end step 1 at 10 s. The slowest rank's steps (6 + 6) would say 12 s.
    a = {0: (0.0, 6.0), 1: (6.0, 10.0), 2: (10.0, 13.0), 3: (13.0, 20.0)}
    b = {0: (0.5, 4.0), 1: (4.0, 10.0), 2: (10.0, 16.0), 3: (16.0, 20.0)}
    times = wall_step_times([a, b])
    assert times == pytest.approx([6.0, 4.0, 6.0, 4.0])
    assert sum(times) == pytest.approx(20.0)  # from the first rank's start to the last end
    slowest = [max(r[s][1] - r[s][0] for r in (a, b)) for s in range(4)]
    assert sum(slowest) == pytest.approx(25.0)


def test_a_failed_write_leaves_the_trace_whole_and_names_the_file(tmp_path, monkeypatch):
    """A disk that fills mid-line: the torn line is cut off, the error names the file, and the
    writer refuses more lines (closing afterwards is harmless)."""
    import errno
    import os

    p = tmp_path / "t.jsonl"
    w = TraceWriter(p, {"source": "test", "world_size": 1})
    span = Span(name="forward", cat="compute", rank=0, step=0, start_s=0.0, dur_s=1.0)
    w.write(span)
    whole = p.read_bytes()
    real_write, calls = os.write, []

    def full_disk(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[: len(data) // 2]))  # half a line fits
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(OSError, match="No space left on device") as err:
        w.write(span)
    assert err.value.filename == str(p) and f"{len(whole):,} bytes" in str(err.value)
    assert p.read_bytes() == whole  # the half line is gone
    with pytest.raises(OSError):
        w.write(span)
    w.close()
    meta, spans = read_trace(p)
    assert meta["source"] == "test" and spans == [span]
