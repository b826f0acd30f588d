"""Calibrating the NCCL model from a cluster's own nccl-tests output.

`read_nccl_tests(path)` parses nccl-tests' standard stdout (all_reduce_perf, all_gather_perf,
reduce_scatter_perf, ...): the header (`# nThread .. nGpus ..`, the `#  Rank  r ... on HOST
device d [..] GPU` lines that give the ranks and the nodes, the NCCL version from `# nccl-tests
version .. nccl-library=CODE` or NCCL_DEBUG's `NCCL version X.Y.Z`, the collective from `#
Collective test starting: NAME` or the file name) and the table, whose column header names the
columns (size, count, type, redop, [root,] time, algbw, busbw, #wrong|error, then in-place).
The out-of-place bus bandwidth is used. Malformed input is a one-line error naming the file and
line.

`fit_curves(samples)` fits, per (collective, NCCL's choice "algorithm/protocol" as the model
picks it, domain: intra = one node, inter = several), a bandwidth efficiency c(size) relative to
the model: predicted busbw = S x busfactor / (latency + S / (algbw x c(S))), with NCCL's own
latency kept. c is piecewise-linear in log2(size) with a knot at every power of 4 from 1 MiB
(`KNOTS`) over the sizes the samples cover, non-decreasing there, within [C_MIN, C_MAX]; it
minimises the squared log busbw errors of the samples from `MIN_BYTES` up plus RIDGE x sum
(c_k - 1)^2 (a knot between samples leans to 1). Past the largest sample the curve returns to 1
at the next knot (no sample constrains it: large sizes keep NCCL's bandwidth); below the smallest
it holds its first value. The result is
`runtime.comm.nccl_bw_curve`, which `simfed.collectives.nccl.NcclModel.best` applies.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..spec.ops import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER
from ..spec.schema import SpecError
from ..spec.yamlio import MAX_DATA_BYTES, read_text

MIN_BYTES = 1 << 20
# knots of the efficiency curve: every power of 4 from 1 MiB to 16 GiB (nccl-tests' usual -e 8G
# ends inside the last interval)
KNOTS = tuple(float(1 << (20 + 2 * k)) for k in range(8))
C_MIN, C_MAX = 0.05, 1.2  # the curve's range (C_MAX: the 0..1.2)
MAX_SIZE = 1 << 50  # 1 PiB: far above any buffer nccl-tests runs
ROW_TOL = 0.05  # a table row's algbw against size / time, and busbw / algbw against the op's
RIDGE = 1e-3  # pull of an unconstrained knot toward 1 (a sample's squared log error weighs 1)

# nccl-tests binaries: all_reduce_perf, all_gather_perf, reduce_scatter_perf (also their _mpi
# builds); other collectives (broadcast, reduce, alltoall, sendrecv) are not modelled
_OPS = {"all_reduce": ALL_REDUCE, "allreduce": ALL_REDUCE, "all_gather": ALL_GATHER,
        "allgather": ALL_GATHER, "reduce_scatter": REDUCE_SCATTER,
        "reducescatter": REDUCE_SCATTER}
_RANK = re.compile(r"^#?\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+"
                   r"(\d+)\s+\[[^\]]*\]\s*(.*)$")
_LIB = re.compile(r"nccl-library=(\d+)")
_NCCL_VERSION = re.compile(r"NCCL version (\d+)\.(\d+)\.(\d+)")
_TEST = re.compile(r"Collective test starting:\s*(\S+)")
# mpirun --tag-output's "[1,0]<stdout>:" and "[0]" prefixes on every line
_TAG = re.compile(r"^\[\d+(?:,\d+)?\](?:<std(?:out|err)>:)?\s?")


@dataclass(frozen=True)
class NcclTestsRow:
    """One out-of-place row of an nccl-tests table."""

    op: str
    nbytes: int
    time_us: float
    algbw_GBps: float
    busbw_GBps: float
    ranks: int
    nodes: int
    gpu: str
    nccl_version: str | None  # "2.18.5", None if the output does not say
    source: str  # file:line


_GPU_MODEL = re.compile(r"(?<![a-z0-9])((?:gb|gh|[abhlv])[0-9]{2,3})(?![0-9])")


def gpu_models(name: str) -> set[str]:
    """GPU model tokens of a name: {"h100"} for "NVIDIA H100 80GB HBM3" and "H100-SXM-80GB"."""
    return set(_GPU_MODEL.findall(name.lower()))


def _op_from_text(text: str) -> str | None:
    low = text.lower()
    for key in sorted(_OPS, key=len, reverse=True):
        if key in low:
            return _OPS[key]
    return None


def _version_from_code(code: int) -> str:
    """NCCL_VERSION_CODE: major x 10000 + minor x 100 + patch from 2.9, x 1000 + x 100 before."""
    if code >= 20900:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


class _Run:
    def __init__(self) -> None:
        self.hosts: dict[int, str] = {}
        self.gpu = ""
        self.version: str | None = None
        self.op: str | None = None
        self.cols: dict[str, int] | None = None
        self.ncols = 0
        self.rows: list[tuple[int, int, float, float, float]] = []  # line, size, t, alg, bus
        self.wrong = 0  # rows with #wrong > 0, skipped


def read_nccl_tests(path: Path, op: str | None = None) -> list[NcclTestsRow]:
    """Every out-of-place row of every run in an nccl-tests stdout file."""
    text = read_text(path, "calibrate", MAX_DATA_BYTES)
    name_op = op or _op_from_text(path.name)
    runs: list[_Run] = []
    pending: dict[str, str] = {}
    cur: _Run | None = None

    def bad(lineno: int, what: str) -> SpecError:
        return SpecError(f"{path}:{lineno}: {what}")

    for lineno, raw in enumerate(text.splitlines(), 1):
        line = _TAG.sub("", raw.strip())
        if not line:
            continue
        body = line.lstrip("#").strip()
        m = _TEST.search(body)
        if m:
            pending["op"] = m.group(1)
            continue
        m = _LIB.search(body)
        if m and "nccl-tests version" in body:
            pending["version"] = _version_from_code(int(m.group(1)))
            continue
        if body.startswith("nThread"):
            cur = _Run()
            cur.version = pending.pop("version", None)
            if "op" in pending:
                test = pending.pop("op")
                if _op_from_text(test) is None:
                    raise bad(lineno, f"collective test {test!r} is not modelled (all_reduce, "
                                      "all_gather, reduce_scatter are)")
                cur.op = _op_from_text(test)
            runs.append(cur)
            continue
        m = _NCCL_VERSION.search(body)
        if m:  # NCCL_DEBUG=INFO/VERSION: the library that ran
            v = ".".join(m.groups())
            if cur is not None:
                cur.version = v
            else:
                pending["version"] = v
            continue
        m = _RANK.match(line)
        if m:
            if cur is None:
                cur = _Run()
                runs.append(cur)
            cur.hosts[int(m.group(1))] = m.group(2)
            cur.gpu = cur.gpu or m.group(4).strip()
            continue
        toks = body.split()
        if "busbw" in toks and ("size" in toks or "bytes" in toks):  # the column header
            if cur is None:
                cur = _Run()
                runs.append(cur)
            cols: dict[str, int] = {}
            for i, t in enumerate(toks):
                cols.setdefault(t, i)  # the first time/algbw/busbw: out-of-place
            for need in ("time", "algbw", "busbw"):
                if need not in cols:
                    raise bad(lineno, f"column header without {need!r}")
            cur.cols, cur.ncols = cols, len(toks)
            continue
        if line.startswith("#") or not toks[0].isdigit():
            continue  # other comments, NCCL INFO logs, prompts
        if cur is None or cur.cols is None:
            raise bad(lineno, "a table row before the column header (size count type ... "
                              "time algbw busbw)")
        if len(toks) < max(cur.cols["time"], cur.cols["algbw"], cur.cols["busbw"]) + 1:
            raise bad(lineno, f"{len(toks)} columns, the header has {cur.ncols}: {line[:60]!r}")
        try:
            size = int(toks[cur.cols.get("size", cur.cols.get("bytes", 0))])
            t_us = float(toks[cur.cols["time"]])
            alg = float(toks[cur.cols["algbw"]])
            bus = float(toks[cur.cols["busbw"]])
        except ValueError:
            raise bad(lineno, f"expected numbers in the size/time/algbw/busbw columns: "
                              f"{line[:60]!r}") from None
        if not all(math.isfinite(x) and x >= 0 for x in (t_us, alg, bus)):
            raise bad(lineno, f"time {t_us}, algbw {alg}, busbw {bus}: expected finite, >= 0")
        if size > MAX_SIZE:
            raise bad(lineno, f"size {size} B: expected at most {MAX_SIZE:,} B")
        # algbw is size / time (GB/s, two decimals: checked from 1 GB/s, where rounding is
        # under 1%); a row where they disagree was damaged
        if alg >= 1.0 and not (t_us > 0 and abs(size / (t_us * 1e3) / alg - 1) <= ROW_TOL):
            raise bad(lineno, f"size {size} B in {t_us} us is not the algbw {alg} GB/s it "
                              f"prints: a damaged row {line[:60]!r}")
        wrong = cur.cols.get("#wrong")
        if wrong is not None and len(toks) > wrong and toks[wrong].isdigit() \
                and int(toks[wrong]):
            cur.wrong += 1  # nccl-tests found wrong results: its timing is not used
            continue
        cur.rows.append((lineno, size, t_us, alg, bus))

    out: list[NcclTestsRow] = []
    for run in runs:
        if not run.rows:
            continue
        first = run.rows[0][0]
        if not run.hosts:
            raise bad(first, "no '#  Rank  r ... on HOST device d' lines before the table: "
                             "cannot tell how many GPUs and nodes ran it")
        ranks = len(run.hosts)
        nodes = len(set(run.hosts.values()))
        if ranks < 2:
            raise bad(first, "one rank: no collective to calibrate from")
        op_here = run.op or name_op
        ratio = [bus / alg for _, _, _, alg, bus in run.rows if alg > 0.5 and bus > 0]
        if op_here is None:
            if ratio and abs(statistics.median(ratio) / (2 * (ranks - 1) / ranks) - 1) < 0.02:
                op_here = ALL_REDUCE
            else:
                raise bad(first, "which collective? the output does not say (no '# Collective "
                                 "test starting' line) and the file name names none of "
                                 "all_reduce, all_gather, reduce_scatter")
        want = 2 * (ranks - 1) / ranks if op_here == ALL_REDUCE else (ranks - 1) / ranks
        if ratio and abs(statistics.median(ratio) / want - 1) > 0.05:
            raise bad(first, f"busbw / algbw is {statistics.median(ratio):.3f}, but {op_here} "
                             f"over {ranks} ranks gives {want:.3f}: wrong collective or rank "
                             "count")
        for lineno, size, t_us, alg, bus in run.rows:
            if alg >= 1.0 and abs(bus / alg / want - 1) > ROW_TOL:
                raise bad(lineno, f"busbw / algbw is {bus / alg:.4g}, but {op_here} over "
                                  f"{ranks} ranks gives {want:.3f}: a damaged row")
            out.append(NcclTestsRow(op_here, size, t_us, alg, bus, ranks, nodes, run.gpu,
                                    run.version, f"{path}:{lineno}"))
    if not out:
        skipped = sum(r.wrong for r in runs)
        why = f" ({skipped} rows with #wrong > 0 skipped)" if skipped else ""
        raise SpecError(f"{path}: no nccl-tests table rows found (expected the standard "
                        f"'size count type redop ... time algbw busbw' table){why}")
    return out


# ---------------------------------------------------------------------------------------------
# the fit


@dataclass(frozen=True)
class CurveSample:
    """A measured bus bandwidth beside the uncalibrated model's parts at that size."""

    op: str
    choice: str  # "algorithm/protocol", NCCL's pick by its own cost model
    domain: str  # intra | inter
    nbytes: float
    latency_s: float
    algbw_Bps: float  # the model's algorithm bandwidth of that choice
    bus_factor: float
    measured_GBps: float
    source: str = ""

    def predicted_GBps(self, factor: float = 1.0) -> float:
        t = self.latency_s + self.nbytes / (self.algbw_Bps * factor)
        return self.nbytes / t * self.bus_factor / 1e9


