"""Reading PyTorch-profiler Chrome traces (no torch: the trace is JSON), with the input
contract's limits, and decoding an operator event's arguments (shapes, dtypes, flags).

Reading (no torch: the trace is JSON). The trace is the file `torch.profiler.profile(
record_shapes=True).export_chrome_trace(...)` writes (`realrun run --profile-steps A:B` writes
one per rank, `profile_rank{r}.json`). Its format is Kineto's Chrome trace
(pytorch/kineto libkineto/src/output_json.cpp, `ChromeTraceLogger::handleActivity`):
- CPU operators: `"ph": "X", "cat": "cpu_op"` (older releases: "Operator") with `ts`, `dur` in
  us and `args` holding "External id", "Input Dims", "Input type", "Concrete Inputs" (the last
  three only with record_shapes);
- GPU kernels (CUDA activities): `"cat": "kernel"`, `"pid"` the device, `"tid"` the stream,
  `args` with "device", "stream", "correlation" and "External id", which is the
  `correlationId()` of the kernel's linked activity, i.e. the "External id" of the innermost
  CPU operator that launched it;
- `deviceProperties`: one entry per GPU with its "id" and "name"
  (libkineto/src/CudaDeviceProperties.cpp).

Limits (a one-line SpecError naming the file and the reason): a trace (or a .json.gz unpacked)
of at most `MAX_TRACE_BYTES`, nested at most 64 deep, with at most `MAX_TRACE_EVENTS` events;
every complete event's ts and dur are numbers of microseconds (`check_times`).
"""

from __future__ import annotations

import gzip
import math
from pathlib import Path
from typing import Any

from ...spec.jsonio import parse_json
from ...spec.schema import SpecError
from ...spec.yamlio import read_text

# calibrate reads about 10,000 events per second on a shared 2-core host (a 28 MB trace of
# 78,518 events: 10 s, json.loads 4 s of it): these limits keep one trace to minutes
MAX_TRACE_BYTES = 512 * 2**20
MAX_TRACE_EVENTS = 2_000_000

# element sizes of the profiler's "Input type" strings (c10::toString of a ScalarType)
_ELEM_BYTES = {
    "float": 4, "double": 8, "c10::half": 2, "c10::bfloat16": 2, "half": 2, "bfloat16": 2,
    "long int": 8, "long": 8, "int": 4, "short int": 2, "signed char": 1, "unsigned char": 1,
    "bool": 1, "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1, "c10::complex<float>": 8,
}
# the position of `is_causal` among each attention operator's arguments
# (pytorch/pytorch aten/src/ATen/native/native_functions.yaml)
_CAUSAL_ARG = {
    "aten::scaled_dot_product_attention": 5,
    "aten::_scaled_dot_product_flash_attention": 4,
    "aten::_scaled_dot_product_flash_attention_for_cpu": 4,
    "aten::_scaled_dot_product_efficient_attention": 6,
    "aten::_scaled_dot_product_cudnn_attention": 6,
    "aten::_scaled_dot_product_flash_attention_backward": 11,
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": 7,
    "aten::_scaled_dot_product_efficient_attention_backward": 11,
    "aten::_scaled_dot_product_cudnn_attention_backward": 14,
    # Dao's flash-attn 2 (>= 2.6) custom ops (flash_attn/flash_attn_interface.py), q, k, v as
    # (batch, tokens, heads, head dim)
    "flash_attn::_flash_attn_forward": 5,
    "flash_attn::_flash_attn_backward": 11,
}


def load_trace(path: Path) -> dict[str, Any] | list[Any]:
    """A Chrome trace (.json, or .json.gz as torch writes for a .gz name), bounded in size,
    nesting and events."""
    if path.name.endswith(".gz"):
        try:
            with gzip.open(path, "rb") as f:
                raw = f.read(MAX_TRACE_BYTES + 1)
        except (OSError, EOFError) as exc:
            raise SpecError(f"calibrate: {path}: not a readable gzip file ({exc})") from None
        if len(raw) > MAX_TRACE_BYTES:
            raise SpecError(f"calibrate: {path} unpacks to more than {MAX_TRACE_BYTES:,} bytes "
                            f"(the limit for a trace: {_WHY})")
        text = raw.decode("utf-8", errors="replace")
    else:
        text = read_text(path, "calibrate", MAX_TRACE_BYTES)
    data = parse_json(text, f"calibrate: {path}", allow_nan=True)  # (check_times: finite)
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if isinstance(events, list) and len(events) > MAX_TRACE_EVENTS:
        raise SpecError(f"calibrate: {path} holds {len(events):,} events; the limit is "
                        f"{MAX_TRACE_EVENTS:,} ({_WHY})")
    return data


_WHY = ("calibrate reads about 10,000 events a second: profile fewer steps, e.g. "
        "realrun run --profile-steps A:B")


def trace_events(data: Any) -> list[dict[str, Any]]:
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    if not isinstance(events, list):  # (the readers name the file: samples.py)
        raise TypeError("a Chrome trace's traceEvents is not a list")
    return [e for e in events if isinstance(e, dict)]


def is_profiler_trace(events: list[dict[str, Any]]) -> bool:
    """A torch.profiler trace with shapes (record_shapes=True)."""
    return any(str(e.get("cat", "")).lower() in ("cpu_op", "operator")
               and "Input Dims" in (e.get("args") or {}) for e in events)


def _numel(dims: Any) -> int:
    if not isinstance(dims, list):
        return 0
    if dims and all(isinstance(d, list) for d in dims):  # a TensorList
        return sum(_numel(d) for d in dims)
    return math.prod(int(d) for d in dims) if dims else 1


