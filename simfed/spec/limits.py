"""Physical ranges and cost limits of scenario numbers, checked by `schema.build` on every key.

Two tables:

- `UNIT_RANGES`, by the unit a key's name ends in (every quantity's name carries its unit): a
  latency in microseconds is at most 10 s, a bandwidth at most 1 PB/s and at least 1 kB/s, and so
  on. These keep every product the simulator forms finite (no inf, no NaN, no overflow), and they
  are far outside anything real hardware does, so no real scenario meets them.
- `PATH_LIMITS`, by dotted key: sizes whose simulation cost grows with them (nodes, GPUs per
  node, layers) or whose meaning breaks beyond a bound (a jitter sigma, Adam's betas). Each says
  why, and the error message prints the reason with the limit.

The limits of cost were measured with `simfed run` on 2 cores: a homogeneous cluster is one
actor per algorithm, and its process groups and ring loads are built in numpy, so time grows
slowly with the number of GPUs (`simfed bench`, 512gpu.yaml x 4 algorithms on a quiet 2-core
host: 0.34 s at 16,384 GPUs, 0.88 s at 131,072, 2.7 s at 524,288; 5-10x that with four other
jobs on the cores); `MAX_WORLD` is the largest size measured.
Steps cost time with layers x simulated steps; a run longer than its window
(`simfed.engine.window`: at most STEP_WINDOW steps and at most 3,072 layer-steps) is
extrapolated from the window, so `training.steps` and `model.layers` together cost a bounded
time.
"""

from __future__ import annotations

import re
from typing import NamedTuple


class Range(NamedTuple):
    lo: float | None  # smallest allowed value other than 0 (None: no bound beyond the key's own)
    hi: float
    why: str
    min: float | None = None  # smallest allowed value, 0 included (None: the key's own bound)


MAX_TIME_S = 1e7  # a time in seconds (116 days): scenario keys, bench rows, realrun summaries

# by the suffix of the key's name (case-sensitive, as the names are written)
UNIT_RANGES: tuple[tuple[str, Range], ...] = (
    (r"_us$", Range(None, 1e7, "a time in microseconds is at most 10 s")),
    (r"_ms$", Range(None, 1e4, "a time in milliseconds is at most 10 s")),
    (r"_ms_per_sqrt_s$", Range(None, 1e4, "a drift rate is at most 10 s per sqrt(s)")),
    (r"_us_per_MB$", Range(None, 1e7, "a host time per MB is at most 10 s")),
    (r"_s$", Range(None, MAX_TIME_S, "a time in seconds is at most 10^7 s (116 days)")),
    (r"_GBps$", Range(1e-6, 1e6, "a bandwidth is between 1 kB/s and 1 PB/s")),
    (r"_Gbps$", Range(1e-6, 1e7, "a line rate is between 1 kbit/s and 10 Pbit/s")),
    (r"_GiB$", Range(1e-6, 1e6, "a memory size is between 1 kiB and 1 PiB")),
    (r"tflops(_fp32)?$", Range(1e-9, 1e6, "a peak is between 1 kFLOP/s and 10^18 FLOP/s")),
    (r"efficiency", Range(1e-3, 1.0, "an efficiency is between 0.001 and 1")),
    (r"factor$", Range(1e-3, 1e3, "a factor is between 0.001 and 1000")),
    (r"(slowdown|_cv|taper|oversubscription|gain)$",
     Range(None, 1e3, "a ratio is at most 1000")),
)

MAX_WORLD = 2**19  # 524,288 GPUs: 2.7 s on a quiet 2-core host (see above)
MAX_EMULATED_RANKS = 512  # an emulated cluster (host_cores > 0): every rank a process on a host
STEP_WINDOW = 128  # steps simulated at most; more are extrapolated (simfed.engine.window)

PATH_LIMITS: dict[str, Range] = {
    "cluster.nodes": Range(None, MAX_WORLD, "the simulator's time grows with the GPUs; at most "
                           f"{MAX_WORLD:,} GPUs (a few seconds on 2 cores)"),
    "cluster.node.gpus": Range(None, 1024, "GPUs in one node (NVLink domain); the largest "
                               "built have 576"),
    "cluster.node.cpu_cores": Range(None, 1024, "host cores of one node"),
    "cluster.host_cores": Range(None, 1024, "cores of the one host an emulated cluster runs on"),
    "cluster.fabric.nodes_per_leaf": Range(None, MAX_WORLD, "nodes under one leaf switch"),
    "cluster.fabric.nodes_per_group": Range(None, MAX_WORLD, "nodes in one group"),
    "cluster.fabric.nodes_per_island": Range(None, MAX_WORLD, "nodes in one island"),
    "cluster.node.nics.count": Range(None, 64, "NIC rails per node"),
    "model.layers": Range(None, 256, "decoder layers: the deepest published LLMs have under "
                          "200 (a deep model's run is simulated over fewer steps)"),
    "model.hidden": Range(None, 2**20, "model width"),
    "model.ffn_hidden": Range(None, 2**22, "MLP width"),
    "model.heads": Range(None, 2**16, "attention heads"),
    "model.kv_heads": Range(None, 2**16, "attention heads"),
    "model.vocab": Range(None, 2**24, "vocabulary size"),
    "model.rope_theta": Range(None, 1e12, "RoPE base"),
    "model.norm_eps": Range(None, 1.0, "RMSNorm epsilon"),
    "training.seq_len": Range(None, 2**24, "tokens per sequence"),
    "training.micro_batch": Range(None, 2**20, "sequences per GPU per step"),
    "training.steps": Range(None, 10**12, "optimizer steps (beyond "
                            f"{STEP_WINDOW} they are extrapolated from a window)"),
    "training.lr": Range(None, 10.0, "learning rate"),
    "training.weight_decay": Range(None, 10.0, "weight decay"),
    "training.betas": Range(None, 0.999999, "Adam's betas are in [0, 1)", min=0.0),
    "data.synthetic_entropy_bits": Range(None, 64.0, "bits of entropy per token"),
    "stragglers.jitter.sigma": Range(None, 1.0, "a jitter sigma above 1 makes most steps' "
                                     "compute far faster than nominal (the mean-one lognormal's "
                                     "median is exp(-sigma^2/2)); uniform: below 1"),
    "validation.repeats": Range(None, 1000, "launches per shape"),
    "runtime.comm.sm_share": Range(None, 0.99, "a collective's kernels cannot hold the whole "
                                   "GPU: compute beside them would never finish"),
}


def _leaves(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _leaves(v)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield value


def check(path: str, name: str, value) -> str | None:
    """The reason `value` of key `path` (its last part `name`) is out of range, or None."""
    ranges = [r for pat, r in UNIT_RANGES if re.search(pat, name)]
    # list items of a path ("algorithms[2].round_budget_s") are checked by their key name only
    plain = re.sub(r"\[\d+\]", "", path)
    if plain in PATH_LIMITS:
        ranges.append(PATH_LIMITS[plain])
    for r in ranges:
        for v in _leaves(value):
            if v > r.hi:
                return f"must be <= {r.hi:g}, got {v!r} ({r.why})"
            if r.min is not None and v < r.min:
                return f"must be >= {r.min:g}, got {v!r} ({r.why})"
            if r.lo is not None and 0 < v < r.lo:
                return f"must be 0 or >= {r.lo:g}, got {v!r} ({r.why})"
    return None