def curve_samples(model, rows: list[tuple[str, int, float, int, int, str]]) -> list[CurveSample]:
    """(op, size bytes, measured busbw GB/s, ranks, nodes, source) -> samples against `model`
    (an NcclModel; its own curve, if any, is not used: the fit is relative to NCCL's model)."""
    from dataclasses import replace

    from ..collectives.nccl import bus_factor

    bare = replace(model, bw_curve=None)
    out = []
    for op, size, bus, ranks, nodes, src in rows:
        ch = bare.nccl_choice(op, size, ranks, nodes)
        out.append(CurveSample(op, f"{ch.algorithm}/{ch.protocol}",
                               "intra" if nodes <= 1 else "inter", float(size), ch.latency_s,
                               ch.algbw_Bps, bus_factor(op, ranks), float(bus), src))
    return out


def _interp_weights(nbytes: float) -> list[tuple[int, float]]:
    """The curve value at nbytes as (knot index, weight) pairs (held beyond the ends)."""
    x = math.log2(nbytes)
    xs = [math.log2(k) for k in KNOTS]
    if x <= xs[0]:
        return [(0, 1.0)]
    if x >= xs[-1]:
        return [(len(xs) - 1, 1.0)]
    i = max(j for j in range(len(xs)) if xs[j] <= x)
    w = (x - xs[i]) / (xs[i + 1] - xs[i])
    return [(i, 1.0 - w), (i + 1, w)]


