"""A rank's trace: one clock, step and phase spans, collective spans, in simfed's JSONL schema.

Clock: seconds since a barrier that every rank leaves together just before training
(`Tracer.start_clock`), so spans of different ranks line up to within a barrier's skew.
Phases: each step is cut into back-to-back "phase" spans (forward, backward, optimizer,
aggregation, other): a phase starts where the previous one ended and the step ends where its
last phase ends, so phases tile the "step" span exactly (a pause of the process between two
phases, e.g. when ranks outnumber cores, counts in the phase that follows). On CUDA with
`sync_per_phase`, the host waits for the device at every phase boundary (as the paper's
per-phase timers do).
Writing: spans of a step are kept in memory and written (one flushed line each) when the step
ends, so the file I/O falls between steps, outside the timed step, and shows as a "host" span
`trace_write`; a crash loses at most the step in progress.
Outside the steps: evaluation of the untrained model has step -1; the final evaluation and the
model hash have step = steps. They are "host" spans, and their collectives carry attrs.phase
"eval_untrained" / "eval", so `0 <= step < steps` selects the training steps.
"""

from __future__ import annotations

import os
import platform
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from simfed.spec import PHASES, Span, TraceWriter

from .collectives import CollectiveTap


def host_facts() -> dict[str, Any]:
    """Cores this process may use, torch threads and versions: the tags of every trace."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return {
        "cores": cores,
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "hostname": platform.node(),
    }


class Tracer:
    """Writes this rank's spans to `DIR/trace_rank{r}.jsonl` (flushed line by line) and keeps
    per-step phase totals for the summary."""

    def __init__(self, path: Path, meta: dict[str, Any], *, rank: int, device: torch.device,
                 sync_per_phase: bool):
        self.rank, self.device = rank, device
        self._cuda = device.type == "cuda"
        self._sync = sync_per_phase and self._cuda
        self.writer = TraceWriter(path, meta)
        self._t0 = time.perf_counter()
        self.step, self.phase = -1, "setup"
        self.phase_s: dict[int, dict[str, float]] = defaultdict(lambda: dict.fromkeys(PHASES, 0.0))
        self.step_s: dict[int, float] = {}
        self.step_start_s: dict[int, float] = {}  # on the clock (since the barrier)
        self.tap: CollectiveTap | None = None
        self._buffer: list[Span] = []
        self._closed = False
        self._cursor: float | None = None  # end of the last phase of the current step

    # ---- clock ------------------------------------------------------------------------------
    def now(self) -> float:
        return time.perf_counter() - self._t0

    def start_clock(self) -> None:
        """Zero the clock (call right after a barrier); a "clock" span records the wall time
        of zero, to line up traces of separate runs or hosts."""
        self._t0 = time.perf_counter()
        self.emit(Span(name="clock", cat="host", rank=self.rank, step=-1, start_s=0.0,
                        dur_s=0.0, stream="host", attrs={"unix_time_s": time.time()}))

    def _device_sync(self) -> None:
        if self._sync:
            torch.cuda.synchronize(self.device)

    # ---- collectives ------------------------------------------------------------------------
    def attach(self, tap: CollectiveTap) -> None:
        self.tap = tap

    def where(self) -> tuple[int, str]:
        return self.step, self.phase

    def emit(self, span: Span) -> None:
        """Queue a span; `drain` writes the queue."""
        self._buffer.append(span)

    def drain(self, final: bool = False) -> None:
        start = self.now()
        if self.tap is not None:
            self.tap.flush(device_sync=True, final=final)
        n = len(self._buffer)
        for span in self._buffer:
            self.writer.write(span)
        self._buffer.clear()
        if n and not final:
            self.emit(Span(name="trace_write", cat="host", rank=self.rank, step=self.step,
                           start_s=start, dur_s=self.now() - start, stream="host",
                           attrs={"spans": n}))

    # ---- spans ------------------------------------------------------------------------------
    @contextmanager
    def step_span(self, step: int) -> Iterator[None]:
        self._device_sync()
        self.step = step
        if self.tap is not None:
            self.tap.mark_device_reference()
        start = self._cursor = self.now()
        try:
            yield
            self._device_sync()
        except BaseException:
            self.drain()  # what the failed step recorded, the failed collective included
            raise
        finally:
            end, self._cursor = self._cursor, None
        dur = end - start
        self.step_s[step] = dur
        self.step_start_s[step] = start
        self.emit(Span(name="step", cat="step", rank=self.rank, step=step, start_s=start,
                       dur_s=dur, stream="step"))
        self.drain()

    @contextmanager
    def phase_span(self, name: str, **attrs: Any) -> Iterator[None]:
        """A phase of the current step; phases of the same name in one step add up."""
        start = self.now() if self._cursor is None else self._cursor
        outer, self.phase = self.phase, name
        try:
            yield
            self._device_sync()
        finally:
            self.phase = outer
        end = self.now()
        if self._cursor is not None:
            self._cursor = end
        dur = end - start
        self.phase_s[self.step][name] += dur
        self.emit(Span(name=name, cat="phase", rank=self.rank, step=self.step, start_s=start,
                       dur_s=dur, stream="phase", attrs=attrs))

    @contextmanager
    def host_span(self, name: str, step: int, **attrs: Any) -> Iterator[dict[str, Any]]:
        """Work outside the training steps (evaluation, hashing): a "host" span; collectives
        inside it carry `phase=name`. The yielded dict adds attrs."""
        self._device_sync()
        if self.tap is not None:
            self.tap.mark_device_reference()
        outer = self.step, self.phase
        self.step, self.phase = step, name
        start = self.now()
        extra: dict[str, Any] = dict(attrs)
        try:
            yield extra
            self._device_sync()
        except BaseException:
            self.drain()
            raise
        finally:
            self.step, self.phase = outer
        self.emit(Span(name=name, cat="host", rank=self.rank, step=step, start_s=start,
                       dur_s=self.now() - start, stream="host", attrs=extra))
        self.drain()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.drain(final=True)
            self.writer.close()
