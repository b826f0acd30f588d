"""Per-operator samples from PyTorch-profiler Chrome traces, and the fit of the kernel model's
efficiencies to them (issue 16: "everything can be calibrated from torch.profiler traces").

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

Each operator is placed in the call tree of its thread (an event inside another's time span on
the same thread is its child) and sorted into:
- `gemm`: the innermost of aten::mm / addmm / bmm / baddbmm / linear / matmul (m x k @ k x n,
  batched b times), FLOPs 2 b m n k;
- `attention`: the outermost scaled-dot-product / flash / efficient / cudnn attention operator
  (what it calls, the math path's bmm and softmax included, is part of it), FLOPs 4 B H Tq Tk Dh
  (halved when causal where `runtime.compute.causal_skip`), x 2.5 in backward (the kernel
  model's own convention, simfed/compute.py);
- `memory`: the innermost elementwise, normalisation, softmax, cross-entropy, embedding, copy
  and optimizer (`_foreach_*`) operator, with the bytes it reads and writes from its input
  shapes and dtypes (`_op_bytes`).
An operator's phase is `backward` under an autograd `evaluate_function`, `optimizer` under
`Optimizer.step`, else `forward`; operators under FSDP's and c10d's own spans (parameter
copies around collectives) and outside any of these are left out. Its time is its CPU duration,
or on a GPU the summed duration of the kernels it and what it calls launched. Repeats of one
(kind, operator, phase, shapes, dtypes) are one sample: the median of their times.

Fitting (`fit_ops`). The kernel model (simfed/compute.py) times each sample as
  gap + max(c / gemm_efficiency, b / hbm_efficiency)    a GEMM
  gap + b / hbm_efficiency                              a memory-bound operator
  gap + F / (peak x attention_efficiency_{forward,backward})    attention
where c is the GEMM's FLOPs at the GPU's peak over its tile and wave quantisation (the model's
`gemm_efficiency(m, n, k)` at efficiency 1), b its bytes over the nominal HBM bandwidth, and gap
a fixed time per operator (`kernel_gap_us`). Nonlinear least squares (scipy) on relative
residuals, each sample weighted by its share of the traced time, the parameters in log space so
they stay positive: a robust (soft-L1) first pass, then a plain one with each kind of operator
weighted by its own scatter in the first (so that how badly memory-bound operators fit does not
widen the GEMMs' interval); 95% intervals from the Jacobian. A parameter the samples do not
identify (`result.unidentified`: a 95% interval wider than +-50%, or none) is fixed at the
scenario's value and the rest refitted, as in the other calibration fits (issue 18). An
efficiency above 1 is not used either (the scenario's peak or bandwidth is then below what was
measured).
"""

from __future__ import annotations

import bisect
import gzip
import json
import math
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..spec.schema import SpecError
from ..spec.yamlio import MAX_DATA_BYTES, read_text
from .result import MIN_REL_SCATTER, FitResult, Param, covariance, unidentified

PROFILE_GLOB = "profile_rank*.json"

# element sizes of the profiler's "Input type" strings (c10::toString of a ScalarType)
_ELEM_BYTES = {
    "float": 4, "double": 8, "c10::half": 2, "c10::bfloat16": 2, "half": 2, "bfloat16": 2,
    "long int": 8, "long": 8, "int": 4, "short int": 2, "signed char": 1, "unsigned char": 1,
    "bool": 1, "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1, "c10::complex<float>": 8,
}
_GEMM = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::linear",
         "aten::matmul", "aten::_addmm_activation", "aten::addbmm", "aten::_scaled_mm"}
_ATTN = re.compile(r"scaled_dot_product|flash_attention|efficient_attention|cudnn_attention|"
                   r"^flash_attn::")
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
_MEMORY = re.compile(
    r"^aten::(add|sub|mul|div|neg|pow|rsqrt|sqrt|exp|silu|gelu|relu|sigmoid|tanh|where|"
    r"lerp|addcmul|addcdiv|clamp|fill|zero|copy|_to_copy|clone|contiguous|cat|stack|"
    r"mean|sum|norm|amax|max|var|layer_norm|native_layer_norm|rms_norm|_fused_rms_norm|"
    r"softmax|_softmax|log_softmax|_log_softmax|_log_softmax_backward_data|"
    r"_softmax_backward_data|nll_loss_forward|nll_loss_backward|nll_loss2d_forward|"
    r"embedding|embedding_dense_backward|index_select|gather|scatter|index_add|"
    r"silu_backward|gelu_backward|threshold_backward|sigmoid_backward|tanh_backward|"
    r"native_layer_norm_backward|_fused_rms_norm_backward|_foreach_[a-z_]+|_fused_adamw|"
    r"_fused_adam|masked_fill|triu|tril|_chunk_cat|split_with_sizes_copy)_?$")
