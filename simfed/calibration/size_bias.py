"""The kernel model's error by model size on one published table (a diagnosis; nothing is fitted
into the model from it).

`python -m simfed.calibration.size_bias [RESULTS.json] [--prefix NAME]` reads a
`simfed validate --published --json` file (default: the newest results-kernels-v*.json in
validation/published/) and, for the cases whose name starts with the prefix (default
llm-foundry's A100 40GB table, `foundry-a100-40gb-`), prints per model:
- the median signed error (predicted / published - 1) of the runs without activation
  checkpointing, and of those with it;
- the split of the error between attention and the rest: over the 8-GPU runs without
  checkpointing, least squares of the published time per token on the kernel model's
  attention time per token (the fused attention kernels, forward and backward) and its
  remaining time per token (everything else the step takes, communication included):
  published = alpha x rest + beta x attention. alpha = beta = 1 is the model as it stands.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from .published import DEFAULT_DIR, load_cases

DEFAULT_PREFIX = "foundry-a100-40gb-"


def newest_results(folder: Path = DEFAULT_DIR) -> Path:
    """The results-kernels-v<N>.json with the largest N in `folder`."""
    found = [(int(m.group(1)), p) for p in folder.glob("results-kernels-v*.json")
             if (m := re.fullmatch(r"results-kernels-v(\d+)\.json", p.name))]
    if not found:
        raise FileNotFoundError(f"{folder}: no results-kernels-v*.json")
    return max(found)[1]


def _scenario(folder: Path, case: dict[str, Any]) -> Any:
    from ..spec import load_scenario

    return load_scenario(folder / case["scenario"], dict(case.get("overrides") or {}))


def attention_s_per_token(scn: Any) -> float:
    """The kernel model's fused-attention time (forward and backward, every decoder layer) per
    token of one GPU, for a case's scenario."""
    from ..compute import ComputeModel
    from ..hardware import Hardware

    t, m = scn.training, scn.model
    tokens = t.micro_batch * t.seq_len
    cm = ComputeModel(hw=Hardware.from_spec(scn.cluster, scn.runtime), rt=scn.runtime.compute,
                      tokens_per_gpu=tokens, model=m, seq_len=t.seq_len, attention=t.attention,
                      cross_entropy=t.cross_entropy)
    total = sum(k.time_s for u in m.units(t.seq_len, scn.runtime.compute.causal_skip)
                if u.index for d in ("forward", "backward") for k in cm.unit_kernels(u, d)
                if k.name == "attention")
    return total / tokens


def size_bias(results: dict[str, Any], folder: Path = DEFAULT_DIR,
              prefix: str = DEFAULT_PREFIX) -> list[dict[str, Any]]:
    """Per model (in order of parameters): runs, median signed error without and with
    checkpointing, alpha and beta (None where fewer than two 8-GPU runs without it)."""
    cases = {c["name"]: c for c in load_cases(folder)}
    by_model: dict[str, list[tuple[dict[str, Any], Any, bool]]] = {}
    for r in results["cases"]:
        if r["name"].startswith(prefix) and r["name"] in cases:
            scn = _scenario(folder, cases[r["name"]])  # read once per case
            by_model.setdefault(r["model"], []).append(
                (r, scn, scn.training.ac_policy != "none"))
    out = []
    for model, rows in by_model.items():
        plain = [r["error"] for r, _, ac in rows if not ac]
        ckpt = [r["error"] for r, _, ac in rows if ac]
        split = [(r, scn) for r, scn, ac in rows if not ac and r["gpus"] == 8]
        alpha = beta = None
        if len(split) >= 2:
            x, y = [], []
            for r, scn in split:
                ta = attention_s_per_token(scn)
                x.append([1.0 / r["predicted"] - ta, ta])
                y.append(1.0 / r["published"])
            (alpha, beta), *_ = np.linalg.lstsq(np.array(x), np.array(y), rcond=None)
            alpha, beta = float(alpha), float(beta)
        out.append({"model": model, "runs": len(rows),
                    "params": rows[0][1].model.total_params,
                    "median_error_no_checkpointing": statistics.median(plain) if plain else None,
                    "runs_no_checkpointing": len(plain),
                    "median_error_checkpointing": statistics.median(ckpt) if ckpt else None,
                    "runs_checkpointing": len(ckpt), "alpha": alpha, "beta": beta,
                    "split_runs": len(split)})
    return sorted(out, key=lambda d: d["params"])


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m simfed.calibration.size_bias",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="?", type=Path, default=None)
    ap.add_argument("--prefix", default=DEFAULT_PREFIX)
    a = ap.parse_args(argv)
    path = a.results or newest_results()
    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"{path}: cannot read results: {exc}")
        return 2
    if not isinstance(results, dict) or not isinstance(results.get("cases"), list):
        print(f"{path}: cases: expected a list of results (simfed validate --published --json)")
        return 2
    try:
        rows = size_bias(results, DEFAULT_DIR, a.prefix)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        print(f"{path}: cases: an entry lacks a field or a number ({type(exc).__name__}: {exc});"
              " expected simfed validate --published --json output")
        return 2
    if not rows:
        print(f"{path}: no case named {a.prefix}*")
        return 2
    print(f"{path.name}, cases {a.prefix}*: median signed error (predicted / published - 1)")
    print(f"{'model':10s} {'params':>8s} {'no ckpt':>8s} {'n':>3s} {'ckpt':>8s} {'n':>3s}"
          f" {'alpha':>6s} {'beta':>6s}")
    for d in rows:
        ab = ("   -      -" if d["alpha"] is None
              else f"{d['alpha']:6.2f} {d['beta']:6.2f}")
        print(f"{d['model']:10s} {d['params'] / 1e9:7.2f}B "
              f"{_pct(d['median_error_no_checkpointing']):>8s} {d['runs_no_checkpointing']:3d} "
              f"{_pct(d['median_error_checkpointing']):>8s} {d['runs_checkpointing']:3d} {ab}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
