"""The collective tap: wraps the `torch.distributed` collectives that FSDP2 and FedAvg call, and
records each one as a "comm" span (op, mesh dimension, group size and ranks, bytes, issue and
completion times).

FSDP2 (torch 2.13) calls `dist.all_gather_single`, `dist.reduce_scatter_single` and, for HSDP,
`dist.all_reduce` through the `torch.distributed` module, so replacing those attributes sees every
call; older releases call `all_gather_into_tensor` / `reduce_scatter_tensor`, also wrapped.

Bytes: `nbytes` is the full buffer of the collective (the gathered output of an all-gather, the
input of a reduce-scatter, the tensor of an all-reduce), the size the alpha-beta model uses.
Times: on CPU (gloo) a synchronous collective completes when the call returns, an asynchronous
one when its future fires. On CUDA, issue and completion are CUDA events on the current stream,
placed on the host clock at the end of the step (`flush(device_sync=True)`).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from simfed.spec import Span

from .errors import CollectiveError


def _nbytes(t: Any) -> int:
    if isinstance(t, torch.Tensor):
        return t.numel() * t.element_size()
    if isinstance(t, (list, tuple)):
        return sum(_nbytes(x) for x in t)
    return 0


# torch.distributed function -> (span name, argument holding the full buffer)
WRAPPED: dict[str, tuple[str, str | None]] = {
    "all_gather_single": ("all_gather", "output_tensor"),
    "all_gather_into_tensor": ("all_gather", "output_tensor"),
    "all_gather": ("all_gather", "tensor_list"),
    "reduce_scatter_single": ("reduce_scatter", "input"),
    "reduce_scatter_tensor": ("reduce_scatter", "input"),
    "reduce_scatter": ("reduce_scatter", "input_list"),
    "all_reduce": ("all_reduce", "tensor"),
    "broadcast": ("broadcast", "tensor"),
    "all_to_all_single": ("all_to_all", "output"),
    "barrier": ("barrier", None),
}


@dataclass
class _Call:
    name: str
    kind: str
    ranks: tuple[int, ...]
    nbytes: int
    step: int
    phase: str
    issue_s: float
    async_op: bool
    dtype: str
    end_s: float | None = None
    events: tuple[Any, Any] | None = None  # CUDA (start, end) events
    error: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)


class CollectiveTap:
    """Installs wrappers around torch.distributed collectives; `flush` writes finished calls."""

    def __init__(self, *, rank: int, clock: Callable[[], float], where: Callable[[], tuple[int,
                 str]], kind_of: Callable[[Any], str], write: Callable[[Span], None],
                 timeout_s: float, cuda: bool):
        self.rank, self._clock, self._where, self._kind_of = rank, clock, where, kind_of
        self._write, self.timeout_s, self._cuda = write, timeout_s, cuda
        self._pending: list[_Call] = []
        self._originals: dict[str, Callable[..., Any]] = {}
        self._local = threading.local()
        self.enabled = True
        self.failure: str = ""
        self.count = 0
        self._ref: tuple[Any, float] | None = None  # CUDA event and host time it stands for

    # ---- installing -------------------------------------------------------------------------
    def install(self) -> None:
        for fname, (op, buf_arg) in WRAPPED.items():
            orig = getattr(dist, fname, None)
            if orig is None or fname in self._originals:
                continue
            self._originals[fname] = orig
            setattr(dist, fname, self._wrap(orig, op, buf_arg))

    def uninstall(self) -> None:
        for fname, orig in self._originals.items():
            setattr(dist, fname, orig)
        self._originals.clear()

    def _wrap(self, orig: Callable[..., Any], op: str, buf_arg: str | None) -> Callable[..., Any]:
        sig = inspect.signature(orig)

        def traced(*args: Any, **kwargs: Any) -> Any:
            if not self.enabled or getattr(self._local, "depth", 0):
                return orig(*args, **kwargs)
            self._local.depth = 1
            try:
                return self._call(orig, sig, op, buf_arg, args, kwargs)
            finally:
                self._local.depth = 0

        traced.__wrapped__ = orig  # type: ignore[attr-defined]
        traced.__name__ = getattr(orig, "__name__", op)
        return traced

    def _call(self, orig: Callable[..., Any], sig: inspect.Signature, op: str,
              buf_arg: str | None, args: tuple, kwargs: dict) -> Any:
        bound = sig.bind_partial(*args, **kwargs).arguments
        group = bound.get("group")
        ranks = tuple(dist.get_process_group_ranks(group or dist.group.WORLD))
        buf = bound.get(buf_arg) if buf_arg else None
        first = buf[0] if isinstance(buf, (list, tuple)) and buf else buf
        step, phase = self._where()
        call = _Call(
            name=op, kind=self._kind_of(group), ranks=ranks, nbytes=_nbytes(buf), step=step,
            phase=phase, issue_s=self._clock(), async_op=bool(bound.get("async_op", False)),
            dtype=str(first.dtype).removeprefix("torch.") if isinstance(first, torch.Tensor)
            else "",
        )
        if self._cuda:
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            call.events = (start, end)
        self._pending.append(call)
        self.count += 1
        try:
            work = orig(*args, **kwargs)
        except Exception as exc:
            call.end_s, call.error = self._clock(), _first_line(exc)
            if call.events is not None:  # CUDA: the failure time is a host time
                call.events = None
            self.failure = (
                f"step {step} ({phase}): {op} over the {call.kind} group (ranks "
                f"{','.join(map(str, ranks))}) failed after {call.end_s - call.issue_s:.1f} s "
                f"(timeout {self.timeout_s:g} s; a peer rank died or hangs): {call.error}"
            )
            raise CollectiveError(self.failure) from exc
        call.attrs["host_s"] = self._clock() - call.issue_s  # time the host spent in the call
        if self._cuda:
            call.events[1].record()
        elif call.async_op and work is not None:
            self._on_completion(work, call)
        else:
            call.end_s = self._clock()
        return work

    def _on_completion(self, work: Any, call: _Call) -> None:
        try:
            fut = work.get_future()
        except (RuntimeError, AttributeError):
            call.end_s, call.attrs["completion"] = call.issue_s + call.attrs["host_s"], "unknown"
            return

        def done(_: Any) -> None:
            call.end_s = self._clock()

        fut.add_done_callback(done)

    # ---- writing ----------------------------------------------------------------------------
    def mark_device_reference(self) -> None:
        """CUDA: a reference event at a known host time: the device is drained first, so the
        event runs as soon as it is recorded."""
        if self._cuda:
            torch.cuda.synchronize()
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            ev.synchronize()
            self._ref = (ev, self._clock())

    def flush(self, device_sync: bool = False, final: bool = False) -> None:
        """Write the calls that have completed, in issue order; `final` writes the rest too,
        marked incomplete."""
        if self._cuda and device_sync and self._ref is not None:
            torch.cuda.synchronize()
            ref, ref_s = self._ref
            for c in self._pending:
                if c.events is not None and c.end_s is None:
                    c.issue_s = ref_s + ref.elapsed_time(c.events[0]) / 1e3
                    c.end_s = ref_s + ref.elapsed_time(c.events[1]) / 1e3
                    c.attrs["timing"] = "cuda_event"
        keep: list[_Call] = []
        for c in self._pending:
            if c.end_s is None and not final:
                keep.append(c)
                continue
            self._write(self._span(c))
        self._pending = keep

    def _span(self, c: _Call) -> Span:
        attrs: dict[str, Any] = {"group_size": len(c.ranks), "ranks": list(c.ranks),
                                 "phase": c.phase, "dtype": c.dtype, **c.attrs}
        if c.async_op:
            attrs["async"] = True
        if c.error:
            attrs["error"] = c.error
        end = c.end_s
        if end is None:
            attrs["incomplete"] = True
            end = self._clock()
        return Span(name=c.name, cat="comm", rank=self.rank, step=c.step, start_s=c.issue_s,
                    dur_s=max(0.0, end - c.issue_s), nbytes=c.nbytes, group=c.kind,
                    stream=f"comm:{c.kind}", attrs=attrs)


def _first_line(exc: BaseException) -> str:
    """The first line of an error, without gloo's boilerplate advice."""
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line.split(". This is typically caused")[0][:300]
