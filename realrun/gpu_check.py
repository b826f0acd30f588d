"""A prepared GPU check (`make gpu-check`): what a lent GPU machine measures against simfed's
kernel model, in one command that needs no network and finishes in a few minutes on one GPU.

Stages (each timed, each recorded as ok / skipped / failed with the reason; one failing stage
does not stop the others; a stage that would overrun the time budget is skipped and says so):

1. env: torch, CUDA and NCCL versions, the device, its SMs and memory; which cluster file of
   this repository holds its datasheet figures (by name: H200, H100, A100 80 GB).
2. micro: micro-timings on the device, median of repeated runs timed with CUDA events: bf16
   GEMMs (Llama 3 8B's layer shapes, a sweep of the reduction dimension K, small-model shapes,
   a wave-quantisation edge), fused attention (SDPA's flash backend, causal, head dim 64 and
   128, forward and backward) and memory-bound kernels (copy, add, PyTorch's fused RMSNorm,
   torchtitan's composite RMSNorm and RoPE through fp32): what simfed.compute charges with
   `gemm_efficiency`, `attention_efficiency_*`, `hbm_efficiency` and the eager_norm /
   eager_rope byte counts.
3. runs: realrun's four algorithms (fsdp, hsdp, fl_fsdp, fl_hsdp) in one launch on NCCL, a
   small Llama for a dozen steps, with torch.profiler over a few steps of each. NCCL refuses
   two ranks on one GPU ("Duplicate GPU detected", a check since NCCL 2.5: NVIDIA/nccl#418),
   so the world is the number of GPUs: one GPU runs each algorithm at world size 1 (NCCL
   initialised, FSDP2's world-size-1 path, no collective on the wire, FedAvg over one group);
   two or more GPUs run 2 emulated nodes (HSDP replicas and FL groups of one node each).
4. calibrate: `simfed calibrate` on the fsdp run's profiler trace -> a calibrated profile.
5. compare: `python -m simfed.calibration.gpu_check` (simfed, no torch): every micro-timing
   against the kernel model's prediction with the shipped constants and with the calibrated
   ones, the implied efficiencies (GEMM efficiency against K, attention against head dim), and
   each run's measured step time against `simfed run` of the same scenario.

Results (small JSON and YAML, meant to be committed as data) go to results/gpu/STAMP-DEVICE/;
bulky outputs (traces, run folders) to runs/gpu-check/STAMP-DEVICE/ (git-ignored), where a dry
run's results go too.

`--dry-run` runs every stage on the CPU: the CUDA calls are skipped and recorded as skipped
(CUDA events, NCCL, SDPA's flash backend, the device's datasheet figures); the micro-timings
run a few tiny shapes with the CPU clock, the runs use gloo and realrun's CPU-sized model, and
the comparison uses the CPU reference figures of tests/fixtures/profiler/cpu1.yaml. It checks
the plumbing, not the GPU (tests/realrun/test_gpu_check.py runs it).

Usage: python -m realrun.gpu_check [--dry-run] [--results DIR] [--work DIR] [--budget-s S]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from simfed.spec.yamlio import dump_yaml

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = 450.0  # the whole check; the limit is 8 minutes on one GPU
# what each stage may take at most (seconds), and what it needs left of the budget to start
# (a dry run, on a CPU that may be busy, gives each stage what is left of the budget instead)
STAGE_LIMIT_S = {"micro": 120.0, "runs": 240.0, "calibrate": 60.0, "compare": 90.0}

# device name token -> (cluster file, runtime profile) in this repository; the first match wins
DEVICES = (
    ("H200", "scenarios/clusters/dgx-h200.yaml", "scenarios/profiles/dgx-h100.yaml"),
    ("H100", "scenarios/clusters/dgx-h100.yaml", "scenarios/profiles/dgx-h100.yaml"),
    ("A100", "scenarios/clusters/a100-80gb-roce.yaml", "scenarios/profiles/a100.yaml"),
)
DRY_RUN_SCENARIO = "tests/fixtures/profiler/cpu1.yaml"  # CPU reference figures, CPU model

# ---- micro-benchmark shapes ------------------------------------------------------------------
# GEMMs (name, m, n, k): C (m x n) = A (m x k) @ B (k x n)
GEMMS_CUDA = (
    ("square 4096", 4096, 4096, 4096),
    ("square 8192", 8192, 8192, 8192),
    # Llama 3 8B, 8192 tokens: fused q/k/v, attention out, gate+up, down, LM head; backward
    ("llama8b qkv", 8192, 6144, 4096),
    ("llama8b attn out", 8192, 4096, 4096),
    ("llama8b gate+up", 8192, 28672, 4096),
    ("llama8b down", 8192, 4096, 14336),
    ("llama8b lm head", 8192, 128256, 4096),
    ("llama8b qkv dgrad", 8192, 4096, 6144),
    ("llama8b qkv wgrad", 4096, 6144, 8192),
    # the reduction dimension alone (the kernel model has no K term: small models' GEMMs)
    *((f"K sweep k={k}", 16384, 8192, k) for k in (512, 768, 1024, 2048, 4096, 8192)),
    # MPT-125M / 1B at llm-foundry's micro-batches (hidden 768 / 2048)
    ("mpt125m qkv", 53248, 2304, 768),
    ("mpt125m mlp down", 53248, 768, 3072),
    ("mpt1b qkv", 16384, 6144, 2048),
    # wave quantisation: 129 x 64 output tiles of 128 x 128, one tile over a wave of 132 SMs
    ("wave edge", 16512, 8192, 4096),
)
GEMMS_CPU = (("tiny square", 128, 128, 128), ("tiny K sweep k=64", 256, 256, 64),
             ("tiny K sweep k=256", 256, 256, 256))
# attention (name, batch, heads, seq, head_dim), causal
ATTENTION_CUDA = (
    ("llama8b s8192 d128", 1, 32, 8192, 128),
    ("s4096 d128", 2, 32, 4096, 128),
    ("s2048 d128", 4, 16, 2048, 128),
    ("s2048 d64", 4, 32, 2048, 64),
    ("mpt125m s2048 d64", 26, 12, 2048, 64),
)
ATTENTION_CPU = (("tiny s64 d32", 1, 2, 64, 32),)
# memory-bound (name, op, tokens, width): op in copy, add, rmsnorm_fused, rmsnorm_composite,
# rope_composite (width: hidden size; rope: q heads x head dim)
MEMORY_CUDA = (
    ("copy 1 GiB", "copy", 65536, 8192),
    ("add 1 GiB", "add", 65536, 8192),
    ("rmsnorm fused", "rmsnorm_fused", 8192, 4096),
    ("rmsnorm composite", "rmsnorm_composite", 8192, 4096),
    ("rope composite", "rope_composite", 8192, 4096),
)
MEMORY_CPU = (("tiny copy", "copy", 64, 256), ("tiny rmsnorm composite", "rmsnorm_composite",
                                                64, 256), ("tiny rope composite",
                                                           "rope_composite", 64, 256))
REPS, WARMUP = 10, 3

# the runs' model on a GPU: a small Llama (about 0.5B parameters), bf16, a few steps
RUN_MODEL = {"name": "llama-gpu-check", "layers": 8, "hidden": 2048, "ffn_hidden": 5632,
             "heads": 16, "kv_heads": 8, "vocab": 32000, "tied_embeddings": False,
             "dtype": "bf16", "rope_theta": 500000.0, "norm_eps": 1.0e-5}
RUN_TRAINING = {"seq_len": 4096, "micro_batch": 2, "steps": 12, "eval_sequences": 8,
                "lr": 3.0e-4, "warmup_steps": 2, "optimizer_state_dtype": "fp32"}
RUN_PROFILE_STEPS = "6:9"
DRY_TRAINING = {"steps": 6, "eval_sequences": 8}
DRY_PROFILE_STEPS = "2:4"


# ---- the record ------------------------------------------------------------------------------
class Check:
    """The check's state: where things go, the budget, each stage's outcome."""

    def __init__(self, results: Path, work: Path, budget_s: float, dry_run: bool,
                 say: Callable[[str], None]) -> None:
        self.results, self.work, self.budget_s, self.dry_run = results, work, budget_s, dry_run
        self.say = say
        self.t0 = time.monotonic()
        self.stages: dict[str, dict[str, Any]] = {}
        self.skipped_cuda: list[str] = []  # the CUDA parts a dry run (or no GPU) left out

    def left_s(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)

    def limit_s(self, name: str, reserve_s: float = 0.0) -> float:
        """What a stage's subprocess may take: its limit on a GPU (what is left of the budget
        in a dry run), never more than the budget left less `reserve_s` for what follows."""
        left = max(5.0, self.left_s() - reserve_s)
        return left if self.dry_run else min(STAGE_LIMIT_S[name], left)

    def stage(self, name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        limit = STAGE_LIMIT_S.get(name, 30.0)
        need = min(limit, 20.0)
        if self.left_s() < need:
            out = {"status": "skipped", "why": f"time budget: {self.left_s():.0f} s left of "
                   f"{self.budget_s:.0f} s, the stage needs about {need:.0f} s"}
        else:
            t = time.monotonic()
            try:
                out = {"status": "ok", **fn()}
            except StageSkipped as exc:
                out = {"status": "skipped", "why": str(exc)}
            except Exception as exc:
                out = {"status": "failed", "why": f"{type(exc).__name__}: {exc}"[:2000]}
            out["seconds"] = round(time.monotonic() - t, 2)
        self.stages[name] = out
        self.say(f"gpu-check: {name}: {out['status']}"
                 + (f" ({out['why']})" if "why" in out else "")
                 + (f" in {out['seconds']:.1f} s" if "seconds" in out else ""))
        return out


class StageSkipped(Exception):
    """A stage that cannot run here (the reason is its message)."""


# ---- stage 1: environment --------------------------------------------------------------------
def environment(dry_run: bool) -> dict[str, Any]:
    env: dict[str, Any] = {"torch": torch.__version__, "python": sys.version.split()[0],
                           "cuda_available": torch.cuda.is_available(), "dry_run": dry_run}
    if dry_run or not torch.cuda.is_available():
        env.update(device="cpu", gpus=0, cluster=None, profile=None)
        return env
    props = torch.cuda.get_device_properties(0)
    nccl = torch.cuda.nccl.version() if hasattr(torch.cuda, "nccl") else None
    env.update(device=props.name, gpus=torch.cuda.device_count(), cuda=torch.version.cuda,
               nccl=".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
               capability=f"{props.major}.{props.minor}", sms=props.multi_processor_count,
               memory_GiB=round(props.total_memory / 2**30, 2))
    env["cluster"], env["profile"] = device_files(props.name, props.total_memory / 2**30)
    return env


def device_files(name: str, memory_GiB: float) -> tuple[str | None, str | None]:
    """The repository's cluster file and runtime profile for a device, by name. An A100 with
    under 60 GiB is the 40 GB part (HBM2 at 1,555 GB/s, not the 80 GB part's 2,039): no file
    describes it, so none is chosen."""
    for token, cluster, profile in DEVICES:
        if token in name.upper():
            if token == "A100" and memory_GiB < 60:
                return None, None
            return cluster, profile
    return None, None


# ---- stage 2: micro-timings ------------------------------------------------------------------
def time_op(fn: Callable[[], Any], device: torch.device, reps: int = REPS,
            warmup: int = WARMUP) -> dict[str, float]:
    """Median, p10 and p90 of `reps` runs of fn after `warmup` ones: CUDA events around each
    run on a GPU (the device's own clock), the host clock on a CPU."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    if device.type == "cuda":
        torch.cuda.synchronize()
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                 for _ in range(reps)]
        for start, end in pairs:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) * 1e-3 for s, e in pairs]
    else:
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    times.sort()
    q = statistics.quantiles(times, n=10) if len(times) > 1 else times * 9
    return {"time_s": statistics.median(times), "p10_s": q[0], "p90_s": q[-1], "reps": reps}


