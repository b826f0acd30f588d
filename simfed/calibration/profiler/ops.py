"""Per-operator samples of a PyTorch-profiler trace: each operator placed in its thread's call
tree, matched to the GPU kernels it launched, sorted into GEMM, attention and memory-bound
samples with their FLOPs and bytes.

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
"""

from __future__ import annotations

import bisect
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .read import (
    _attention_flops,
    _causal,
    _gemm_shape,
    _op_bytes,
    _tensor_args,
    check_times,
    load_trace,
    trace_events,
)

PROFILE_GLOB = "profile_rank*.json"

_GEMM = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::linear",
         "aten::matmul", "aten::_addmm_activation", "aten::addbmm", "aten::_scaled_mm"}
_ATTN = re.compile(r"scaled_dot_product|flash_attention|efficient_attention|cudnn_attention|"
                   r"^flash_attn::")
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


NO_SHAPES = "profiler trace without shapes: "  # Samples.meta key prefix (samples.read_chrome)
