"""Micro-benchmarks of collectives, compute, the model's units and debug checks (`realrun bench`).

Runs on loopback or across the testbed; writes one trace per rank (simfed's schema) plus a
summary of bandwidths and costs.

    realrun bench --nproc 4 --out DIR                        # gloo over loopback, one host
    realrun bench scenarios/testbed.yaml --testbed --out DIR # across the testbed's namespaces
    realrun bench SCENARIO --testbed --skip comm,checks      # parts: comm, compute, units,
                                                             # optimizer, checks

Each rank runs `realrun.bench_worker` (see it for the trace content; `realrun.unitbench` for the
unit, optimizer and FedAvg-local benchmarks). With a SCENARIO, `--sizes` defaults to `auto`: the
message sizes the scenario's training moves (`auto_sizes`).

The summary, `DIR/bench-summary.json`, is realrun.bench_summary's; its rows are
simfed.spec.bench's.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from simfed.spec import Scenario, SpecError, algorithm_info, load_scenario
from simfed.spec.ops import OPS
from simfed.spec.overrides import parse_sets
from simfed.spec.paths import write_text_atomic

from .bench_cases import GROUP_KINDS, PARTS
from .bench_summary import SUMMARY, TRACE_GLOB, BenchError, format_summary, summarize
from .testbed import DEFAULT_PREFIX, TestbedError, testbed_for
from .torchrun import run_jobs, torchrun_argv

WORKER = "realrun.bench_worker"
MAX_NPROC = 64
_UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1024, "KIB": 1024, "M": 1024**2, "MB": 1024**2,
          "MIB": 1024**2, "G": 1024**3, "GB": 1024**3, "GIB": 1024**3}
DEFAULT_SIZES = "4K,64K,512K,2M"
QUICK = {"sizes": "4K,256K", "flops": "1e6,1e7", "iters": 3, "check_iters": 3, "unit_iters": 2,
         "opt_iters": 2, "rounds": 1}
LATENCY_NBYTES = 4096
MERGE_SIZES = 0.10


def parse_nbytes(text: str) -> int:
    """'4096', '64K', '1M', '1MiB' -> bytes (binary units)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).upper() if m else ""
    if not m or unit not in _UNITS:
        raise BenchError(f"size {text!r}: expected bytes like 4096, 64K, 1M")
    nbytes = int(float(m.group(1)) * _UNITS[unit])
    if not 4 <= nbytes <= 1024**3:
        raise BenchError(f"size {text!r}: must be 4 B .. 1 GiB, got {nbytes} B")
    return nbytes


def parse_sizes(text: str) -> list[int]:
    sizes = [parse_nbytes(s) for s in text.split(",") if s.strip()]
    if not sizes:
        raise BenchError("--sizes: give at least one size, e.g. 4K,64K,1M")
    return sizes