# spans whose operators are not the model's compute (parameter copies around collectives)
_OUTSIDE = ("FSDP::", "fsdp::", "c10d::", "nccl:", "gloo:", "record_param_comms")


@dataclass(frozen=True)
class OpSample:
    """One (kind, operator, phase, shapes, dtypes) of a trace: its repeats' times."""

    kind: str  # gemm | attention | memory
    op: str
    phase: str  # forward | backward | optimizer
    times_s: tuple[float, ...]
    device: str
    source: str
    shapes: str = ""  # the key's shapes and dtypes, as text
    flops: float = 0.0  # gemm, attention
    nbytes: float = 0.0  # gemm (operands and result), memory
    gemm: tuple[int, int, int, int] = ()  # b, m, n, k
    causal: bool = False

    @property
    def time_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def key(self) -> tuple:
        return (self.device, self.kind, self.op, self.phase, self.shapes)

    @property
    def label(self) -> str:
        return f"{self.phase} {self.op} {self.shapes} x{len(self.times_s)}"


# ---- reading --------------------------------------------------------------------------------
def load_trace(path: Path) -> dict[str, Any] | list[Any]:
    """A Chrome trace (.json, or .json.gz as torch writes for a .gz name), bounded in size."""
    if path.name.endswith(".gz"):
        try:
            with gzip.open(path, "rb") as f:
                raw = f.read(MAX_DATA_BYTES + 1)
        except OSError as exc:
            raise SpecError(f"calibrate: {path}: not a readable gzip file ({exc})") from None
        if len(raw) > MAX_DATA_BYTES:
            raise SpecError(f"calibrate: {path} unpacks to more than {MAX_DATA_BYTES:,} bytes")
        text = raw.decode("utf-8", errors="replace")
    else:
        text = read_text(path, "calibrate", MAX_DATA_BYTES)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"calibrate: {path} is not valid JSON (line {exc.lineno})") from None


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


@dataclass
class _Node:
    e: dict[str, Any]
    parent: _Node | None
    children: list[_Node]

    @property
    def name(self) -> str:
        return str(self.e.get("name", ""))

    def ancestors(self):
        p = self.parent
        while p is not None:
            yield p
            p = p.parent

    def subtree(self):
        """This node, then its descendants depth first (without recursion: operators of one
        span nest one inside the other, and a thread may hold thousands of them)."""
        todo = [self]
        while todo:
            n = todo.pop()
            yield n
            todo.extend(reversed(n.children))


def _forest(ops: list[dict[str, Any]]) -> list[_Node]:
    """Each thread's operators as a call tree (a child lies inside its parent's span)."""
    by_thread: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for e in ops:
        by_thread[(e.get("pid"), e.get("tid"))].append(e)
    nodes: list[_Node] = []
    for evs in by_thread.values():
        evs.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur", 0))))
        stack: list[_Node] = []
        for e in evs:
            ts, end = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))
            while stack and not end <= _end(stack[-1].e) + 1e-3:
                stack.pop()
            while stack and ts < float(stack[-1].e["ts"]) - 1e-3:
                stack.pop()
            n = _Node(e, stack[-1] if stack else None, [])
            if n.parent is not None:
                n.parent.children.append(n)
            nodes.append(n)
            stack.append(n)
    return nodes


