"""Published measurements: predict each case of `validation/published/` and compare tokens/s/GPU.

Each case is a scenario (one FSDP-family algorithm) with the throughput its source published;
`cases.yaml` names the scenario, the published number, its source and whether the case is in the
fit set (numbers may be checked against it while the model is built) or the check set (held
back: reported, never iterated on). The summary gives the median and worst |error| of each set.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..spec.schema import SpecError
from . import published_files as files
from .claim_bands import BANDS_FROM, check_bands, comm_share, validate_bands
from .claim_bands import round_up as _round_up
from .micro_batch import print_sweeps, sweeps

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "validation" / "published"
SETS = ("fit", "check")


@functools.lru_cache(maxsize=4)
def _read_unchanged(path: str, mtime_ns: int, size: int) -> dict[str, Any]:
    return files.read(Path(path))


def _read_cases_file(path: Path) -> dict[str, Any]:
    """cases.yaml as `published_files.read` parses it, parsed once while the file is unchanged
    (its cases, claims and hybrid_over_full are read by validation, `simfed run`'s how-sure lines
    and --robustness alike); callers copy what they hand out."""
    try:
        st = path.stat()
    except OSError:
        return files.read(path)  # its one-line error
    return _read_unchanged(str(path), st.st_mtime_ns, st.st_size)


def load_cases(folder: Path = DEFAULT_DIR) -> list[dict[str, Any]]:
    """cases.yaml's entries, checked; a scale study (cases sharing `study`) lies wholly in the
    fit set or wholly in the check set, on one scenario."""
    path = folder / "cases.yaml"
    cases = copy.deepcopy(files.entries(path, _read_cases_file(path), "cases",
                                        files.PublishedRun))
    first: dict[str, dict[str, Any]] = {}
    for i, c in enumerate(cases):
        if not c.get("study"):
            continue
        f = first.setdefault(c["study"], c)
        for key in ("set", "scenario"):
            if c[key] != f[key]:
                raise SpecError(f"{path}: cases[{i}].{key}: {c[key]!r}, but study "
                                f"{c['study']!r} began with {f[key]!r} ({f['name']}): a scale "
                                f"study is split whole")
    return cases


CLAIM_NUMBERS = ("median_abs_error", "p90_abs_error", "worst_abs_error", "memory_headroom_min",
                 "memory_cases", "memory_median_abs_error", "memory_worst_abs_error")
WIDEN_KEYS = ("per_gpu_doubling", "framework", "gpu_type", "memory_headroom")


def load_claims(folder: Path = DEFAULT_DIR) -> dict[str, Any]:
    """What the check set's errors give (cases.yaml `claims`, as `derive_claims` computes them
    and tests/test_published.py holds them): median_abs_error, p90_abs_error (9 in 10 of the
    check runs within it), worst_abs_error, memory_headroom_min and `widen` (what each factor a
    scenario has outside the validated runs adds to the 9-in-10 bound)."""
    path = folder / "cases.yaml"
    claims = copy.deepcopy(_read_cases_file(path).get("claims") or {})
    if not isinstance(claims, dict):
        raise SpecError(f"{path}: claims: expected a mapping, got {claims!r}")
    widen = claims.get("widen") or {}
    if not isinstance(widen, dict):
        raise SpecError(f"{path}: claims.widen: expected a mapping, got {widen!r}")
    for where, table, keys in (("claims", claims, CLAIM_NUMBERS),
                               ("claims.widen", widen, WIDEN_KEYS)):
        for key in keys:
            v = table.get(key)
            if key in table and (isinstance(v, bool) or not isinstance(v, int | float)
                                 or v != v):
                raise SpecError(f"{path}: {where}.{key}: expected a number, got {v!r}")
    for name in BANDS_FROM:
        validate_bands(path, name, claims.get(name) or [])
    return claims


def derive_claims(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The "how sure" numbers from the CHECK set's errors (never the fit set's), each rounded up
    to 0.1%:
    - median_abs_error, worst_abs_error of the check runs; p90_abs_error: the smallest of their
      |errors| that at least 9 in 10 of them lie within;
    - memory_headroom_min: the least headroom (1 - predicted peak / capacity) of the validated
      runs (fit and check) the memory model says fit: below it a scenario is outside them;
    - widen.per_gpu_doubling: the check scale studies' median |predicted - published loss|
      per doubling of GPUs (what each doubling beyond the validated GPU counts adds);
    - widen.framework: the largest distance between one framework's median signed error and
      the median signed error of all check runs (what running another framework adds);
    - widen.gpu_type: the same over the GPU types the check runs ran (`gpu_type`, the cluster
      file's GPU name: what a GPU no validated run had adds);
    - widen.memory_headroom: the check set's median |error| once more (what an unvalidated
      memory regime adds);
    - by_comm_share, by_gpus: the same median and bound over the check runs at or above each
      communication share (`comm_share`) and each GPU count (`check_bands`, BANDS_FROM);
    - memory_cases, memory_median_abs_error, memory_worst_abs_error: the check runs whose source
      gives their peak memory, and how far the predicted peak ran from it (absent without one)."""
    check = [r for r in rows if r["set"] == "check"]
    if not check:
        raise SpecError("validate --published: no check case to derive the claims from")
    errs = sorted(abs(r["error"]) for r in check)
    k = math.ceil(0.9 * len(errs))
    signed = statistics.median(r["error"] for r in check)
    fw, gpu = (max(abs(g["median_error"] - signed) for g in by_group(check, key))
               for key in ("framework", "gpu_type"))
    per_doubling = [abs(x["difference"]) / math.log2(x["gpus"][1] / x["gpus"][0])
                    for x in scale_losses(check) if x["gpus"][1] > x["gpus"][0]]
    fits = [1.0 - r["peak_memory_GiB"] / r["capacity_GiB"] for r in rows if r["fits_memory"]]
    m = memory_summary(check).get("check")
    memory = {"memory_cases": m["cases"],
              "memory_median_abs_error": _round_up(m["median_abs_error"]),
              "memory_worst_abs_error": _round_up(abs(m["worst"]["error"]))} if m else {}
    return {"check_cases": len(check),
            "median_abs_error": _round_up(statistics.median(errs)),
            "p90_abs_error": _round_up(errs[k - 1]),
            "worst_abs_error": _round_up(errs[-1]),
            "memory_headroom_min": (math.floor(min(fits) * 1000) / 1000) if fits else 0.0,
            "widen": {"per_gpu_doubling": _round_up(statistics.median(per_doubling))
                      if per_doubling else 0.0,
                      "framework": _round_up(fw),
                      "gpu_type": _round_up(gpu),
                      "memory_headroom": _round_up(statistics.median(errs))},
            "by_comm_share": check_bands(rows, "comm_share", BANDS_FROM["by_comm_share"]),
            "by_gpus": check_bands(rows, "gpus", BANDS_FROM["by_gpus"]), **memory}