def micro_timings(device: torch.device, dry_run: bool) -> dict[str, Any]:
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    notes = []
    if not cuda:
        notes.append("CPU: tiny shapes timed with the host clock (CUDA events, bf16 tensor "
                     "cores and SDPA's flash backend skipped)")
    rows: list[dict[str, Any]] = []
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*shape: int, grad: bool = False) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=dtype, generator=gen,
                           requires_grad=grad)

    for name, m, n, k in (GEMMS_CUDA if cuda else GEMMS_CPU):
        a, b = rand(m, k), rand(k, n)
        out = torch.empty(m, n, device=device, dtype=dtype)
        rows.append({"kind": "gemm", "name": name, "m": m, "n": n, "k": k,
                     **time_op(lambda a=a, b=b, out=out: torch.matmul(a, b, out=out), device)})
        del a, b, out
    for name, bsz, heads, seq, hd in (ATTENTION_CUDA if cuda else ATTENTION_CPU):
        rows.extend(_attention_rows(name, bsz, heads, seq, hd, rand, device))
    for name, op, tokens, width in (MEMORY_CUDA if cuda else MEMORY_CPU):
        fn, nbytes_note = _memory_op(op, tokens, width, rand)
        rows.append({"kind": "memory", "name": name, "op": op, "tokens": tokens,
                     "width": width, "elements": tokens * width, "note": nbytes_note,
                     **time_op(fn, device)})
    if cuda:
        torch.cuda.empty_cache()
    return {"device": str(device), "dtype": str(dtype).removeprefix("torch."), "rows": rows,
            "notes": notes}


