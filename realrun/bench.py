"""Micro-benchmarks of collectives, compute and debug checks (`realrun bench`), as simfed traces.

Runs on loopback or across the testbed; writes one trace per rank plus a summary of bandwidths
and costs.

    realrun bench --nproc 4 --out DIR                        # gloo over loopback, one host
    realrun bench scenarios/testbed.yaml --testbed --out DIR # across the testbed's namespaces

Each rank runs `realrun.bench_worker` (see it for the trace content). The summary
(`DIR/bench-summary.json`) takes, for each repetition of a collective, the slowest rank of the
group (the collective ends when its last rank does), then the median over repetitions and over
concurrent groups; algbw = nbytes / time, busbw = algbw x (p-1)/p (all-gather, reduce-scatter) or
2(p-1)/p (all-reduce), the nccl-tests convention.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from simfed.spec import Scenario, Span, SpecError, load_scenario, read_trace

from .testbed import DEFAULT_PREFIX, TestbedError, kill_group, parse_sets, testbed_for

WORKER = "realrun.bench_worker"
OPS = ("all_gather", "reduce_scatter", "all_reduce")
GROUP_KINDS = ("intra", "inter", "world")
TRACE_GLOB = "bench-rank*.jsonl"
SUMMARY = "bench-summary.json"
MAX_NPROC = 64
_UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1024, "KIB": 1024, "M": 1024**2, "MB": 1024**2,
          "MIB": 1024**2, "G": 1024**3, "GB": 1024**3, "GIB": 1024**3}
QUICK = {"sizes": "4K,256K", "flops": "1e6,1e7", "iters": 3, "check_iters": 3}


class BenchError(RuntimeError):
    """Bad bench input or a failed bench job; the message is one line."""


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


def worker_args(out: Path, *, sizes: Sequence[int], ops: str, groups: str, iters: int,
                flops: Sequence[float], hidden: int, ffn_hidden: int, check_iters: int,
                timeout_s: float) -> list[str]:
    return ["--out", str(out), "--sizes", ",".join(map(str, sizes)), "--ops", ops,
            "--groups", groups, "--iters", str(iters), "--flops",
            ",".join(f"{f:g}" for f in flops), "--hidden", str(hidden),
            "--ffn-hidden", str(ffn_hidden), "--check-iters", str(check_iters),
            "--timeout-s", str(max(30.0, timeout_s))]


def run_local(nproc: int, args: Sequence[str], log_path: Path, timeout_s: float) -> tuple[int, str]:
    """torchrun --standalone on this host, gloo over loopback only; (exit code, output)."""
    exe = Path(sys.executable).with_name("torchrun")
    launcher = [str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]
    cmd = [*launcher, "--standalone", "--nnodes", "1", "--nproc-per-node", str(nproc),
           "--max-restarts", "0", "-m", WORKER, *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
           "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            rc = 124
        except BaseException:  # Ctrl-C: end the whole torchrun process group, then re-raise
            kill_group(proc)
            raise
    return rc, log_path.read_text(errors="replace")


# ---------------------------------------------------------------------------------------------
# summary


def load_spans(out: Path) -> tuple[dict[str, Any], list[Span]]:
    paths = sorted(out.glob(TRACE_GLOB))
    if not paths:
        raise BenchError(f"no {TRACE_GLOB} in {out}")
    meta: dict[str, Any] = {}
    spans: list[Span] = []
    for path in paths:
        m, s = read_trace(path)
        if not meta or path.name == "bench-rank0.jsonl":
            meta = m
        spans += s
    return meta, spans


def bus_factor(op: str, p: int) -> float:
    return (2.0 if op == "all_reduce" else 1.0) * (p - 1) / p


def summarize(out: str | Path) -> dict[str, Any]:
    """Medians per case from a bench folder's traces (see the module docstring)."""
    meta, spans = load_spans(Path(out))
    comm: dict[tuple, dict[tuple, float]] = defaultdict(dict)
    compute: dict[tuple, list[float]] = defaultdict(list)
    checks: dict[tuple, list[float]] = defaultdict(list)
    for s in spans:
        a = s.attrs
        if s.cat == "comm":
            key = (s.group, a["concurrent_groups"], s.name, s.nbytes, a["group_size"],
                   a["nodes"], a.get("impl", ""))
            rep = (a["group_index"], s.step)
            comm[key][rep] = max(comm[key].get(rep, 0.0), s.dur_s)
        elif s.cat == "compute":
            compute[(s.name, a["concurrent"], a["flops"], a["hidden"], a["ffn_hidden"])].append(
                s.dur_s)
        elif s.cat == "host":
            checks[(a["group_size"], a["nodes"], s.name, a.get("debug", ""))].append(s.dur_s)
    comm_rows = []
    for (group, conc, op, nbytes, p, nodes, impl), reps in sorted(comm.items()):
        t = statistics.median(reps.values())
        algbw = nbytes * 8 / t / 1e9
        comm_rows.append({
            "op": op, "group": group, "group_size": p, "nodes": nodes,
            "concurrent_groups": conc, "nbytes": nbytes, "impl": impl, "time_s": t,
            "min_time_s": min(reps.values()), "samples": len(reps), "algbw_Gbps": algbw,
            "busbw_Gbps": algbw * bus_factor(op, p),
        })
    compute_rows = []
    for (name, conc, flops, h, f), durs in sorted(compute.items()):
        t = statistics.median(durs)
        compute_rows.append({"phase": name, "concurrent": conc, "flops": flops, "hidden": h,
                             "ffn_hidden": f, "time_s": t, "gflops_per_s": flops / t / 1e9,
                             "samples": len(durs)})
    by_size: dict[tuple[int, int], dict[str, float]] = defaultdict(dict)
    for (k, nodes, name, debug), durs in checks.items():
        by_size[(k, nodes)][f"{name}_{debug}" if debug else name] = statistics.median(durs)
    check_rows = []
    for (k, nodes), d in sorted(by_size.items()):
        row: dict[str, Any] = {"group_size": k, "nodes": nodes}
        row.update({f"{name}_s": v for name, v in sorted(d.items())})
        if "all_reduce_tiny_detail" in d and "all_reduce_tiny_off" in d:
            row["detail_check_s"] = d["all_reduce_tiny_detail"] - d["all_reduce_tiny_off"]
        check_rows.append(row)
    return {"meta": meta, "comm": comm_rows, "compute": compute_rows, "checks": check_rows}


