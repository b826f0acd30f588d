"""The trace schema shared by simulated and real runs: spans per rank, JSONL, Chrome export.

A trace file is JSON Lines. The first line is a header:
    {"schema": "simfed-trace", "version": 1, "meta": {...}}
(meta: source "simfed" or "realrun", algorithm, backend, device, world_size, cores, threads, ...).
Every other line is one span:
    {"name", "cat", "rank", "step", "start_s", "dur_s", "nbytes", "group", "stream", "attrs"}
- cat: "compute" | "comm" | "host" | "phase" | "step"
- name: for comm, the operation: all_gather, reduce_scatter, all_reduce, barrier, ...;
  for phase: forward, backward, optimizer, aggregation, other
- group: the process-group kind (mesh dimension): shard, replicate, fed, world, or ""
- attrs: optional extras (group_size, ranks, unit, ...)
Writers flush line by line, so a killed process leaves a readable prefix; readers skip a torn
last line.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .jsonio import parse_json
from .limits import MAX_WORLD as MAX_TRACE_WORLD
from .schema import SpecError
from .yamlio import MAX_DATA_BYTES, read_text

TRACE_SCHEMA = "simfed-trace"
TRACE_VERSION = 1
CATEGORIES = ("compute", "comm", "host", "phase", "step")
PHASES = ("forward", "backward", "optimizer", "aggregation", "other")


@dataclass(slots=True)
class Span:
    name: str
    cat: str
    rank: int
    step: int
    start_s: float
    dur_s: float
    nbytes: int = 0
    group: str = ""
    stream: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def end_s(self) -> float:
        return self.start_s + self.dur_s

    def to_json(self) -> str:
        d = asdict(self)
        if not d["attrs"]:
            del d["attrs"]
        return json.dumps(d, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "span") -> Span:
        """A span read back: its times finite, its duration, rank and bytes 0 or more (a
        SpecError naming `where` and the field otherwise)."""
        try:
            span = cls(
                name=str(d["name"]), cat=str(d["cat"]), rank=int(d["rank"]), step=int(d["step"]),
                start_s=float(d["start_s"]), dur_s=float(d["dur_s"]),
                nbytes=int(d.get("nbytes", 0)), group=str(d.get("group", "")),
                stream=str(d.get("stream", "")), attrs=dict(d.get("attrs") or {}),
            )
        except (KeyError, TypeError, ValueError, OverflowError) as exc:  # int(inf): Overflow
            raise SpecError(f"{where}: malformed span ({exc.__class__.__name__}: {exc})") from None
        for key in ("start_s", "dur_s"):
            if not math.isfinite(getattr(span, key)):
                raise SpecError(f"{where}: {key} is {d[key]!r}, not a finite number of seconds")
        for key in ("dur_s", "rank", "nbytes"):
            if getattr(span, key) < 0:
                raise SpecError(f"{where}: {key} is {d[key]!r}; expected 0 or more")
        return span


def header_line(meta: dict[str, Any]) -> str:
    return json.dumps(
        {"schema": TRACE_SCHEMA, "version": TRACE_VERSION, "meta": meta},
        separators=(",", ":"), sort_keys=True,
    )


class TraceWriter:
    """Append spans to a JSONL trace, one whole line per write (crash-safe prefix). A write that
    fails (a full disk, a file-size limit) is undone back to the last whole line and raised as
    an OSError naming the file; the writer then refuses further lines, so what was written
    before stays a valid trace."""

    def __init__(self, path: str | Path, meta: dict[str, Any], *, fsync: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # O_NONBLOCK only for the open: a FIFO nobody reads is an error, not a wait forever
        self._fd: int | None = os.open(
            self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK, 0o644)
        os.set_blocking(self._fd, True)
        self._fsync = fsync
        self._size = 0  # bytes of whole lines written
        self.failed: OSError | None = None
        self._write(header_line(meta))

    def _write(self, line: str) -> None:
        if self._fd is None:
            if self.failed is not None:
                raise self.failed
            raise ValueError(f"{self.path}: trace already closed")
        data = (line + "\n").encode("utf-8")
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
            if self._fsync:
                os.fsync(self._fd)
        except OSError as exc:
            with contextlib.suppress(OSError):  # a torn line must not stay behind
                os.ftruncate(self._fd, self._size)
            self.close()
            self.failed = OSError(exc.errno, f"{exc.strerror}; the trace keeps its "
                                  f"{self._size:,} bytes written before", str(self.path))
            raise self.failed from None
        self._size += len(data)

    def write(self, span: Span) -> None:
        self._write(span.to_json())

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_trace(path: str | Path, meta: dict[str, Any], spans: Iterable[Span]) -> Path:
    """Write a whole trace as an output file (`spec.paths.write_text_atomic`: atomically, a
    device or FIFO in place, no temporary file left behind on a failure)."""
    from .paths import write_text_atomic

    lines = [header_line(meta)] + [s.to_json() for s in spans]
    return write_text_atomic(path, "\n".join(lines) + "\n")


def iter_trace(path: str | Path) -> Iterator[dict[str, Any] | Span]:
    """Yield the header's meta dict first, then spans. A torn final line is skipped."""
    path = Path(path)
    if not path.exists():
        raise SpecError(f"trace not found: {path}")
    lines = read_text(path, "trace", MAX_DATA_BYTES).split("\n")  # regular, bounded, UTF-8
    if not lines or not lines[0].strip():
        raise SpecError(f"{path}: empty trace file (no header line)")
    try:
        head = parse_json(lines[0], f"{path}:1", allow_nan=True)  # nested <= 64 deep
    except SpecError as exc:
        raise SpecError(f"{path}:1: the header is not JSON within the reader's limits "
                        f"({str(exc).removeprefix(f'{path}:1: ')})") from None
    if not isinstance(head, dict):
        raise SpecError(f"{path}:1: the header is not a JSON object")
    if head.get("schema") != TRACE_SCHEMA:
        raise SpecError(f"{path}:1: schema is {head.get('schema')!r}, expected {TRACE_SCHEMA!r}")
    version = head.get("version", 0)
    if not isinstance(version, int) or isinstance(version, bool):
        raise SpecError(f"{path}:1: version {version!r} is not an integer")
    if version > TRACE_VERSION:
        raise SpecError(f"{path}:1: trace version {head.get('version')} is newer than "
                        f"{TRACE_VERSION}")
    meta = head.get("meta")
    meta = {} if meta is None else meta
    if not isinstance(meta, dict):
        raise SpecError(f"{path}:1: meta is {str(meta)[:60]!r}, not a JSON object")
    for key in ("world_size", "rank"):  # the counts a reader sizes its ranks by
        v = meta.get(key)
        low = 1 if key == "world_size" else 0
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)
                              or not low <= v <= MAX_TRACE_WORLD):
            raise SpecError(f"{path}:1: meta.{key}: expected a whole number from {low} to "
                            f"{MAX_TRACE_WORLD:,} (or null), got {repr(v)[:60]}")
    yield dict(meta)
    body = [ln for ln in lines[1:]]
    last = max((i for i, ln in enumerate(body) if ln.strip()), default=-1)
    for i, line in enumerate(body):
        if not line.strip():
            continue
        try:
            d = parse_json(line, f"{path}:{i + 2}", allow_nan=True)  # nested <= 64 deep
        except SpecError:
            if i == last:  # torn by a crash mid-write
                return
            raise
        if not isinstance(d, dict):
            raise SpecError(f"{path}:{i + 2}: not a JSON object")
        yield Span.from_dict(d, f"{path}:{i + 2}")