class _Enclosing:
    """The innermost operator whose span holds an event, on the event's thread."""

    def __init__(self, nodes: list[_Node]):
        self.by_thread: dict[tuple, list[_Node]] = defaultdict(list)
        for n in nodes:  # _forest's order: by start within each thread
            self.by_thread[(n.e.get("pid"), n.e.get("tid"))].append(n)
        self.starts = {k: [float(n.e["ts"]) for n in v] for k, v in self.by_thread.items()}

    def innermost(self, e: dict[str, Any]) -> _Node | None:
        key = (e.get("pid"), e.get("tid"))
        if key not in self.starts:
            return None
        t = float(e["ts"])
        i = bisect.bisect_right(self.starts[key], t) - 1
        n = self.by_thread[key][i] if i >= 0 else None
        # the last operator to start before t is the innermost one around t or inside it
        while n is not None and _end(n.e) < t:
            n = n.parent
        return n


def _end(e: dict[str, Any]) -> float:
    return float(e["ts"]) + float(e.get("dur", 0))


def _phase(n: _Node) -> str:
    """forward | backward | optimizer | "" (outside the model's compute)."""
    phase = "forward"
    for a in n.ancestors():
        name = a.name
        if name.startswith(_OUTSIDE):
            return ""
        if name.startswith("autograd::engine::evaluate_function"):
            phase = "backward"
        elif name.startswith("Optimizer.step"):
            phase = "optimizer"
    return phase


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


def op_samples(data: Any, source: str) -> list[OpSample]:
    """The per-operator samples of one torch.profiler trace (see the module's docstring)."""
    events = trace_events(data)
    check_times(events, source)
    ops = [e for e in events if e.get("ph") == "X" and "ts" in e
           and str(e.get("cat", "")).lower() in ("cpu_op", "operator", "user_annotation")]
    kernels = [e for e in events if e.get("ph") == "X"
               and str(e.get("cat", "")).lower() == "kernel"]
    props = data.get("deviceProperties", []) if isinstance(data, dict) else []
    dev_names = {int(p["id"]): str(p.get("name", f"cuda:{p['id']}")) for p in props
                 if isinstance(p, dict) and "id" in p}
    nodes = _forest(ops)
    # kernels by the External id of the CPU operator that launched them; where a kernel's
    # External id names no operator (traces whose kernels carry their launch's own id), its
    # launch (the cuda_runtime / cuda_driver event with its "correlation") and the innermost
    # operator around that launch on its thread
    op_ids = {int(n.e["args"]["External id"]) for n in nodes
              if "External id" in (n.e.get("args") or {})}
    launches = {int(e["args"]["correlation"]): e for e in events
                if str(e.get("cat", "")).lower() in ("cuda_runtime", "cuda_driver")
                and "correlation" in (e.get("args") or {})}
    around = _Enclosing(nodes)
    launched: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for k in kernels:
        a = k.get("args") or {}
        ext = a.get("External id", a.get("external id"))  # (older Kineto: lower case)
        if ext is not None and int(ext) in op_ids:
            launched[int(ext)].append(k)
        elif "correlation" in a and int(a["correlation"]) in launches:
            op = around.innermost(launches[int(a["correlation"])])
            if op is not None and "External id" in (op.e.get("args") or {}):
                launched[int(op.e["args"]["External id"])].append(k)
    gpu = bool(kernels)
    groups: dict[tuple, list[float]] = defaultdict(list)
    facts: dict[tuple, dict[str, Any]] = {}
    # the trace's attention is causal if its forward says so (for backward operators whose
    # argument list is not in _CAUSAL_ARG)
    trace_causal = any(_causal(n.name, n.e.get("args") or {}) for n in nodes
                       if n.name == "aten::scaled_dot_product_attention")

    def classify(n: _Node) -> str:
        name = n.name
        if _ATTN.search(name):
            return "attention"
        if name in _GEMM:
            return "gemm"
        if _MEMORY.match(name):
            return "memory"
        return ""

    kind_of = {id(n): classify(n) for n in nodes}
    for n in nodes:
        kind = kind_of[id(n)]
        if not kind or str(n.e.get("cat", "")).lower() == "user_annotation":
            continue
        anc = list(n.ancestors())
        if any(kind_of[id(a)] == "attention" for a in anc):
            continue  # part of an attention operator's sample
        sub = list(n.subtree())[1:]
        if kind == "gemm" and any(kind_of[id(c)] == "gemm" for c in sub):
            continue  # a wrapper: its innermost GEMM is the sample
        if kind == "memory" and any(kind_of[id(c)] for c in sub):
            continue  # a wrapper of another classified operator
        phase = _phase(n)
        if not phase:
            continue
        args = n.e.get("args") or {}
        if gpu:
            ks = [k for m in n.subtree() for k in launched.get(
                int((m.e.get("args") or {}).get("External id", -1)), [])]
            if not ks:
                continue  # nothing ran on the GPU (a view, a CPU-side op)
            t = sum(float(k.get("dur", 0)) for k in ks) * 1e-6
            dev_id = int((ks[0].get("args") or {}).get("device", ks[0].get("pid", 0)))
            device = dev_names.get(dev_id, f"cuda:{dev_id}")
        else:
            t = float(n.e.get("dur", 0)) * 1e-6
            device = "cpu"
        if t <= 0:
            continue
        ta = _tensor_args(args)
        shapes = ";".join(f"{d}{s}" for d, s in ta)
        key = (device, kind, n.name, phase, shapes)
        if key not in facts:
            f: dict[str, Any] = {}
            if kind == "gemm":
                shp = _gemm_shape(n.name, args)
                if shp is None or min(shp) <= 0:
                    continue
                b, m, nn, k = shp
                s = ta[0][1]
                f.update(gemm=shp, flops=2.0 * b * m * nn * k,
                         nbytes=float(b * s * (m * k + k * nn + m * nn)))
            elif kind == "attention":
                c = _causal(n.name, args)
                causal = trace_causal if c is None else c
                fl = _attention_flops(n.name, args)
                if fl <= 0:
                    continue
                f.update(flops=fl, causal=causal)
            else:
                nb = _op_bytes(n.name, args)
                if nb <= 0:
                    continue
                f.update(nbytes=nb)
            facts[key] = f
        groups[key].append(t)
    out = []
    for key, times in groups.items():
        device, kind, name, phase, shapes = key
        out.append(OpSample(kind=kind, op=name, phase=phase, times_s=tuple(times),
                            device=device, source=source, shapes=shapes, **facts[key]))
    out.sort(key=lambda s: s.key)
    return out