def format_summary(summary: dict[str, Any]) -> str:
    m = summary["meta"]
    net = (f"testbed {m.get('testbed')} at {m.get('link_rate_Gbps'):g} Gb/s per node"
           if m.get("network") == "testbed" else "loopback")
    lines = [f"{m.get('world_size')} ranks on {m.get('nodes')} node(s), {net}, "
             f"{m.get('host_cores')} host cores"]
    if summary["comm"]:
        lines.append(f"{'op':<15}{'group':<7}{'p':>3}{'nodes':>6}{'conc':>5}{'nbytes':>10}"
                     f"{'time_ms':>10}{'algbw_Gbps':>11}{'busbw_Gbps':>11}")
        for r in summary["comm"]:
            lines.append(f"{r['op']:<15}{r['group']:<7}{r['group_size']:>3}{r['nodes']:>6}"
                         f"{r['concurrent_groups']:>5}{r['nbytes']:>10}"
                         f"{r['time_s'] * 1e3:>10.3f}{r['algbw_Gbps']:>11.3f}"
                         f"{r['busbw_Gbps']:>11.3f}")
    if summary["compute"]:
        lines.append(f"{'phase':<10}{'conc':>5}{'flops':>10}{'h x f':>11}{'time_ms':>10}"
                     f"{'GFLOP/s':>9}")
        for r in summary["compute"]:
            lines.append(f"{r['phase']:<10}{r['concurrent']:>5}{r['flops']:>10.3g}"
                         f"{str(r['hidden']) + 'x' + str(r['ffn_hidden']):>11}"
                         f"{r['time_s'] * 1e3:>10.3f}{r['gflops_per_s']:>9.2f}")
    if summary["checks"]:
        lines.append(f"{'p':>3}{'nodes':>6}{'ar_off_us':>11}{'ar_detail_us':>13}"
                     f"{'check_us':>10}{'mbarrier_us':>12}{'ag_tiny_us':>11}")
        for r in summary["checks"]:
            lines.append(
                f"{r['group_size']:>3}{r['nodes']:>6}"
                f"{r.get('all_reduce_tiny_off_s', 0) * 1e6:>11.0f}"
                f"{r.get('all_reduce_tiny_detail_s', 0) * 1e6:>13.0f}"
                f"{r.get('detail_check_s', 0) * 1e6:>10.0f}"
                f"{r.get('monitored_barrier_s', 0) * 1e6:>12.0f}"
                f"{r.get('all_gather_tiny_s', 0) * 1e6:>11.0f}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# command line


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
              sizes: str, ops: str, groups: str, iters: int, flops: str, check_iters: int,
              timeout_s: float, prefix: str = DEFAULT_PREFIX, sets: Sequence[str] = (),
              rate_Gbps: float | None = None) -> dict[str, Any]:
    """Run the bench (locally or on the testbed), summarise it; raises BenchError/TestbedError."""
    if iters < 1:
        raise BenchError(f"--iters: must be >= 1, got {iters}")
    if check_iters < 0:
        raise BenchError(f"--check-iters: must be >= 0, got {check_iters}")
    scn = _scenario(scenario, sets)
    hidden, ffn = (scn.model.hidden, scn.model.ffn_hidden) if scn else (256, 1024)
    ops, groups = parse_names(ops, OPS, "ops"), parse_names(groups, GROUP_KINDS, "groups")
    size_list, flops_list = parse_sizes(sizes), parse_flops(flops)
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
                       check_iters=check_iters, timeout_s=timeout_s)
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
    (out / SUMMARY).write_text(json.dumps(summary, indent=1) + "\n")
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
@click.option("--sizes", default="4K,64K,512K,2M", show_default=True,
              help="message sizes (full buffer)")