def predict_case(folder: Path, case: dict[str, Any],
                 overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Simulate one case; its first algorithm's tokens/s/GPU against the published number."""
    from ..engine import simulate
    from ..spec import load_scenario

    try:
        scn = load_scenario(folder / case["scenario"],
                            {**(case.get("overrides") or {}), **(overrides or {})})
    except SpecError as exc:
        raise SpecError(f"{folder / 'cases.yaml'}: case {case['name']}: {exc}") from None
    out, _ = simulate(scn, algorithms=[scn.algorithms[0].name])
    r = out["algorithms"][0]
    pub = float(case["published_tokens_per_s_per_gpu"])
    t = scn.training
    # what the run timed: its steps, or the host's step call (training.throughput_timer)
    pred = float(r.get("timed_tokens_per_s_per_gpu", r["tokens_per_s_per_gpu"]))
    peak = r["peak_memory_bytes"] / 2**30
    pub_mem = case.get("published_peak_memory_GiB")
    return {
        "name": case["name"], "set": case["set"], "gpu": case.get("gpu", ""),
        "study": case.get("study") or "", "framework": framework(case, scn),
        "gpus": scn.cluster.world, "model": scn.model.name,
        "gpu_type": scn.cluster.node.gpu.name,
        "published": pub, "predicted": pred, "error": pred / pub - 1.0,
        "fits_memory": bool(r["fits"]), "peak_memory_GiB": peak,
        "published_memory_GiB": pub_mem,
        "memory_error": peak / float(pub_mem) - 1.0 if pub_mem else None,
        "capacity_GiB": r["memory_capacity_bytes"] / 2**30,
        "mfu": r["mfu"], "exposed_comm_s": r["exposed_comm_s"], "step_time_s": r["step_time_s"],
        "comm_share": comm_share(scn, r),
        "scenario": case["scenario"], "micro_batch": t.micro_batch,
        "tokens_per_gpu_step": t.micro_batch * t.seq_len * t.grad_accum,
        "sweep": _sweep_key(case["scenario"], scn),
        "algorithm": scn.algorithms[0].name, "pair": _pair_key(scn),
    }


def _pair_key(scn: Any) -> str:
    """What a HYBRID_SHARD case shares with the FULL_SHARD case of the same run (machine, model,
    GPU count, training and runtime): the resolved scenario without its name, description and
    algorithms."""
    spec = dataclasses.asdict(scn)
    for key in ("name", "description", "algorithms"):
        spec.pop(key, None)
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _sweep_key(scenario: str, scn: Any) -> str:
    """What a case shares with the cases that differ from it only in their micro-batch: its
    scenario file and the resolved scenario without `training.micro_batch`."""
    spec = dataclasses.asdict(scn)
    spec["training"].pop("micro_batch", None)
    return scenario + ":" + hashlib.sha256(
        json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def framework(case: dict[str, Any], scn: Any) -> str:
    """The code a published run ran: its `framework`, else PyTorch FSDP of the scenario's
    training.fsdp_version."""
    return case.get("framework") or f"pytorch-fsdp{scn.training.fsdp_version}"


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, sel in (("all", rows), *((s, [r for r in rows if r["set"] == s]) for s in SETS)):
        if not sel:
            continue
        errs = [abs(r["error"]) for r in sel]
        worst = max(sel, key=lambda r: abs(r["error"]))
        out[name] = {"cases": len(sel), "median_abs_error": statistics.median(errs),
                     "worst": {"name": worst["name"], "error": worst["error"]},
                     "rejected_by_memory": sum(not r["fits_memory"] for r in sel)}
    return out


def memory_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per set, the runs whose source gives their peak memory: predicted peak against it (the
    count, median |error|, median signed error and the worst run)."""
    out: dict[str, Any] = {}
    for s in SETS:
        sel = [r for r in rows if r["set"] == s and r.get("memory_error") is not None]
        if sel:
            worst = max(sel, key=lambda r: abs(r["memory_error"]))
            out[s] = {"cases": len(sel),
                      "median_abs_error": statistics.median(abs(r["memory_error"]) for r in sel),
                      "median_error": statistics.median(r["memory_error"] for r in sel),
                      "worst": {"name": worst["name"], "error": worst["memory_error"]}}
    return out


def by_group(rows: list[dict[str, Any]], key: str, which: str = "check"
             ) -> list[dict[str, Any]]:
    """Per value of a row's `key` (`framework`, `gpu_type`: the cluster file's GPU name) over
    one set's runs: the count, the median |error| and the median signed error, in order of
    count (what `widen.framework` and `widen.gpu_type` read)."""
    by: dict[str, list[float]] = {}
    for r in rows:
        if r["set"] == which:
            by.setdefault(r.get(key) or "", []).append(r["error"])
    return sorted(({key: k, "cases": len(v),
                    "median_abs_error": statistics.median(abs(e) for e in v),
                    "median_error": statistics.median(v)} for k, v in by.items()),
                  key=lambda x: (-x["cases"], x[key]))


def scale_losses(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per scale study (cases sharing `study`): the throughput per GPU lost from its smallest to
    its largest GPU count, published and predicted (1 - largest / smallest), and their
    difference (predicted - published, in fractions: 0.02 = 2 percentage points)."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("study"):
            by.setdefault(r["study"], []).append(r)
    out = []
    for study, rs in by.items():
        if len(rs) < 2:
            continue
        rs = sorted(rs, key=lambda r: r["gpus"])
        lo, hi = rs[0], rs[-1]
        pub = 1.0 - hi["published"] / lo["published"]
        pred = 1.0 - hi["predicted"] / lo["predicted"]
        out.append({"study": study, "set": lo["set"], "framework": lo.get("framework", ""),
                    "gpus": [lo["gpus"], hi["gpus"]], "published_loss": pub,
                    "predicted_loss": pred, "difference": pred - pub})
    return out


def hybrid_pairs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The published runs that differ only in FSDP's sharding (a HYBRID_SHARD case, `hsdp`, and a
    FULL_SHARD case, `fsdp`, of the same machine, model, GPU count and training): per pair the
    published and predicted ratio of HYBRID's tokens/s/GPU over FULL's and error = predicted /
    published ratio - 1 (positive: the model overstates HYBRID's lead), in GPU-count order."""
    by: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        if r.get("algorithm") in ("hsdp", "fsdp") and r.get("pair"):
            by.setdefault(r["pair"], {}).setdefault(r["algorithm"], r)
    out = []
    for two in by.values():
        if len(two) < 2:
            continue
        h, f = two["hsdp"], two["fsdp"]
        pub, pred = h["published"] / f["published"], h["predicted"] / f["predicted"]
        out.append({"hybrid": h["name"], "full": f["name"], "gpus": h["gpus"],
                    "sets": [h["set"], f["set"]], "published": pub, "predicted": pred,
                    "error": pred / pub - 1.0})
    return sorted(out, key=lambda x: (x["gpus"], x["hybrid"]))


HYBRID_AT_SCALE_GPUS = 128  # where the published HYBRID runs' losses begin (docs/accuracy.md)


def hybrid_band(replicate: int, shard: int, min_gpus: int) -> str | None:
    """The `hybrid_over_full` band of a HYBRID_SHARD plan (its shards times its replicas: the
    GPUs a model copy spans): "at_scale" from `min_gpus`, "below" under it; None for a plan that
    does not both shard and replicate."""
    if replicate <= 1 or shard <= 1:
        return None
    return "at_scale" if replicate * shard >= min_gpus else "below"


def derive_hybrid_over_full(rows: list[dict[str, Any]],
                            min_gpus: int = HYBRID_AT_SCALE_GPUS) -> dict[str, Any]:
    """How far the predicted HYBRID-over-FULL ratio is from the published one, on the pairs below
    `min_gpus` GPUs and at or above it (`hybrid_pairs`): per band the pairs, the median error
    and the one-sided bounds 9 in 10 pairs lie within: `over` (at most this much above: HYBRID's
    lead overstated) and `under` (at most this much below), each rounded up to 0.1% and never
    below 0. Each pair is one fit and one check run where the studies were split alternately,
    so this is not a check-set-only number (the `claims` are)."""
    pairs = hybrid_pairs(rows)
    out: dict[str, Any] = {"min_gpus": min_gpus}
    for band, sel in (("below", [p for p in pairs if p["gpus"] < min_gpus]),
                      ("at_scale", [p for p in pairs if p["gpus"] >= min_gpus])):
        if not sel:
            continue
        e = sorted(p["error"] for p in sel)
        k = math.ceil(0.9 * len(e))
        out[band] = {"pairs": len(e),
                     "median_error": round(statistics.median(e), 3),
                     "over": _round_up(max(0.0, e[k - 1])),
                     "under": _round_up(max(0.0, -e[len(e) - k]))}
    return out


def load_hybrid_over_full(folder: Path = DEFAULT_DIR) -> dict[str, Any]:
    """cases.yaml `hybrid_over_full` (as `derive_hybrid_over_full` computes it; held by
    tests/test_published.py), or {} where the file has none."""
    path = folder / "cases.yaml"
    got = copy.deepcopy(_read_cases_file(path).get("hybrid_over_full") or {})
    if not isinstance(got, dict):
        raise SpecError(f"{path}: hybrid_over_full: expected a mapping, got {got!r}")
    for band in ("below", "at_scale"):
        b = got.get(band)
        if b is None:
            continue
        if not isinstance(b, dict):
            raise SpecError(f"{path}: hybrid_over_full.{band}: expected a mapping, got {b!r}")
        for key in ("over", "under"):
            v = b.get(key)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < 10:
                raise SpecError(f"{path}: hybrid_over_full.{band}.{key}: expected a number "
                                f"from 0 to 10, got {v!r}")
        n = b.get("pairs")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise SpecError(f"{path}: hybrid_over_full.{band}.pairs: expected a count of 1 or "
                            f"more, got {n!r}")
    m = got.get("min_gpus", HYBRID_AT_SCALE_GPUS)
    if isinstance(m, bool) or not isinstance(m, int) or m < 2:
        raise SpecError(f"{path}: hybrid_over_full.min_gpus: expected a GPU count of 2 or more, "
                        f"got {m!r}")
    return got


def collective_cases(folder: Path = DEFAULT_DIR, *, calibrated: bool = False
                     ) -> list[dict[str, Any]]:
    """Published nccl-tests bus bandwidths (`collectives.yaml`: tables and single points) against
    the NCCL model's, one row per published size from 1 MiB (`published_collectives`);
    `calibrated`: the model carrying the size-dependent efficiency fitted on the fit set's rows
    only, as `simfed calibrate` fits it from nccl-tests output (the check rows are held out)."""
    from .published_collectives import compare, fit_set_curves

    path = folder / "collectives.yaml"
    if not path.is_file():
        return []
    return compare(path, curves=fit_set_curves(path)[0]) if calibrated else compare(path)


def shared_fabric_cases(folder: Path = DEFAULT_DIR) -> list[dict[str, Any]]:
    """Collective bandwidths on a fabric shared with other jobs (`shared-fabric.yaml`) with
    `cluster.fabric.shared_bandwidth` on and off (`shared_fabric.compare`)."""
    from .shared_fabric import compare

    path = folder / "shared-fabric.yaml"
    return compare(path) if path.is_file() else []


def allreduce_size_cases(folder: Path = DEFAULT_DIR) -> list[dict[str, Any]]:
    """Leonardo's NCCL all-reduce by message size (`leonardo-allreduce.yaml`) with the trees'
    latency per level beyond a leaf switch on and off (`shared_fabric.sizes`)."""
    from .shared_fabric import sizes

    path = folder / "leonardo-allreduce.yaml"
    return sizes(path) if path.is_file() else []


def speedup_cases(folder: Path = DEFAULT_DIR) -> list[dict[str, Any]]:
    """Published speedups of a runtime setting (`speedups.yaml`: float8, torch.compile): both
    runs of each case simulated, the predicted ratio of tokens/s/GPU against the published one;
    error = predicted / published speedup - 1 (the variant's step time error with the
    baseline's taken as exact)."""
    from ..engine import simulate
    from ..spec import load_scenario

    path = folder / "speedups.yaml"
    if not path.is_file():
        return []
    cases = files.entries(path, files.read(path), "cases", files.PublishedSpeedup)
    rows = []
    for i, c in enumerate(cases):
        pub = c["published"]
        tps = []
        for which in ("baseline", "variant"):
            try:
                scn = load_scenario(folder / c["scenario"], c[which])
            except SpecError as exc:
                raise files.scenario_error(path, "cases", i, c, exc) from None
            out, _ = simulate(scn, algorithms=[scn.algorithms[0].name])
            tps.append(float(out["algorithms"][0]["tokens_per_s_per_gpu"]))
        published = float(pub["variant"]) / float(pub["baseline"])
        predicted = tps[1] / tps[0]
        rows.append({"name": c["name"], "published": published, "predicted": predicted,
                     "error": predicted / published - 1.0,
                     "predicted_tokens_per_s_per_gpu": tps,
                     "published_tokens_per_s_per_gpu": [float(pub["baseline"]),
                                                         float(pub["variant"])]})
    return rows


def validate_published(folder: Path = DEFAULT_DIR, *, only_set: str | None = None,
                       overrides: dict[str, Any] | None = None,
                       echo: Callable[[str], None] | None = None) -> dict[str, Any]:
    rows = []
    for case in load_cases(folder):
        if only_set and case["set"] != only_set:
            continue
        row = predict_case(folder, case, overrides)
        if echo:
            echo(f"  {row['name']}: published {row['published']:,.0f}, predicted "
                 f"{row['predicted']:,.0f} ({100 * row['error']:+.1f}%)")
        rows.append(row)
    claims: dict[str, Any] = {}
    if not only_set and not overrides and any(r["set"] == "check" for r in rows):
        claims = {"claims": derive_claims(rows), "stored_claims": load_claims(folder),
                  "hybrid_over_full": derive_hybrid_over_full(rows),
                  "stored_hybrid_over_full": load_hybrid_over_full(folder)}
    return {"folder": str(folder), "cases": rows, "summary": summarise(rows),
            "scale_losses": scale_losses(rows), "micro_batch_sweeps": sweeps(rows),
            "hybrid_pairs": hybrid_pairs(rows), "by_gpu_type": by_group(rows, "gpu_type"), **claims,
            "memory": memory_summary(rows),
            "collectives": collective_cases(folder), "speedups": speedup_cases(folder),
            "collectives_calibrated": collective_cases(folder, calibrated=True),
            "shared_fabric": shared_fabric_cases(folder),
            "allreduce_sizes": allreduce_size_cases(folder)}


def print_published(res: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    t = Table(title="published FSDP throughputs: predicted vs published tokens/s/GPU")
    for col in ("case", "set", "GPUs", "published", "predicted", "error", "MFU", "memory"):
        t.add_column(col, justify="left" if col in ("case", "set") else "right")
    for r in res["cases"]:
        mem = f"{r['peak_memory_GiB']:.0f}/{r['capacity_GiB']:.0f} GiB" + (
            "" if r["fits_memory"] else " REJECTED")
        t.add_row(r["name"], r["set"], str(r["gpus"]), f"{r['published']:,.0f}",
                  f"{r['predicted']:,.0f}", f"{100 * r['error']:+.1f}%", f"{r['mfu']:.3f}", mem)
    console.print(t)
    if res.get("collectives"):
        from .published_collectives import print_comparison

        print_comparison(res["collectives"], console)
    if res.get("collectives_calibrated"):
        from .published_collectives import print_summary

        print_summary(res["collectives_calibrated"], console,
                      ", calibrated on the fit tables (simfed calibrate)")
    if res.get("shared_fabric"):
        from .shared_fabric import summary_line

        console.print("  shared fabric (shared-fabric.yaml): "
                      + summary_line(res["shared_fabric"]), highlight=False)
    if res.get("allreduce_sizes"):
        from .shared_fabric import sizes_line

        console.print("  all-reduce by size on Leonardo (leonardo-allreduce.yaml): "
                      + sizes_line(res["allreduce_sizes"]), highlight=False)
    if res.get("speedups"):
        print_speedups(res["speedups"], console)
    if res.get("scale_losses"):
        print_scale_losses(res["scale_losses"], console)
    if res.get("micro_batch_sweeps"):
        print_sweeps(res["micro_batch_sweeps"], console)
    for name, s in res["summary"].items():
        console.print(f"  {name}: median |error| {100 * s['median_abs_error']:.1f}% over "
                      f"{s['cases']} cases; worst {s['worst']['name']} "
                      f"{100 * s['worst']['error']:+.1f}%; rejected by the memory model "
                      f"{s['rejected_by_memory']}", highlight=False)
    for name, m in (res.get("memory") or {}).items():
        console.print(f"  peak memory, {name}: predicted against the {m['cases']} runs whose "
                      f"source gives it, median |error| {100 * m['median_abs_error']:.1f}% (signed "
                      f"{100 * m['median_error']:+.1f}%), worst {m['worst']['name']} "
                      f"{100 * m['worst']['error']:+.1f}%", highlight=False)
    if any(r["set"] == "check" for r in res["cases"]) and "claims" in res:
        c, stored = res["claims"], res.get("stored_claims") or {}
        same = {k: stored.get(k) for k in c} == c
        console.print(f"  how sure (from the check set): median {100 * c['median_abs_error']:.1f}"
                      f"%, 9 in 10 within {100 * c['p90_abs_error']:.1f}%, worst "
                      f"{100 * c['worst_abs_error']:.1f}%; "
                      + ("cases.yaml claims agree" if same else
                         "cases.yaml claims differ: write these there (derive_claims)"),
                      highlight=False)
    for name, what, unit in (("by_comm_share", "communication share (check set; collectives "
                              "at line rate over compute)", "{:.1f}x"),
                             ("by_gpus", "GPUs (check set)", "{:,} GPUs")):
        bands = (res.get("claims") or {}).get(name) or []
        if bands:
            console.print(f"  by {what}: " + "; ".join(
                f"{unit.format(b['from'])} or more {b['cases']} runs, median "
                f"{100 * b['median_abs_error']:.1f}%, 9 in 10 within "
                f"{100 * b['p90_abs_error']:.1f}%" for b in bands), highlight=False)
    types = res.get("by_gpu_type") or []
    if types:
        console.print("  by GPU type (check set): " + "; ".join(
            f"{g['gpu_type']} {g['cases']} runs, median {100 * g['median_abs_error']:.1f}% "
            f"(signed {100 * g['median_error']:+.1f}%)" for g in types), highlight=False)
    h = res.get("hybrid_over_full") or {}
    if h.get("at_scale") or h.get("below"):
        same = h == (res.get("stored_hybrid_over_full") or {})
        text = "; ".join(
            f"{b['pairs']} pairs {word} {h['min_gpus']:,} GPUs: median "
            f"{100 * b['median_error']:+.1f}%, 9 in 10 within -{100 * b['under']:.1f}% .. "
            f"+{100 * b['over']:.1f}%"
            for word, b in (("below", h.get("below")), ("from", h.get("at_scale"))) if b)
        console.print("  HYBRID over FULL, predicted over published ratio (hybrid_over_full): "
                      + text + "; " + ("cases.yaml agrees" if same else
                                       "cases.yaml differs: write these there "
                                       "(derive_hybrid_over_full)"), highlight=False)


def print_scale_losses(rows: list[dict[str, Any]], console: Any) -> None:
    from rich.table import Table

    t = Table(title="scale studies: throughput per GPU lost from the smallest to the largest "
                    "GPU count")
    for col in ("study", "set", "GPUs", "published", "predicted", "difference"):
        t.add_column(col, justify="left" if col in ("study", "set") else "right")
    for r in rows:
        t.add_row(r["study"], r["set"], f"{r['gpus'][0]:,} -> {r['gpus'][1]:,}",
                  f"{100 * r['published_loss']:.1f}%", f"{100 * r['predicted_loss']:.1f}%",
                  f"{100 * r['difference']:+.1f} pp")
    console.print(t)
    for name in SETS:
        sel = [abs(r["difference"]) for r in rows if r["set"] == name]
        if sel:
            console.print(f"  scale losses, {name}: median |difference| "
                          f"{100 * statistics.median(sel):.1f} pp over {len(sel)} studies; worst "
                          f"{100 * max(sel):.1f} pp", highlight=False)


def print_speedups(rows: list[dict[str, Any]], console: Any) -> None:
    from rich.table import Table

    t = Table(title="published speedups (float8, torch.compile): predicted vs published "
                    "(and each run's tokens/s/GPU error)")
    for col in ("case", "published", "predicted", "error", "baseline run", "variant run"):
        t.add_column(col, justify="left" if col == "case" else "right")
    for r in rows:
        (pb, pv), (b, v) = r["published_tokens_per_s_per_gpu"], r[
            "predicted_tokens_per_s_per_gpu"]
        t.add_row(r["name"], f"{r['published']:.3f}x", f"{r['predicted']:.3f}x",
                  f"{100 * r['error']:+.1f}%", f"{100 * (b / pb - 1):+.1f}%",
                  f"{100 * (v / pv - 1):+.1f}%")
    console.print(t)
    worst = max(rows, key=lambda r: abs(r["error"]))
    console.print(f"  speedups: median |error| "
                  f"{100 * statistics.median(abs(r['error']) for r in rows):.1f}% over "
                  f"{len(rows)} cases; worst {worst['name']} {100 * worst['error']:+.1f}%",
                  highlight=False)


def scan(folder: Path, key: str, values: list[float], *, only_set: str = "fit",
         gpu: str | None = None) -> list[tuple[float, float, float]]:
    """Median and worst |error| over a set (and GPU type) for each value of one dotted scenario
    key: how a profile constant is fitted on the fit set, never on the check set."""
    cases = [c for c in load_cases(folder) if c["set"] == only_set
             and (gpu is None or c.get("gpu") == gpu)]
    out = []
    for v in values:
        errs = [abs(predict_case(folder, c, {key: v})["error"]) for c in cases]
        out.append((v, statistics.median(errs), max(errs)))
    return out