def _tensor_args(args: dict[str, Any]) -> list[tuple[Any, int]]:
    """(dims, element bytes) of each tensor argument (scalars and None left out)."""
    dims, types = args.get("Input Dims") or [], args.get("Input type") or []
    out = []
    for i, d in enumerate(dims):
        t = str(types[i]).lower() if i < len(types) else ""
        if t == "tensorlist" and isinstance(d, list) and d:
            out.append((d, 4))  # element type not recorded for lists: fp32 (optimizer state)
        elif t in _ELEM_BYTES and isinstance(d, list):
            out.append((d, _ELEM_BYTES[t]))
    return out


def _op_bytes(name: str, args: dict[str, Any]) -> float:
    """Bytes an operator moves: it reads its tensor inputs and writes its result. In place
    (`name_`): the result is the first input; `copy_`: reads the source, writes the
    destination; a reduction writes little; nll_loss reads one logit per row, its backward
    writes the whole gradient; embedding reads and writes one row per index."""
    ts = _tensor_args(args)
    if not ts:
        return 0.0
    b = [_numel(d) * s for d, s in ts]
    short = name.removeprefix("aten::")
    if short in ("copy_", "_foreach_copy_"):
        return float(b[0] + (b[1] if len(b) > 1 else b[0]))
    if short in ("embedding", "index_select"):
        rows = _numel(ts[1][0]) if len(ts) > 1 else 0
        width = ts[0][0][-1] if ts[0][0] else 1
        return float(2 * rows * width * ts[0][1])
    if short == "embedding_dense_backward":
        return float(2 * b[0])
    if short.startswith("nll_loss") and "backward" not in short:
        rows = _numel(ts[1][0]) if len(ts) > 1 else 0
        return float(rows * (ts[0][1] + ts[1][1]))
    if short.startswith("nll_loss") and "backward" in short:
        return float(b[1] if len(b) > 1 else b[0])  # writes the gradient of the logits
    if short in ("mean", "sum", "norm", "amax", "max", "var"):
        return float(b[0])
    if short.endswith("_"):  # in place: reads the inputs, writes the first
        return float(sum(b) + b[0])
    return float(sum(b) + max(b))  # out of place: the result as large as its largest input


def _gemm_shape(name: str, args: dict[str, Any]) -> tuple[int, int, int, int] | None:
    """(b, m, n, k) of a GEMM operator from its input shapes."""
    dims = [d for d, _ in _tensor_args(args)]
    short = name.removeprefix("aten::")
    if short in ("addmm", "baddbmm", "_addmm_activation", "addbmm"):
        dims = dims[1:]
    if len(dims) < 2:
        return None
    a, w = dims[0], dims[1]
    if not all(isinstance(x, int) for x in a + w) or (len(a) < 2 and short != "linear"):
        return None
    if short == "linear":  # input (..., k), weight (n, k)
        if len(w) != 2 or not a:
            return None
        return 1, math.prod(a[:-1]) if len(a) > 1 else 1, w[0], w[1]
    if len(w) == 2:  # (..., m, k) @ (k, n): the leading dims fold into m
        return 1, math.prod(a[:-1]), w[1], w[0]
    if len(a) >= 3 and len(w) >= 3:  # batched
        return math.prod(a[:-2]), a[-2], w[-1], a[-1]
    return None


def _causal(name: str, args: dict[str, Any]) -> bool | None:
    i = _CAUSAL_ARG.get(name)
    conc = args.get("Concrete Inputs") or []
    if i is None or i >= len(conc):
        return None
    v = str(conc[i]).strip().lower()  # (another release's signature: not a flag there)
    return v == "true" if v in ("true", "false") else None


def _attention_flops(name: str, args: dict[str, Any]) -> float:
    """4 B H Tq Tk Dh, x 2.5 in backward (causal: `terms` halves it where the scenario's
    kernels skip the masked half)."""
    dims = [d for d, _ in _tensor_args(args)]
    backward = name.endswith("_backward")
    q, k = (dims[1], dims[2]) if backward and len(dims) > 2 else (dims[0], dims[1])
    if len(q) != 4 or len(k) != 4:
        return 0.0
    if name.startswith("flash_attn::"):  # (batch, tokens, heads, head dim)
        b, tq, h, dh = q
        tk = k[1]
    else:  # (batch, heads, tokens, head dim)
        b, h, tq, dh = q
        tk = k[2]
    return 4.0 * b * h * tq * tk * dh * (2.5 if backward else 1.0)


MAX_TS_US = 1e17  # a timestamp in microseconds (since the epoch: about 1.7e15 in 2024)
MAX_DUR_US = 1e13  # 10^7 s, as simfed.spec.limits


def check_times(events: list[dict[str, Any]], source: str) -> None:
    """Every complete ("X") event's ts and dur are numbers of microseconds: ts finite, dur 0
    or 1 ns (0.001) up to 10^7 s; a SpecError naming the event otherwise."""
    for i, e in enumerate(events):
        if e.get("ph") != "X":
            continue
        ts, dur = e.get("ts", 0), e.get("dur", 0)
        try:
            t, d = float(ts), float(dur)
        except (TypeError, ValueError, OverflowError):
            t = d = math.nan
        if not (abs(t) <= MAX_TS_US and (d == 0 or 1e-3 <= d <= MAX_DUR_US)):
            raise SpecError(f"calibrate: {source}: malformed input: event {i} "
                            f"({str(e.get('name', ''))[:40]!r}, cat {e.get('cat')!r}): ts "
                            f"{ts!r}, dur {dur!r}; expected "
                            f"microseconds, ts finite and dur 0 or 0.001 to {MAX_DUR_US:g}")