@click.option("--ops", default="all_gather,reduce_scatter,all_reduce", show_default=True)
@click.option("--groups", default="intra,inter,world", show_default=True)
@click.option("--iters", type=int, default=8, show_default=True)
@click.option("--flops", default="1e5,1e6,1e7,1e8", show_default=True,
              help="forward FLOPs of the compute block ('' = skip)")
@click.option("--check-iters", type=int, default=10, show_default=True,
              help="repetitions of the debug-check benchmark (0 = skip)")
@click.option("--quick", is_flag=True, help="a few sizes and repetitions (smoke test)")
@click.option("--timeout-s", type=float, default=300.0, show_default=True)
@click.option("--prefix", default=DEFAULT_PREFIX, show_default=True, help="testbed name prefix")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="override a scenario value, e.g. cluster.nodes=4")
@click.option("--rate-Gbps", "rate_Gbps", type=float, default=None,
              help="testbed link rate per node (default: the scenario's)")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
def bench_command(scenario: str | None, out: str, nproc: int | None, use_testbed: bool,
                  sizes: str, ops: str, groups: str, iters: int, flops: str, check_iters: int,
                  quick: bool, timeout_s: float, prefix: str, sets: tuple[str, ...],
                  rate_Gbps: float | None, as_json: bool) -> None:
    """Collective (all-gather, reduce-scatter, all-reduce), compute and debug-check benchmarks,
    written as simfed traces."""
    if quick:  # smaller defaults; options given explicitly still win
        ctx = click.get_current_context()

        def default(name: str) -> bool:
            return ctx.get_parameter_source(name) is click.core.ParameterSource.DEFAULT

        sizes = str(QUICK["sizes"]) if default("sizes") else sizes
        flops = str(QUICK["flops"]) if default("flops") else flops
        iters = int(QUICK["iters"]) if default("iters") else iters
        check_iters = int(QUICK["check_iters"]) if default("check_iters") else check_iters
    try:
        summary = run_bench(scenario=scenario, out=Path(out), nproc=nproc, testbed=use_testbed,
                            sizes=sizes, ops=ops, groups=groups, iters=iters, flops=flops,
                            check_iters=check_iters, timeout_s=timeout_s, prefix=prefix,
                            sets=sets, rate_Gbps=rate_Gbps)
    except (BenchError, TestbedError, SpecError) as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from None
    click.echo(json.dumps(summary, indent=1) if as_json else format_summary(summary))
    click.echo(f"traces: {out}/{TRACE_GLOB}; summary: {out}/{SUMMARY}", err=True)