def read_profiler(path: Path) -> list[OpSample]:
    return op_samples(load_trace(path), str(path))


def pooled(samples: list[OpSample]) -> list[OpSample]:
    """Samples of the same key from several traces (ranks, steps) as one."""
    by: dict[tuple, OpSample] = {}
    for s in samples:
        if s.key in by:
            o = by[s.key]
            by[s.key] = replace(o, times_s=o.times_s + s.times_s,
                                source=o.source if s.source in o.source.split(", ")
                                else f"{o.source}, {s.source}")
        else:
            by[s.key] = s
    return [by[k] for k in sorted(by)]


# ---- the kernel model's terms ---------------------------------------------------------------
PARAMS = {  # name -> (unit, the kernel class it times)
    "gemm_efficiency": ("fraction of peak", "gemm"),
    "hbm_efficiency": ("fraction of HBM bandwidth", "memory"),
    "attention_efficiency_forward": ("fraction of peak", "attention"),
    "attention_efficiency_backward": ("fraction of peak", "attention"),
    "kernel_gap_us": ("us", ""),
}


@dataclass(frozen=True)
class Terms:
    """Each sample's time at efficiency 1 (s) by class: the GEMM's compute part (tile and wave
    quantisation included), the bytes part, the attention FLOPs part (forward or backward)."""

    compute: np.ndarray
    memory: np.ndarray
    attn_fwd: np.ndarray
    attn_bwd: np.ndarray
    is_gemm: np.ndarray
    measured: np.ndarray


def terms(samples: list[OpSample], peak_flops: float, hbm_Bps: float, quantisation,
          causal_skip: bool = True) -> Terms:
    """`quantisation(m, n, k)`: the kernel model's GEMM efficiency at gemm_efficiency 1;
    `causal_skip`: causal attention does half the FLOPs (runtime.compute.causal_skip)."""
    n = len(samples)
    comp, mem, af, ab = (np.zeros(n) for _ in range(4))
    is_gemm = np.zeros(n, dtype=bool)
    for i, s in enumerate(samples):
        if s.kind == "gemm":
            _b, m, nn, k = s.gemm  # b: s.flops and s.nbytes count the batch already
            comp[i] = s.flops / (peak_flops * quantisation(m, nn, k))
            mem[i] = s.nbytes / hbm_Bps
            is_gemm[i] = True
        elif s.kind == "memory":
            mem[i] = s.nbytes / hbm_Bps
        else:
            f = s.flops / (2 if s.causal and causal_skip else 1) / peak_flops
            if s.phase == "backward":
                ab[i] = f
            else:
                af[i] = f
    return Terms(comp, mem, af, ab, is_gemm, np.array([s.time_s for s in samples]))