def _fit_one(samples: list[CurveSample]) -> list[list[float]]:
    """The knots [size bytes, factor] of one group's curve: the knots whose interval holds a
    sample (non-decreasing, fitted), then one knot back at 1 past the largest sample; below the
    smallest the first knot's value holds (`simfed.collectives.nccl.curve_value`)."""
    import numpy as np
    from scipy.optimize import minimize

    weights = [[(i, w) for i, w in _interp_weights(s.nbytes) if w > 0] for s in samples]
    used = sorted({i for ws in weights for i, _ in ws})
    i0, i1 = used[0], used[-1]
    k = i1 - i0 + 1
    wmat = np.zeros((len(samples), k))  # curve value at each sample = wmat @ knot values
    for row, ws in enumerate(weights):
        for i, w in ws:
            wmat[row, i - i0] += w
    size = np.array([s.nbytes for s in samples])
    lat = np.array([s.latency_s for s in samples])
    alg = np.array([s.algbw_Bps for s in samples])
    bus = np.array([s.bus_factor for s in samples])
    meas = np.log([s.measured_GBps for s in samples])

    def objective(v):
        pred = np.log(size / (lat + size / (alg * (wmat @ v))) * bus / 1e9)
        return float(np.sum((pred - meas) ** 2) + RIDGE * np.sum((v - 1.0) ** 2))

    cons = [{"type": "ineq", "fun": (lambda v, j=j: v[j + 1] - v[j])} for j in range(k - 1)]
    res = minimize(objective, np.ones(k), method="SLSQP", bounds=[(C_MIN, C_MAX)] * k,
                   constraints=cons, options={"maxiter": 500, "ftol": 1e-12})
    v = np.maximum.accumulate(np.clip(res.x, C_MIN, C_MAX))  # exactly non-decreasing
    knots = [[int(KNOTS[i0 + j]), round(float(x), 4)] for j, x in enumerate(v)]
    if i1 + 1 < len(KNOTS) and knots[-1][1] != 1.0:  # no sample there: NCCL's bandwidth
        knots.append([int(KNOTS[i1 + 1]), 1.0])
    return knots


