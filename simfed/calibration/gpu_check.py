"""The GPU check's comparison (realrun.gpu_check's last stage; simfed's side, no torch): what
the device measured against what the kernel model (simfed.compute) predicts for it.

Reads a results folder written by `python -m realrun.gpu_check`:
- scenario.yaml: the check's scenario (cluster figures of the device, runtime profile);
- micro.json: micro-timings (GEMMs, fused attention, memory-bound kernels);
- calibrated.yaml (optional): `simfed calibrate`'s profile from the run's profiler trace;
- runs.json (optional): realrun's four algorithms' measured step times.
Writes compare.json there: every micro-timing's measured and predicted time (shipped constants,
and calibrated ones when there are), the efficiency it implies next to the constant that
stands for it, per-kind summaries (median measured / predicted, median |error|), the implied
GEMM efficiency against the reduction dimension K and attention's against head dim, and each
run's measured step time against `simfed run` of the same scenario.

What a micro-timing is held against:
- GEMM m x n x k: `ComputeModel.gemm` (FLOPs at gemm_efficiency x tile and wave quantisation,
  never faster than its HBM traffic) plus one kernel gap;
- attention (SDPA, causal): 4 B H S^2 D FLOPs, halved where `causal_skip`, x 2.5 backward, at
  attention_efficiency_forward / _backward, plus one kernel gap;
- memory-bound: the bytes the model charges (copy 2p, add 3p per element; RMSNorm and RoPE by
  `ComputeModel._norm_bytes_per_element` / `_rope_bytes_per_element`, fused or composite) at
  HBM bandwidth x hbm_efficiency, plus one kernel gap (composite ops run several kernels; the
  model charges them as one).

Usage: python -m simfed.calibration.gpu_check RESULTS_DIR
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..compute import ComputeModel
from ..hardware import Hardware
from ..spec import SpecError, load_scenario
from ..spec.messages import one_line
from ..spec.paths import write_text_atomic

KINDS = ("gemm", "attention", "memory")
MEMORY_OPS = ("copy", "add", "rmsnorm_fused", "rmsnorm_composite", "rope_composite")
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


class CheckInputError(ValueError):
    """A results folder that cannot be compared (one line: file, field, value)."""


def _number(row: dict[str, Any], key: str, where: str, *, positive: bool = True) -> float:
    v = row.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise CheckInputError(f"{where}: {key}: expected a finite number, got {v!r}")
    if positive and v <= 0:
        raise CheckInputError(f"{where}: {key}: must be > 0, got {v!r}")
    return float(v)


def _model(scn: Any, dtype_bytes: int, **kw: Any) -> ComputeModel:
    """A kernel model of the scenario's device, its model's dtype replaced by the micro-timings'
    (the gemm bytes and the per-element bytes of RMSNorm and RoPE follow it)."""
    hw = Hardware.from_spec(scn.cluster, scn.runtime)
    dtype = {2: "bf16", 4: "fp32"}[dtype_bytes]
    model = replace(scn.model, dtype=dtype)
    rt = replace(scn.runtime.compute, model="kernels")
    return ComputeModel(hw=hw, rt=rt, tokens_per_gpu=1, model=model, **kw)


def predict_row(row: dict[str, Any], scn: Any, dtype_bytes: int, where: str
                ) -> dict[str, Any]:
    """The kernel model's time for one micro-timing, and the efficiency the measurement
    implies next to the constant the model uses for it."""
    kind = row.get("kind")
    gap = scn.runtime.compute.kernel_gap_us * 1e-6
    measured = _number(row, "time_s", where)
    cm = _model(scn, dtype_bytes)
    hw, rt = cm.hw, cm.rt
    if kind == "gemm":
        m, n, k = (int(_number(row, x, where)) for x in ("m", "n", "k"))
        ker = cm.gemm("gemm", m, n, k)
        return {"predicted_s": ker.time_s + gap, "flops": ker.flops,
                "implied_efficiency": ker.flops / (measured * hw.peak_flops),
                "model_efficiency": cm.gemm_efficiency(m, n, k),
                "constant": "gemm_efficiency", "constant_value": rt.gemm_efficiency}
    if kind == "attention":
        b, h, s, d = (int(_number(row, x, where)) for x in ("batch", "heads", "seq",
                                                            "head_dim"))
        bwd = row.get("direction") == "backward"
        if row.get("direction") not in ("forward", "backward"):
            raise CheckInputError(f"{where}: direction: expected forward or backward, got "
                                  f"{row.get('direction')!r}")
        flops = 4.0 * b * h * s * s * d
        if row.get("causal", True) and rt.causal_skip:
            flops /= 2
        flops *= 2.5 if bwd else 1.0
        ker = cm.attention_kernel("attention", flops, bwd)
        name = f"attention_efficiency_{'backward' if bwd else 'forward'}"
        return {"predicted_s": ker.time_s + gap, "flops": flops,
                "implied_efficiency": flops / (measured * hw.peak_flops),
                "model_efficiency": getattr(rt, name), "constant": name,
                "constant_value": getattr(rt, name)}
    if kind == "memory":
        op = row.get("op")
        if op not in MEMORY_OPS:
            raise CheckInputError(f"{where}: op: expected one of {', '.join(MEMORY_OPS)}, got "
                                  f"{op!r}")
        elements = _number(row, "elements", where)
        p = dtype_bytes
        if op == "copy":
            per = 2.0 * p
        elif op == "add":
            per = 3.0 * p
        elif op.startswith("rmsnorm"):
            per = _model(scn, p, eager_norm=op.split("_")[1])._norm_bytes_per_element(p)
        else:
            per = _model(scn, p, eager_rope="composite")._rope_bytes_per_element(p)
        nbytes = per * elements
        ker = cm.memory_bound(op, nbytes)
        return {"predicted_s": ker.time_s + gap, "bytes": nbytes,
                "implied_efficiency": nbytes / (measured * hw.hbm_Bps),
                "model_efficiency": rt.hbm_efficiency, "constant": "hbm_efficiency",
                "constant_value": rt.hbm_efficiency}
    raise CheckInputError(f"{where}: kind: expected one of {', '.join(KINDS)}, got {kind!r}")


def _summary(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in KINDS:
        ratios = [r["time_s"] / r[key] for r in rows if r["kind"] == kind and r.get(key)]
        if ratios:
            out[kind] = {"n": len(ratios),
                         "median_measured_over_predicted": statistics.median(ratios),
                         "median_abs_error": statistics.median(abs(1 / x - 1) for x in ratios),
                         "worst_error": max((1 / x - 1 for x in ratios), key=abs)}
    return out


def compare_micro(micro: dict[str, Any], scn: Any, calibrated: Any | None, where: str
                  ) -> dict[str, Any]:
    rows_in = micro.get("rows")
    if not isinstance(rows_in, list) or not rows_in:
        raise CheckInputError(f"{where}: rows: expected a non-empty list of micro-timings")
    dtype = micro.get("dtype")
    if dtype not in DTYPE_BYTES:
        raise CheckInputError(f"{where}: dtype: expected one of {', '.join(DTYPE_BYTES)}, got "
                              f"{dtype!r}")
    p = DTYPE_BYTES[dtype]
    rows = []
    for i, row in enumerate(rows_in):
        w = f"{where}: rows[{i}]"
        if not isinstance(row, dict):
            raise CheckInputError(f"{w}: expected a mapping, got {type(row).__name__}")
        out = {k: row[k] for k in row if k not in ("p10_s", "p90_s", "reps")}
        out.update(predict_row(row, scn, p, w))
        out["error"] = out["predicted_s"] / out["time_s"] - 1  # + : the model is too fast
        if calibrated is not None:
            cal = predict_row(row, calibrated, p, w)
            out["predicted_calibrated_s"] = cal["predicted_s"]
        rows.append(out)
    k_sweep = sorted((r["k"], r["implied_efficiency"], r["model_efficiency"])
                      for r in rows if r["kind"] == "gemm" and "K sweep" in str(r["name"]))
    attn = {}
    for r in rows:
        if r["kind"] == "attention":
            attn.setdefault(f"head_dim {r['head_dim']} {r['direction']}", []).append(
                r["implied_efficiency"])
    return {
        "rows": rows,
        "summary": _summary(rows, "predicted_s"),
        "summary_calibrated": _summary(rows, "predicted_calibrated_s") if calibrated else None,
        "gemm_efficiency_by_k": [{"k": k, "implied": e, "model": m} for k, e, m in k_sweep],
        "attention_efficiency_by_head_dim": {k: statistics.median(v)
                                             for k, v in sorted(attn.items())},
    }


def compare_runs(runs: dict[str, Any], scenario: Path, profile: Path | None, where: str
                 ) -> list[dict[str, Any]]:
    from ..engine import simulate  # the engine only when there are runs to predict

    summaries = runs.get("summaries")
    if not isinstance(summaries, dict) or not summaries:
        raise CheckInputError(f"{where}: summaries: expected a mapping of algorithm -> summary")
    out = []
    shipped = simulate(load_scenario(scenario))[0]
    cal = simulate(load_scenario(scenario, profile=profile))[0] if profile else None

    def by_name(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {a["name"]: a for a in result["algorithms"]}

    sim, simc = by_name(shipped), by_name(cal) if cal else {}
    for alg, s in sorted(summaries.items()):
        w = f"{where}: summaries.{alg}"
        if not isinstance(s, dict):
            raise CheckInputError(f"{w}: expected a mapping")
        key = ("step_time_s_unprofiled" if s.get("step_time_s_unprofiled") is not None
               else "step_time_s_after_first")
        measured = _number(s, key, w)
        if alg not in sim:
            raise CheckInputError(f"{w}: the scenario has no algorithm {alg!r}")
        row = {"algorithm": alg, "world_size": s.get("world_size"), "backend": s.get("backend"),
               "measured_step_s": measured, "measured_from": key,
               "predicted_step_s": sim[alg]["step_time_s"],
               "error": sim[alg]["step_time_s"] / measured - 1}
        if alg in simc:
            row["predicted_calibrated_step_s"] = simc[alg]["step_time_s"]
            row["error_calibrated"] = simc[alg]["step_time_s"] / measured - 1
        out.append(row)
    return out


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckInputError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    except UnicodeDecodeError:
        raise CheckInputError(f"{path}: not JSON (not UTF-8 text)") from None


def compare_folder(folder: Path) -> dict[str, Any]:
    """compare.json's content for a results folder (see the module note)."""
    if not folder.is_dir():
        raise CheckInputError(f"{folder}: not a folder of GPU-check results")
    scenario = folder / "scenario.yaml"
    if not scenario.is_file():
        raise CheckInputError(f"{scenario}: missing (the check's scenario)")
    scn = load_scenario(scenario)
    cal_path = folder / "calibrated.yaml"
    calibrated = load_scenario(scenario, profile=cal_path) if cal_path.is_file() else None
    result: dict[str, Any] = {"scenario": scn.name, "gpu": scn.cluster.node.gpu.name,
                              "calibrated_profile": calibrated is not None}
    micro_path = folder / "micro.json"
    if micro_path.is_file():
        micro = _read_json(micro_path)
        if not isinstance(micro, dict):
            raise CheckInputError(f"{micro_path}: expected a JSON object")
        result["micro"] = compare_micro(micro, scn, calibrated, str(micro_path))
        result["device"] = (micro.get("env") or {}).get("device")
    runs_path = folder / "runs.json"
    if runs_path.is_file():
        runs = _read_json(runs_path)
        if not isinstance(runs, dict):
            raise CheckInputError(f"{runs_path}: expected a JSON object")
        result["runs"] = compare_runs(runs, scenario, cal_path if calibrated else None,
                                      str(runs_path))
    if "micro" not in result and "runs" not in result:
        raise CheckInputError(f"{folder}: nothing to compare (no micro.json or runs.json)")
    return result