def predict(t: Terms, v: dict[str, float]) -> np.ndarray:
    """The kernel model's time of each sample with the parameter values `v`."""
    gap = v["kernel_gap_us"] * 1e-6
    mem = t.memory / v["hbm_efficiency"]
    gemm = np.maximum(t.compute / v["gemm_efficiency"], mem)
    return gap + np.where(t.is_gemm, gemm, mem) \
        + t.attn_fwd / v["attention_efficiency_forward"] \
        + t.attn_bwd / v["attention_efficiency_backward"]


def _identifiable(samples: list[OpSample]) -> list[str]:
    kinds = {s.kind for s in samples}
    names = [p for p, (_, k) in PARAMS.items() if not k or k in kinds]
    phases = {s.phase for s in samples if s.kind == "attention"}
    need = {"attention_efficiency_forward": "forward", "attention_efficiency_backward": "backward"}
    return [p for p in names if p not in need or need[p] in phases]


def fit_ops(samples: list[OpSample], configured: dict[str, float], peak_flops: float,
            hbm_Bps: float, quantisation, device: str = "", causal_skip: bool = True
            ) -> FitResult:
    """Fit the kernel model's efficiencies and per-operator gap to `samples` (one device);
    `configured`: the scenario's values (what stands for a parameter not identified)."""
    from scipy import optimize

    res = FitResult(kind="kernels")
    samples = pooled(samples)
    if not samples:
        res.note = "no per-operator samples (a torch.profiler trace with record_shapes)"
        return res
    t = terms(samples, peak_flops, hbm_Bps, quantisation, causal_skip)
    # each sample weighs by its share of the traced time (calls x median): the operators that
    # make up the step time set the fit, not the many microsecond-long scalar ones; relative
    # residuals x sqrt(share x n), so that equal shares give the plain relative fit
    share = np.array([len(s.times_s) for s in samples]) * t.measured
    weight = np.sqrt(share / share.sum() * len(samples))
    kinds = np.array([s.kind for s in samples])
    free = _identifiable(samples)
    fixed = {k: v for k, v in configured.items() if k not in free}
    reasons: dict[str, str] = {}
    for p in PARAMS:
        if p not in free:
            reasons[p] = "no samples of its kind in the traces"
    while True:
        vals = dict(configured)
        vals.update(fixed)
        if not free:
            break
        # start from the scenario's values; a gap configured 0 from the shortest samples'
        # times (log space cannot start at 0)
        start = {**configured, "kernel_gap_us": configured["kernel_gap_us"]
                 or float(np.percentile(t.measured, 10)) * 1e6}
        x0 = np.log(np.array([max(start[p], 1e-9) for p in free]))

        def resid(x, wt, free=free, vals=vals):
            v = {**vals, **dict(zip(free, np.exp(x), strict=True))}
            return wt * (predict(t, v) - t.measured) / t.measured

        # two passes: the second weighs each kind of operator by its own scatter in the first
        # (how well the model describes memory-bound operators says nothing about GEMMs)
        sol = optimize.least_squares(resid, x0, args=(weight,), loss="soft_l1", f_scale=0.1)
        # (a kind with no more samples than its own parameters has no scatter of its own: it
        # gets the largest of the others', or none is known and the fit has no interval)
        scatter: dict[str, float] = {}
        for k, own in (("gemm", 1), ("memory", 1), ("attention", 2)):
            sel = kinds == k
            if sel.sum() > own:
                scatter[k] = max(math.sqrt(float(np.mean(sol.fun[sel] ** 2))),
                                 MIN_REL_SCATTER)
        wt = weight.copy()
        for k in ("gemm", "memory", "attention"):
            sel = kinds == k
            if sel.any():
                wt[sel] /= scatter.get(k, max(scatter.values(), default=float("inf")))
        sol = optimize.least_squares(resid, sol.x, args=(wt,), loss="linear")
        r = sol.fun
        dof = max(1, len(r) - len(free))
        s2 = max(float(np.sum(r * r)) / dof, MIN_REL_SCATTER ** 2)
        cov = covariance(sol.jac, s2) if len(r) > len(free) else \
            np.full((len(free), len(free)), np.inf)
        params = []
        for i, p in enumerate(free):
            se = math.sqrt(cov[i, i]) if math.isfinite(cov[i, i]) else float("inf")
            val = float(math.exp(sol.x[i]))
            lo, hi = (val * math.exp(-1.96 * se), val * math.exp(1.96 * se)) \
                if math.isfinite(se) else (float("nan"), float("nan"))
            params.append(Param(p, val, (lo, hi), PARAMS[p][0]))
        worst, why = None, ""
        for q in params:  # the widest unidentified one (relative half-width) goes first
            w = unidentified(q) or ("above 1: measured faster than the scenario's peak or "
                                    "bandwidth allows" if q.name != "kernel_gap_us"
                                    and q.value > 1 else "")
            if w:
                rel = (q.ci95[1] - q.ci95[0]) / q.value if math.isfinite(q.ci95[1]) else \
                    float("inf")
                if worst is None or rel > worst[0]:
                    worst, why = (rel, q), w
        if worst is None:
            res.params = params
            vals.update({q.name: q.value for q in params})
            res.cov, res.cov_names = None, []
            break
        q = worst[1]
        res.not_used[q.name] = {**q.as_dict(), "reason": why,
                                "kept": f"the scenario's {configured[q.name]:g}"}
        fixed[q.name] = configured[q.name]
        free = [p for p in free if p != q.name]
    for p, why in reasons.items():
        res.not_used.setdefault(p, {"value": None, "ci95": [None, None],
                                    "unit": PARAMS[p][0], "reason": why,
                                    "kept": f"the scenario's {configured[p]:g}"})
    pred = predict(t, vals)
    for s, p in zip(samples, pred, strict=True):
        res.residuals.append({"label": s.label, "kind": s.kind, "measured_s": s.time_s,
                              "predicted_s": float(p),
                              "rel_error": float((p - s.time_s) / s.time_s)})
    res.note = (f"{len(samples)} operator samples ({sum(len(s.times_s) for s in samples)} "
                f"calls) on {device or 'one device'}; rms rel error by kind: " + ", ".join(
                    f"{k} {v:.1%} (n={sum(r['kind'] == k for r in res.residuals)})"
                    for k, v in kind_rms(res).items()))
    return res