def _attention_rows(name: str, bsz: int, heads: int, seq: int, hd: int,
                    rand: Callable[..., torch.Tensor], device: torch.device
                    ) -> list[dict[str, Any]]:
    """Causal SDPA forward and backward; on a GPU its flash backend alone."""
    q, k, v = (rand(bsz, heads, seq, hd, grad=True) for _ in range(3))
    backend = "flash"
    if device.type == "cuda":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        ctx: Callable[[], Any] = lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)  # noqa: E731
    else:
        import contextlib
        ctx, backend = contextlib.nullcontext, "cpu default"

    def fwd() -> torch.Tensor:
        with ctx():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    out = fwd()
    grad = torch.randn_like(out)

    def bwd() -> None:
        with ctx():
            torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)

    shape = {"batch": bsz, "heads": heads, "seq": seq, "head_dim": hd, "causal": True,
             "backend": backend}
    return [{"kind": "attention", "name": name, "direction": "forward", **shape,
             **time_op(fwd, device)},
            {"kind": "attention", "name": name, "direction": "backward", **shape,
             **time_op(bwd, device)}]


def _memory_op(op: str, tokens: int, width: int, rand: Callable[..., torch.Tensor]
               ) -> tuple[Callable[[], Any], str]:
    x = rand(tokens, width)
    if op == "copy":
        y = torch.empty_like(x)
        return (lambda: y.copy_(x)), "read and write the tensor"
    if op == "add":
        y, z = rand(tokens, width), torch.empty_like(x)
        return (lambda: torch.add(x, y, out=z)), "read two tensors, write one"
    w = torch.ones(width, device=x.device, dtype=x.dtype)
    if op == "rmsnorm_fused":
        return (lambda: F.rms_norm(x, (width,), w, 1e-5)), "torch.nn.functional.rms_norm"
    if op == "rmsnorm_composite":  # torchtitan's RMSNorm class before 5078e92 (norms.py)
        def norm() -> torch.Tensor:
            x32 = x.float()
            return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * w
        return norm, "torchtitan's composite RMSNorm through fp32"
    if op == "rope_composite":  # torchtitan's apply_rotary_emb on one of q, k
        hd = 128 if width % 128 == 0 and width >= 128 else width
        xr = x.view(tokens, width // hd, hd)
        ang = torch.arange(tokens * hd // 2, device=x.device, dtype=torch.float32)
        freqs = torch.polar(torch.ones_like(ang), ang).view(tokens, 1, hd // 2)

        def rope() -> torch.Tensor:
            xc = torch.view_as_complex(xr.float().reshape(tokens, width // hd, hd // 2, 2))
            return torch.view_as_real(xc * freqs).flatten(2).type_as(xr)
        return rope, "torchtitan's composite RoPE (complex multiply through fp32)"
    raise ValueError(f"unknown memory op {op!r}")


# ---- stage 3: realrun's four algorithms ------------------------------------------------------
def run_scenario(env: dict[str, Any], dry_run: bool) -> dict[str, Any]:
    """The runs' scenario, includes resolved (plain data): the device's cluster file and
    profile, the emulated nodes, the model and the four algorithms."""
    from simfed.spec.loader import load_scenario_data, scenario_from_dict

    if dry_run or env["gpus"] == 0:
        data = load_scenario_data(ROOT / DRY_RUN_SCENARIO)
        data["training"].update(DRY_TRAINING)
        nodes, gpus = 1, 1
    else:
        cluster = env["cluster"] or "scenarios/clusters/dgx-h100.yaml"
        profile = env["profile"] or "scenarios/profiles/dgx-h100.yaml"
        tmp = {"name": "gpu-check", "seed": 0,
               "cluster": {"include": str(ROOT / cluster)},
               "model": dict(RUN_MODEL), "training": dict(RUN_TRAINING),
               "data": {"source": "synthetic"},
               "runtime": {"include": str(ROOT / profile)}}
        path = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpu-check-{os.getpid()}.yaml"
        path.write_text(dump_yaml(tmp, sort_keys=False))
        try:
            data = load_scenario_data(path)
        finally:
            path.unlink(missing_ok=True)
        n = env["gpus"]
        nodes, gpus = (2, n // 2) if n >= 2 else (1, 1)
        if not env["cluster"]:
            data["cluster"]["node"]["gpu"]["name"] = env["device"]
    data["name"] = "gpu-check"
    data["description"] = ("the GPU check's runs (realrun.gpu_check): realrun's four "
                           "algorithms" + (" on CPU ranks (dry run)" if dry_run else ""))
    data["cluster"]["nodes"] = nodes
    data["cluster"]["node"]["gpus"] = gpus
    data["cluster"].pop("host_cores", None)
    data["algorithms"] = [
        {"name": "fsdp", "forward_prefetch": True, "backward_prefetch": "pre"},
        {"name": "hsdp", "forward_prefetch": True, "backward_prefetch": "pre"},
        {"name": "fl_fsdp", "group_nodes": 1, "aggregate_every": 2},
        {"name": "fl_hsdp", "group_nodes": 1, "aggregate_every": 2},
    ]
    scenario_from_dict(data, where="gpu-check scenario")  # valid before anything runs
    return data


def _env() -> dict[str, str]:
    """The subprocesses' environment: this checkout first on the import path (simfed and
    realrun need not be installed on the GPU machine)."""
    old = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + old if old else "")}


def _rel(path: Path) -> str:
    """A path as the check's records and subprocesses name it: relative to the repository
    when inside it (results and provenance name no machine's folders)."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def unprofiled_step_s(step_times: list[float], window: str) -> float | None:
    """Median step time of the steps after the first outside the profiler's window A:B (the
    profiled steps carry the profiler's own cost)."""
    a, b = (int(x) for x in window.split(":"))
    kept = [t for i, t in enumerate(step_times) if i >= 1 and not a <= i < b]
    return statistics.median(kept) if kept else None


def realrun_runs(check: Check, scenario: Path, env: dict[str, Any]) -> dict[str, Any]:
    dry = check.dry_run or env["gpus"] == 0
    out = check.work / "runs"
    window = DRY_PROFILE_STEPS if dry else RUN_PROFILE_STEPS
    cmd = [sys.executable, "-m", "realrun.cli", "run", _rel(scenario), "-a", "all",
           "-o", _rel(out), "--device", "cpu" if dry else "cuda", "--timeout-s", "60",
           "--profile-steps", window, "-q"]
    limit = check.limit_s("runs", reserve_s=60.0)
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, cwd=ROOT,
                             env=_env())
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"realrun run did not finish in {limit:.0f} s") from None
    (check.work / "realrun.log").write_text(res.stdout + res.stderr)
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"realrun run exit {res.returncode}: {' | '.join(tail)}")
    summaries = {}
    for alg in ("fsdp", "hsdp", "fl_fsdp", "fl_hsdp"):
        s = json.loads((out / alg / "summary.json").read_text())
        summaries[alg] = {k: s.get(k) for k in (
            "world_size", "backend", "device", "plan", "steps", "tokens_per_step",
            "step_time_s", "step_time_s_after_first", "step_times_s", "phases_s",
            "tokens_per_s", "torch_version", "sharding", "fedavg")}
        summaries[alg]["profiled_steps"] = window
        summaries[alg]["step_time_s_unprofiled"] = unprofiled_step_s(
            s.get("step_times_s") or [], window)
    notes = []
    if dry:
        notes.append("dry run: gloo on CPU ranks (NCCL skipped)")
    elif env["gpus"] == 1:
        notes.append("one GPU: NCCL at world size 1 (NCCL refuses two ranks on one GPU); no "
                     "collective crosses a link, FedAvg averages one group")
    return {"command": "python " + " ".join(cmd[1:]), "folder": _rel(out),
            "summaries": summaries, "notes": notes}


# ---- stages 4 and 5: simfed (subprocesses: realrun imports only simfed.spec) ------------------
def calibrate(check: Check, scenario: Path) -> dict[str, Any]:
    prof = check.work / "runs" / "fsdp"
    if not any(prof.glob("profile_rank*.json")):
        raise StageSkipped("no profiler trace from the fsdp run")
    cmd = [sys.executable, "-m", "simfed.cli", "calibrate", _rel(prof), "--scenario",
           _rel(scenario), "--out", _rel(check.results / "calibrated.yaml"),
           "--report", _rel(check.work / "calibrated-report.json")]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=_env(),
                         timeout=check.limit_s("calibrate", reserve_s=20.0))
    (check.work / "calibrate.log").write_text(res.stdout + res.stderr)
    if res.returncode != 0:
        raise RuntimeError(f"simfed calibrate exit {res.returncode}: "
                           f"{(res.stderr or res.stdout).strip().splitlines()[-1:]}")
    report = json.loads((check.work / "calibrated-report.json").read_text())
    kernels = report.get("fits", {}).get("kernels", {})
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(("kernels", "  not used"))]
    return {"kernels": {k: kernels.get(k) for k in ("device", "n", "params", "not_used",
                                                     "rms_rel_error", "note")},
            "lines": lines}