def fit_curves(samples: list[CurveSample], min_bytes: int = MIN_BYTES
               ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(runtime.comm.nccl_bw_curve, report) from samples; rows below min_bytes are not used."""
    groups: dict[tuple[str, str, str], list[CurveSample]] = {}
    for s in samples:
        if s.nbytes >= min_bytes and s.measured_GBps > 0:
            groups.setdefault((s.op, s.choice, s.domain), []).append(s)
    curves: dict[str, Any] = {}
    report: dict[str, Any] = {"knots_bytes": [int(k) for k in KNOTS], "min_bytes": min_bytes,
                              "groups": {}}
    for (op, choice, dom), sel in sorted(groups.items()):
        knots = _fit_one(sel)
        before = [s.predicted_GBps() / s.measured_GBps - 1 for s in sel]
        after = [s.predicted_GBps(_value(knots, s.nbytes)) / s.measured_GBps - 1 for s in sel]
        at_bound = [k for k, c in knots if c in (C_MIN, C_MAX)]
        report["groups"][f"{op} {choice} {dom}"] = {
            "n": len(sel), "knots": knots, "at_bound": at_bound,
            "median_abs_error_before": statistics.median(map(abs, before)),
            "median_abs_error_after": statistics.median(map(abs, after)),
            "worst_error_after": max(after, key=abs),
            "rows": [{"size_bytes": int(s.nbytes), "measured_GBps": s.measured_GBps,
                      "model_GBps": s.predicted_GBps(),
                      "calibrated_GBps": s.predicted_GBps(_value(knots, s.nbytes)),
                      "source": s.source} for s in sel]}
        if any(abs(c - 1.0) > 1e-4 for _, c in knots):
            curves.setdefault(op, {}).setdefault(choice, {})[dom] = knots
    return curves, report


def _value(knots, nbytes: float) -> float:
    from ..collectives.nccl import curve_value

    return curve_value(knots, nbytes)


# ---------------------------------------------------------------------------------------------
# calibrate's hook


def is_nccl_tests_file(path: Path) -> bool:
    """A text file whose head (4 MiB: NCCL_DEBUG=INFO logs can come first) looks like nccl-tests
    stdout."""
    if path.suffix.lower() in (".json", ".jsonl", ".gz", ".yaml", ".yml"):
        return False
    try:
        with path.open("r", encoding="utf-8", errors="replace") as fh:
            head = fh.read(4 << 20)
    except OSError:
        return False
    return ("nThread" in head and "busbw" in head) or ("algbw" in head and "busbw" in head)


def apply_to_profile(scn, rows: list[NcclTestsRow], profile: dict[str, Any],
                     report: dict[str, Any]) -> None:
    """Fit the curves of `rows` against the scenario's NCCL model (at the NCCL version the
    output names) and write runtime.comm.nccl_bw_curve (+ model: nccl, the version) with
    provenance into the profile, the fit into report["nccl_tests"]."""
    if not rows:
        return
    from dataclasses import replace

    from ..collectives.nccl import nccl_model
    from ..hardware import Hardware

    q_max = scn.cluster.node.gpus
    for r in rows:
        if r.ranks // max(r.nodes, 1) > q_max or r.ranks % max(r.nodes, 1):
            raise SpecError(f"{r.source}: {r.ranks} ranks on {r.nodes} nodes, but the "
                            f"scenario's nodes have {q_max} GPUs each (ranks per node must be "
                            "a whole number within it)")
    want = gpu_models(scn.cluster.node.gpu.name)
    for r in rows:
        got = gpu_models(r.gpu)
        if want and got and not want & got:
            raise SpecError(f"{r.source}: measured on {r.gpu}, but the scenario's GPU is "
                            f"{scn.cluster.node.gpu.name}: calibrate a scenario of that GPU")
    versions = {".".join(r.nccl_version.split(".")[:2]) for r in rows if r.nccl_version}
    if len(versions) > 1:
        raise SpecError(f"calibrate: the nccl-tests outputs ran NCCL {', '.join(sorted(versions))}"
                        ": calibrate one release at a time")
    base = nccl_model(Hardware.from_spec(scn.cluster, scn.runtime), scn.runtime.comm)
    version = versions.pop() if versions else base.version
    model = replace(base, version=version)
    samples = curve_samples(model, [(r.op, r.nbytes, r.busbw_GBps, r.ranks, r.nodes, r.source)
                                    for r in rows])
    curves, rep = fit_curves(samples)
    files = sorted({r.source.rsplit(":", 1)[0] for r in rows})
    rep["files"], rep["nccl_version"] = files, version
    report["nccl_tests"] = rep
    runtime = profile.setdefault("runtime", {})
    comm = runtime.setdefault("comm", {})
    prov = runtime.setdefault("provenance", {})
    comm["model"] = "nccl"
    prov["runtime.comm.model"] = "nccl-tests outputs calibrate the NCCL model"
    if version != scn.runtime.comm.nccl_version:
        comm["nccl_version"] = version
        prov["runtime.comm.nccl_version"] = f"the NCCL the nccl-tests outputs ran ({files[0]})"
    comm["nccl_bw_curve"] = curves
    used = [g for g in rep["groups"].values()]
    n = sum(g["n"] for g in used)
    prov["runtime.comm.nccl_bw_curve"] = (
        f"fitted (nccl-tests out-of-place busbw from {MIN_BYTES >> 20} MiB, n={n}, groups "
        + "; ".join(f"{k}: median |error| {g['median_abs_error_before']:.1%} -> "
                    f"{g['median_abs_error_after']:.1%}"
                    + (f", AT BOUND {C_MIN}..{C_MAX} at {g['at_bound']} B (the model is far "
                       "from this fabric: check the cluster file)" if g["at_bound"] else "")
                    for k, g in rep["groups"].items())
        + f") from {', '.join(files)}")