def kind_rms(res: FitResult) -> dict[str, float]:
    """The rms relative error of a kernels fit's residuals, per kind of operator."""
    out = {}
    for k in ("gemm", "attention", "memory"):
        e = [r["rel_error"] for r in res.residuals if r.get("kind") == k]
        if e:
            out[k] = math.sqrt(sum(x * x for x in e) / len(e))
    return out


def _same_gpu(name: str, device: str) -> bool:
    """The scenario's GPU name and a trace's device name (deviceProperties) name one model:
    one holds the other, or they share a model token ("h100" in "H100-SXM-80GB" and "NVIDIA
    H100 80GB HBM3")."""
    a, b = name.lower(), device.lower()
    if a in b or b in a:
        return True
    model = re.compile(r"[a-z]+[0-9]+[a-z0-9]*")
    return bool(set(model.findall(a)) & set(model.findall(b)))


def fit_scenario(scn: Any, samples: list[OpSample], device: str | None = None
                 ) -> tuple[FitResult, str]:
    """`fit_ops` against `scn`'s GPU (peak, HBM bandwidth, SMs, GEMM tiles) on the samples of
    `device`, by default the device the scenario describes: the only device in the traces, or
    the one whose name holds the scenario's GPU name. Returns (fit, the device fitted)."""
    rt = scn.runtime.compute
    devices = sorted({s.device for s in samples}) if device is None else [device]
    gpu = scn.cluster.node.gpu.name
    if len(devices) > 1:
        match = [d for d in devices if _same_gpu(gpu, d)]
        if len(match) != 1:
            res = FitResult(kind="kernels")
            res.note = (f"traces from {len(devices)} devices ({', '.join(devices)}) and none "
                        f"(or several) named like the scenario's GPU {gpu!r}: not fitted")
            return res, ""
        devices = match
    device = devices[0] if devices else ""
    hw, unit = _unit_model(scn)
    configured = {p: float(getattr(rt, p)) for p in PARAMS}
    res = fit_ops([s for s in samples if s.device == device], configured, hw.peak_flops,
                  hw.hbm_Bps, unit.gemm_efficiency, device, rt.causal_skip)
    return res, device