def report_lines(result: dict[str, Any]) -> list[str]:
    lines = [f"compare: {result.get('device') or result['gpu']} against the kernel model "
             f"({result['gpu']}'s figures)"]
    micro = result.get("micro")
    if micro:
        for kind, s in micro["summary"].items():
            cal = (micro.get("summary_calibrated") or {}).get(kind)
            lines.append(f"  {kind:9s} n={s['n']:2d}: predicted/measured - 1 median "
                         f"|{100 * s['median_abs_error']:.1f}%|, worst "
                         f"{100 * s['worst_error']:+.1f}%"
                         + (f"; calibrated |{100 * cal['median_abs_error']:.1f}%|" if cal
                            else ""))
        for r in micro["gemm_efficiency_by_k"]:
            lines.append(f"  GEMM K={r['k']:5d}: implied efficiency {r['implied']:.3f} "
                         f"(model {r['model']:.3f})")
        for k, v in micro["attention_efficiency_by_head_dim"].items():
            lines.append(f"  attention {k}: implied efficiency {v:.3f}")
    for r in result.get("runs", []):
        lines.append(f"  run {r['algorithm']:8s} world {r['world_size']} ({r['backend']}): "
                     f"measured {r['measured_step_s'] * 1e3:.1f} ms/step, predicted "
                     f"{r['predicted_step_s'] * 1e3:.1f} ({100 * r['error']:+.1f}%)"
                     + (f", calibrated {100 * r['error_calibrated']:+.1f}%"
                        if "error_calibrated" in r else ""))
    return lines


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m simfed.calibration.gpu_check RESULTS_DIR", file=sys.stderr)
        return 2
    folder = Path(args[0])
    try:
        result = compare_folder(folder)
    except (CheckInputError, SpecError) as exc:
        print(one_line(f"error: {exc}"), file=sys.stderr)
        return 2
    write_text_atomic(folder / "compare.json", json.dumps(result, indent=1) + "\n")
    print("\n".join(report_lines(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