def compare(check: Check) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "simfed.calibration.gpu_check", _rel(check.results)]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=_env(),
                         timeout=check.limit_s("compare"))
    (check.work / "compare.log").write_text(res.stdout + res.stderr)
    if res.returncode != 0:
        raise RuntimeError(f"simfed.calibration.gpu_check exit {res.returncode}: "
                           f"{(res.stderr or res.stdout).strip().splitlines()[-1:]}")
    check.say(res.stdout.rstrip())
    return {"file": "compare.json"}


# ---- main ------------------------------------------------------------------------------------
def missing_modules() -> list[str]:
    """simfed's own dependencies that this Python lacks (a GPU image may hold torch and not
    them); realrun imports simfed.spec, the subprocesses the rest of simfed."""
    import importlib.util

    return [m for m in ("pydantic", "simpy", "scipy", "click", "rich", "yaml", "simfed")
            if importlib.util.find_spec(m) is None]


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    tmp.replace(path)


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-") or "device"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m realrun.gpu_check", description=__doc__.split(
        "\n\n")[0])
    ap.add_argument("--dry-run", action="store_true",
                    help="run every stage on the CPU with the CUDA calls skipped (a test)")
    ap.add_argument("--results", type=Path, default=None,
                    help="folder for the results (default results/gpu/STAMP-DEVICE; a dry "
                    "run's: WORK/results)")
    ap.add_argument("--work", type=Path, default=None,
                    help="folder for traces and runs (default runs/gpu-check/STAMP-DEVICE)")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S,
                    help=f"time budget of the whole check (default {BUDGET_S:.0f} s)")
    args = ap.parse_args(argv)
    if not (args.budget_s > 0 and args.budget_s < 1e5):
        print(f"error: --budget-s: must be a number of seconds in (0, 1e5), got "
              f"{args.budget_s}", file=sys.stderr)
        return 2
    dry = args.dry_run
    missing = missing_modules()
    if missing:
        print(f"error: simfed's dependencies are not installed here: {', '.join(missing)} "
              "(docs/gpu-check.md: carrying them as wheels to a machine without a network)",
              file=sys.stderr)
        return 2
    if not dry and not torch.cuda.is_available():
        print("error: no CUDA device: run on a GPU machine, or --dry-run to check the "
              "plumbing on the CPU", file=sys.stderr)
        return 2
    env = environment(dry)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    tag = f"{stamp}-{'dry-run' if dry else _slug(env['device'])}"
    work = args.work or ROOT / "runs" / "gpu-check" / tag
    # a dry run measures no GPU: its results stay with the git-ignored work, not in results/
    results = args.results or (work / "results" if dry else ROOT / "results" / "gpu" / tag)
    for folder in (results, work):
        if folder.exists() and any(folder.iterdir()):
            print(f"error: {folder}: not empty (the check writes a fresh folder)",
                  file=sys.stderr)
            return 2
        folder.mkdir(parents=True, exist_ok=True)
    check = Check(results, work, args.budget_s, dry, lambda s: print(s, flush=True))
    check.stages["env"] = {"status": "ok", **env}
    print(f"gpu-check: {env['device']}, torch {env['torch']}"
          + (f", CUDA {env.get('cuda')}, NCCL {env.get('nccl')}, {env['gpus']} GPU(s)"
             if not dry else " (dry run: CUDA parts skipped)"), flush=True)
    if dry:
        check.skipped_cuda += ["CUDA-event micro-timings of the GPU shapes",
                               "SDPA's flash backend", "NCCL (runs use gloo)",
                               "the device's datasheet figures (CPU reference figures used)"]
    device = torch.device("cpu") if dry else torch.device("cuda", 0)

    scenario_data = run_scenario(env, dry)
    scenario = results / "scenario.yaml"
    scenario.write_text("# the GPU check's scenario, includes resolved (realrun.gpu_check)\n"
                        + dump_yaml(scenario_data, sort_keys=False))

    def _micro() -> dict[str, Any]:
        m = micro_timings(device, dry)
        _write_json(results / "micro.json", {"env": env, **m})
        return {"rows": len(m["rows"]), "notes": m["notes"]}

    check.stage("micro", _micro)
    runs = check.stage("runs", lambda: realrun_runs(check, scenario, env))
    if runs["status"] == "ok":
        _write_json(results / "runs.json", {"summaries": runs.pop("summaries"),
                                            "command": runs["command"],
                                            "notes": runs["notes"]})
        runs.pop("folder", None)
    check.stage("calibrate", lambda: calibrate(check, scenario))
    check.stage("compare", lambda: compare(check))
    summary = {"stamp": stamp, "dry_run": dry, "budget_s": args.budget_s,
               "seconds": round(time.monotonic() - check.t0, 1),
               "skipped_cuda_parts": check.skipped_cuda, "stages": check.stages,
               "files": sorted(p.name for p in results.iterdir())}
    _write_json(results / "summary.json", summary)
    bad = [n for n, s in check.stages.items() if s["status"] == "failed"]
    states = "; ".join(f"{n} {s['status']}" for n, s in check.stages.items())
    print(f"gpu-check: {states}; {summary['seconds']:.0f} s; results in {_rel(results)}",
          flush=True)
    if dry:
        print("gpu-check: dry run: skipped " + "; ".join(check.skipped_cuda), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