def _unit_model(scn: Any):
    from ..compute import ComputeModel
    from ..hardware import Hardware

    hw = Hardware.from_spec(scn.cluster, scn.runtime)
    return hw, ComputeModel(hw=hw, rt=replace(scn.runtime.compute, gemm_efficiency=1.0),
                            tokens_per_gpu=1)


def predict_for(scn: Any, samples: list[OpSample], fit: FitResult | None = None
                ) -> np.ndarray:
    """The kernel model's time of each sample (median of its calls) on `scn`'s GPU, with the
    parameters `fit` uses (the rest at the scenario's values)."""
    hw, unit = _unit_model(scn)
    v = {p: float(getattr(scn.runtime.compute, p)) for p in PARAMS}
    if fit is not None:
        v.update({p.name: p.value for p in fit.params})
    return predict(terms(samples, hw.peak_flops, hw.hbm_Bps, unit.gemm_efficiency,
                         scn.runtime.compute.causal_skip), v)


NO_SHAPES = "profiler trace without shapes: "  # Samples.meta key prefix (samples.read_chrome)


def apply_to_profile(scn: Any, samples: Any, profile: dict[str, Any],
                     report: dict[str, Any]) -> FitResult | None:
    """Fit the kernel model to `samples.ops` and put what they identify into `profile`
    (runtime.compute.*, with provenance) and the fit into `report["fits"]["kernels"]`.
    The values take effect where the scenario runs `runtime.compute.model: kernels`."""
    ops: list[OpSample] = samples.ops
    if not ops:
        bare = sorted(k.removeprefix(NO_SHAPES) for k in samples.meta if k.startswith(NO_SHAPES))
        if bare:  # profiled, but without record_shapes: say why nothing was fitted
            res = FitResult(kind="kernels", note=(
                f"no operator samples: {', '.join(bare)} has no shapes (\"Input Dims\"); "
                "profile with record_shapes=True (realrun run --profile-steps does)"))
            report.setdefault("fits", {})["kernels"] = res.as_dict()
            return res
        return None
    res, device = fit_scenario(scn, ops)
    fits = report.setdefault("fits", {})
    fits["kernels"] = {**res.as_dict(), "device": device}
    for other in sorted({s.device for s in ops} - {device}):  # reported, not in the profile
        o, _ = fit_scenario(scn, ops, other)
        o.note += " (not the scenario's GPU: in the report only, against its figures)"
        fits[f"kernels {other}"] = {**o.as_dict(), "device": other}
    if not res.params:
        return res
    rms = kind_rms(res)
    runtime = profile.setdefault("runtime", {})
    compute = runtime.setdefault("compute", {})
    prov = runtime.setdefault("provenance", {})
    srcs = sorted({src for s in ops if s.device == device for src in s.source.split(", ")})
    where = srcs[0] if len(srcs) == 1 else f"{len(srcs)} traces ({srcs[0]}, ...)"
    for p in res.params:
        kind = PARAMS[p.name][1] or "all"
        compute[p.name] = round(p.value, 3 if p.name == "kernel_gap_us" else 6)
        prov[f"runtime.compute.{p.name}"] = (
            f"fitted to torch.profiler operator times on {device} (kernel model, n="
            f"{len(res.residuals)} operator samples, rms rel error of its {kind}"
            f" operators {rms.get(kind, res.rms_rel_error):.1%}, 95% CI "
            f"{p.ci95[0]:.4g}..{p.ci95[1]:.4g}) from {where}; used with "
            "runtime.compute.model: kernels")
    return res