def parse_flops(text: str) -> list[float]:
    try:
        flops = [float(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise BenchError(f"--flops {text!r}: expected numbers like 1e6,1e8") from None
    bad = [f for f in flops if not 0 < f <= 1e12]
    if bad:
        raise BenchError(f"--flops: each must be in (0, 1e12], got {bad[0]:g}")
    return flops


def parse_names(text: str, valid: Sequence[str], what: str) -> str:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in valid]
    if bad or not names:
        raise BenchError(f"--{what}: unknown {', '.join(bad) or '(empty)'}; valid: "
                         f"{', '.join(valid)}")
    return ",".join(names)


def auto_sizes(scn: Scenario) -> list[int]:
    """The message sizes training moves for the scenario's model (full-buffer convention): each
    FSDP unit's bytes (all-gather output, reduce-scatter input; the all-reduce of a 1-rank
    shard), the unit's shard for each plan that replicates (HSDP's replica all-reduce), each
    federated plan's per-rank FedAvg buffer, and 4 KiB (the latency end); of sizes within 10% of
    each other only the smallest."""
    m = scn.model
    sizes = {LATENCY_NBYTES}
    for algo in scn.algorithms:
        plan = algo.plan(scn.cluster)
        for u in m.units(scn.training.seq_len):
            sizes.add(u.nbytes)
            if plan.replicate > 1:
                sizes.add(-(-u.nbytes // plan.shard))
        if algorithm_info(algo.name).federated and plan.groups > 1:
            local = -(-m.total_params // plan.shard)
            sizes.add(local * (2 if algo.fedavg_dtype == "bf16" else 4))
    kept: list[int] = []
    for n in sorted(min(max(n, 4), 1024**3) for n in sizes):
        if not kept or n > kept[-1] * (1 + MERGE_SIZES):  # one case for sizes within 10%
            kept.append(n)
    return kept


def resolve_sizes(text: str | None, scn: Scenario | None) -> list[int]:
    """--sizes: a list, or `auto` (needs a SCENARIO); default auto with a SCENARIO."""
    if text is None:
        text = "auto" if scn is not None else DEFAULT_SIZES
    if text.strip() == "auto":
        if scn is None:
            raise BenchError("--sizes auto: needs a SCENARIO (its model gives the sizes)")
        return auto_sizes(scn)
    return parse_sizes(text)


def worker_args(out: Path, *, sizes: Sequence[int], ops: str, groups: str, iters: int,
                flops: Sequence[float], hidden: int, ffn_hidden: int, check_iters: int,
                timeout_s: float, scenario: str | None = None, sets: Sequence[str] = (),
                skip: Sequence[str] = (), unit_iters: int = 8, opt_iters: int = 5,
                case_budget_s: float = 0.0, rounds: int = 1) -> list[str]:
    args = ["--out", str(out), "--sizes", ",".join(map(str, sizes)), "--ops", ops,
            "--groups", groups, "--iters", str(iters), "--flops",
            ",".join(f"{f:g}" for f in flops), "--hidden", str(hidden),
            "--ffn-hidden", str(ffn_hidden), "--check-iters", str(check_iters),
            "--timeout-s", str(max(30.0, timeout_s)), "--skip", ",".join(skip),
            "--unit-iters", str(unit_iters), "--opt-iters", str(opt_iters),
            "--case-budget-s", f"{case_budget_s:g}", "--rounds", str(rounds)]
    if scenario:
        args += ["--scenario", str(Path(scenario).resolve())]
        for item in sets:
            args += ["--set", item]
    return args


def run_local(nproc: int, args: Sequence[str], log_path: Path, timeout_s: float) -> tuple[int, str]:
    """torchrun --standalone on this host, gloo over loopback only; (exit code, output), 124
    when it timed out."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
           "PYTHONUNBUFFERED": "1"}
    result = run_jobs([torchrun_argv(WORKER, args, nproc_per_node=nproc)], [env], [log_path],
                      timeout_s=timeout_s)
    rc = 124 if result.timed_out else result.returncodes[0]
    return (rc if rc is not None else 124), result.nodes[0].output



def _scenario(path: str | None, sets: Sequence[str]) -> Scenario | None:
    if path is None:
        if sets:
            raise BenchError("--set needs a SCENARIO")
        return None
    try:
        return load_scenario(path, parse_sets(sets))
    except SpecError as exc:
        raise BenchError(str(exc)) from None


def run_bench(*, scenario: str | None, out: Path, nproc: int | None, testbed: bool,
              sizes: str | None, ops: str, groups: str, iters: int, flops: str,
              check_iters: int, timeout_s: float, prefix: str = DEFAULT_PREFIX,
              sets: Sequence[str] = (), rate_Gbps: float | None = None, skip: str = "",
              unit_iters: int = 8, opt_iters: int = 5,
              case_budget_s: float = 0.5, rounds: int = 3) -> dict[str, Any]:
    """Run the bench (locally or on the testbed), summarise it; raises BenchError/TestbedError."""
    for name, value, least in (("iters", iters, 1), ("check-iters", check_iters, 0),
                               ("unit-iters", unit_iters, 0), ("opt-iters", opt_iters, 0),
                               ("rounds", rounds, 1)):
        if value < least:
            raise BenchError(f"--{name}: must be >= {least}, got {value}")
    if not math.isfinite(case_budget_s) or case_budget_s < 0:  # nan: before, accepted
        raise BenchError(f"--case-budget-s: must be a finite number >= 0, got {case_budget_s:g}")
    # before: nan ran with no time limit at all, -1 launched the ranks and then "timed out"
    if not math.isfinite(timeout_s) or timeout_s <= 0:
        raise BenchError(f"--timeout-s: must be a finite number > 0, got {timeout_s:g}")
    if rate_Gbps is not None and not (math.isfinite(rate_Gbps) and rate_Gbps > 0):
        raise BenchError(f"--rate-Gbps: must be a finite rate > 0, got {rate_Gbps:g}")
    skipped = parse_names(skip, PARTS, "skip").split(",") if skip.strip() else []
    scn = _scenario(scenario, sets)
    hidden, ffn = (scn.model.hidden, scn.model.ffn_hidden) if scn else (256, 1024)
    ops, groups = parse_names(ops, OPS, "ops"), parse_names(groups, GROUP_KINDS, "groups")
    size_list = resolve_sizes(sizes, scn)  # also the out-of-step compute cases' all-gather
    flops_list = parse_flops(flops) if flops.strip() else []
    if testbed and nproc is not None:
        raise BenchError("--nproc: the testbed runs node.gpus ranks per node; drop --nproc")
    if not testbed and rate_Gbps is not None:
        raise BenchError("--rate-Gbps applies to the testbed; add --testbed")
    n = nproc if nproc is not None else (scn.cluster.world if scn else 4)
    if not testbed and not 2 <= n <= MAX_NPROC:
        raise BenchError(f"--nproc: must be 2..{MAX_NPROC}, got {n}")

    def prepare() -> None:  # only once the input is good and the ranks can start
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob(TRACE_GLOB):
            old.unlink()

    args = worker_args(out.resolve(), sizes=size_list, ops=ops, groups=groups, iters=iters,
                       flops=flops_list, hidden=hidden, ffn_hidden=ffn,
                       check_iters=check_iters, timeout_s=timeout_s, scenario=scenario,
                       sets=sets, skip=skipped, unit_iters=unit_iters, opt_iters=opt_iters,
                       case_budget_s=case_budget_s, rounds=rounds)
    t = time.monotonic()
    if testbed:
        with testbed_for(scn, prefix=prefix, rate_Gbps=rate_Gbps, source=scenario or "",
                         echo=lambda m: click.echo(m, err=True)) as tb:
            prepare()
            result = tb.launch(WORKER, args, timeout_s=timeout_s, log_dir=out / "logs")
        if not result.ok:
            raise BenchError(f"bench {result.summary()}; logs in {out / 'logs'}")
    else:
        prepare()
        rc, output = run_local(n, args, out / "launch.log", timeout_s)
        if rc != 0:
            errs = [ln for ln in output.splitlines() if "rror" in ln]
            hint = f": {errs[-1].strip()[:200]}" if errs else ""
            what = f"timed out after {timeout_s:g} s" if rc == 124 else f"failed (exit {rc})"
            raise BenchError(f"bench {what}{hint}; log: {out / 'launch.log'}")
    summary = summarize(out)
    summary["meta"]["bench_wall_s"] = time.monotonic() - t
    write_text_atomic(out / SUMMARY, json.dumps(summary, indent=1) + "\n")
    return summary


@click.command("bench")
@click.argument("scenario", required=False, type=click.Path(dir_okay=False))
@click.option("--out", type=click.Path(file_okay=False), default="runs/bench", show_default=True,
              help="folder for bench-rank*.jsonl traces and bench-summary.json")
@click.option("--nproc", type=int, default=None,
              help="ranks on this host (default: the scenario's world, else 4)")
@click.option("--testbed", "use_testbed", is_flag=True,
              help="run across the testbed (the one `realrun testbed up` left, else a temporary "
              "one built from SCENARIO)")
@click.option("--sizes", default=None,
              help="message sizes (full buffer), or `auto`: the scenario model's unit, shard and "
              f"FedAvg sizes and 4K  [default: auto with a SCENARIO, else {DEFAULT_SIZES}]")
@click.option("--ops", default="all_gather,reduce_scatter,all_reduce", show_default=True)
@click.option("--groups", default="intra,inter,world,fl", show_default=True,
              help="fl: the scenario's federation groups of several nodes")
@click.option("--iters", type=int, default=8, show_default=True)
@click.option("--flops", default="1e5,1e6,1e7,1e8", show_default=True,
              help="forward FLOPs of the compute block ('' = skip)")
@click.option("--check-iters", type=int, default=10, show_default=True,
              help="repetitions of the debug-check benchmark (0 = skip)")
@click.option("--unit-iters", type=int, default=8, show_default=True,
              help="hooked (and as many plain) iterations of the per-unit compute benchmark")
@click.option("--opt-iters", type=int, default=5, show_default=True,
              help="repetitions of the optimizer and FedAvg-local benchmarks")
@click.option("--case-budget-s", type=float, default=0.5, show_default=True,
              help="fewer repetitions (>= 3) for a collective case slower than this in all")
@click.option("--rounds", type=int, default=3, show_default=True,
              help="passes over all collective cases, each with its share of the repetitions "
              "(a disturbance spoils one sample of many cases, not all of one)")
@click.option("--skip", default="", help=f"parts to leave out: {','.join(PARTS)}")
@click.option("--quick", is_flag=True, help="a few sizes and repetitions (smoke test)")
@click.option("--timeout-s", type=float, default=300.0, show_default=True)
@click.option("--prefix", default=DEFAULT_PREFIX, show_default=True, help="testbed name prefix")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="override a scenario value, e.g. cluster.nodes=4")
@click.option("--rate-Gbps", "rate_Gbps", type=float, default=None,
              help="testbed link rate per node (default: the scenario's)")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
def bench_command(scenario: str | None, out: str, nproc: int | None, use_testbed: bool,
                  sizes: str | None, ops: str, groups: str, iters: int, flops: str,
                  check_iters: int, unit_iters: int, opt_iters: int, case_budget_s: float,
                  rounds: int, skip: str, quick: bool, timeout_s: float, prefix: str,
                  sets: tuple[str, ...], rate_Gbps: float | None, as_json: bool) -> None:
    """Collective (all-gather, reduce-scatter, all-reduce), compute and debug-check benchmarks
    and, with a SCENARIO, its model per FSDP unit, its optimizer step and FedAvg's local work,
    written as simfed traces."""
    if quick:  # smaller defaults; options given explicitly still win
        ctx = click.get_current_context()

        def default(name: str) -> bool:
            return ctx.get_parameter_source(name) is click.core.ParameterSource.DEFAULT

        sizes = str(QUICK["sizes"]) if default("sizes") else sizes
        flops = str(QUICK["flops"]) if default("flops") else flops
        iters = int(QUICK["iters"]) if default("iters") else iters
        check_iters = int(QUICK["check_iters"]) if default("check_iters") else check_iters
        unit_iters = int(QUICK["unit_iters"]) if default("unit_iters") else unit_iters
        opt_iters = int(QUICK["opt_iters"]) if default("opt_iters") else opt_iters
        rounds = int(QUICK["rounds"]) if default("rounds") else rounds
    try:
        summary = run_bench(scenario=scenario, out=Path(out), nproc=nproc, testbed=use_testbed,
                            sizes=sizes, ops=ops, groups=groups, iters=iters, flops=flops,
                            check_iters=check_iters, timeout_s=timeout_s, prefix=prefix,
                            sets=sets, rate_Gbps=rate_Gbps, skip=skip, unit_iters=unit_iters,
                            opt_iters=opt_iters, case_budget_s=case_budget_s, rounds=rounds)
    except (BenchError, TestbedError, SpecError) as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from None
    click.echo(json.dumps(summary, indent=1) if as_json else format_summary(summary))
    click.echo(f"traces: {out}/{TRACE_GLOB}; summary: {out}/{SUMMARY}", err=True)