def wall_step_times(steps_by_rank: Iterable[dict[int, tuple[float, float]]]) -> list[float]:
    """The job's wall time per step from each rank's (start, end) of each step on a clock the
    ranks share (realrun: seconds since a barrier before training): from when the last rank
    ended the previous step (the first step: when the first rank started it) to when the last
    rank ends this one.
    Over any run of steps they add up to its wall time, the throughput the simulator predicts.
    The slowest rank's time per step does not: federation groups out of phase between FedAvg
    rounds (one group's long step while the other's is short, and then the reverse) would count
    each long step, and overstate the time per step."""
    starts: dict[int, list[float]] = {}
    ends: dict[int, list[float]] = {}
    for per_step in steps_by_rank:
        for step, (start, end) in per_step.items():
            starts.setdefault(step, []).append(start)
            ends.setdefault(step, []).append(end)
    out: list[float] = []
    prev: float | None = None
    for step in sorted(ends):
        last = max(ends[step])
        out.append(last - (min(starts[step]) if prev is None else prev))
        prev = last
    return out


def read_trace(path: str | Path) -> tuple[dict[str, Any], list[Span]]:
    it = iter_trace(path)
    meta = next(it)
    assert isinstance(meta, dict)
    return meta, [s for s in it if isinstance(s, Span)]


def to_chrome(spans: Iterable[Span], meta: dict[str, Any] | None = None,
              process_name: str | None = None) -> dict[str, Any]:
    """Chrome trace-event JSON (chrome://tracing, ui.perfetto.dev): one process per rank, one
    thread per stream, complete ("X") events in microseconds."""
    events: list[dict[str, Any]] = []
    tids: dict[tuple[int, str], int] = {}
    for s in spans:
        key = (s.rank, s.stream or s.cat)
        if key not in tids:
            tids[key] = len([k for k in tids if k[0] == s.rank])
            events.append({"ph": "M", "name": "thread_name", "pid": s.rank, "tid": tids[key],
                           "args": {"name": key[1]}})
            if tids[key] == 0:
                label = f"{process_name} rank {s.rank}" if process_name else f"rank {s.rank}"
                events.append({"ph": "M", "name": "process_name", "pid": s.rank, "tid": 0,
                               "args": {"name": label}})
        args: dict[str, Any] = {"step": s.step}
        if s.nbytes:
            args["nbytes"] = s.nbytes
        if s.group:
            args["group"] = s.group
        args.update(s.attrs)
        events.append({
            "ph": "X", "name": s.name, "cat": s.cat, "pid": s.rank, "tid": tids[key],
            "ts": round(s.start_s * 1e6, 3), "dur": round(s.dur_s * 1e6, 3), "args": args,
        })
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": meta or {}}


def write_chrome(path: str | Path, spans: Iterable[Span], meta: dict[str, Any] | None = None,
                 process_name: str | None = None) -> Path:
    from .paths import write_text_atomic

    return write_text_atomic(path, json.dumps(to_chrome(spans, meta, process_name),
                                              separators=(",", ":")))
