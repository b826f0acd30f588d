"""Per-operator samples from PyTorch-profiler Chrome traces, and the fit of the kernel model's
efficiencies to them ("everything can be calibrated from torch.profiler traces").

Three parts:
- `read`: the trace file (size, nesting and event limits), its events, each complete event's
  times, and an operator's arguments (shapes, dtypes, the causal flag);
- `ops`: each operator in its thread's call tree, matched to the GPU kernels it launched, sorted
  into GEMM, attention and memory-bound samples (`op_samples`, `pooled`);
- `fit`: the kernel model's efficiencies and per-operator gap fitted to the samples (`fit_ops`,
  `fit_scenario`) and put into a profile (`apply_to_profile`).
"""

from .fit import (
    PARAMS,
    Terms,
    apply_to_profile,
    fit_ops,
    fit_scenario,
    kind_rms,
    predict,
    predict_for,
    terms,
)
from .ops import NO_SHAPES, PROFILE_GLOB, OpSample, op_samples, pooled, read_profiler
from .read import (
    MAX_DUR_US,
    MAX_TRACE_BYTES,
    MAX_TRACE_EVENTS,
    MAX_TS_US,
    check_times,
    is_profiler_trace,
    load_trace,
    trace_events,
)

__all__ = [
    "MAX_DUR_US", "MAX_TRACE_BYTES", "MAX_TRACE_EVENTS", "MAX_TS_US", "NO_SHAPES", "PARAMS",
    "PROFILE_GLOB", "OpSample", "Terms", "apply_to_profile", "check_times", "fit_ops",
    "fit_scenario", "is_profiler_trace", "kind_rms", "load_trace", "op_samples", "pooled",
    "predict", "predict_for", "read_profiler", "terms", "trace_events",
]
