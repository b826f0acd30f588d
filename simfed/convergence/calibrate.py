"""`simfed calibrate --convergence STUDY.json --out PROFILE.yaml`: fit the convergence model to a
`realrun converge-study` file, write the profile a scenario includes under `convergence:
profile:`, and a report (JSON) with the held-out check and the critical-batch fit."""

from __future__ import annotations

import datetime as _dt
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..spec import SpecError
from ..spec.paths import write_text_atomic
from ..spec.study import is_size_study
from ..spec.yamlio import dump_yaml
from .fit import critical_batch, fit_profile, holdout, read_study

BOOTSTRAP_DRAWS = 40


def calibrate_convergence(inputs: Iterable[Path], out: Path, report: Path,
                          draws: int = BOOTSTRAP_DRAWS) -> list[str]:
    """The scaling model from size-study files (their header names the models' non-embedding
    parameters), else the noise_progress model from one study file."""
    inputs = list(inputs)
    studies = [read_study(p) for p in inputs]
    if any(is_size_study(s) for s in studies):
        from .calibrate_scaling import calibrate_scaling

        return calibrate_scaling(studies, out, report, draws=draws)
    if len(inputs) != 1:
        raise SpecError(f"--convergence: one study file per noise_progress profile, got "
                        f"{len(inputs)} (several files, of several model sizes, fit the scaling "
                        "model: write them with `realrun converge-study`)")
    study = studies[0]
    check = holdout(study)  # fitted without the held-out configurations
    # what scenarios use: every paper-lr run, with bootstrap refits for the uncertainty band
    profile = fit_profile(study, hold_out=False, draws=draws)
    crit = critical_batch(study)
    header = (f"# simfed calibrate --convergence {inputs[0]} ({_dt.date.today().isoformat()})\n"
              "# the noise-limited progress model (simfed/convergence/model.py); include it as "
              "a scenario's convergence.profile\n")
    write_text_atomic(out, header + dump_yaml(profile, sort_keys=False, width=100))
    rep: dict[str, Any] = {"profile": profile, "holdout": check, "critical_batch": crit}
    write_text_atomic(report, json.dumps(rep, indent=2, sort_keys=True, allow_nan=False) + "\n")
    p = {k: math.exp(v) if k.startswith("log_") else v for k, v in profile["params"].items()}
    lines = [
        f"convergence fit: {profile['source']}",
        f"  rms error {profile['rms_error']:.4f} nats; P_c {p['log_progress_scale']:.3g}, alpha "
        f"{p['exponent']:.3g}, B_noise(start) {p['log_noise_tokens']:.4g} tokens, beta "
        f"{p['noise_exponent']:.3g}, rho_1 {p['fl_rho1']:.3g}, kappa {p['log_fl_kappa']:.3g}, "
        f"floor {p['loss_floor']:.4f}",
    ]
    if check["median_abs_error"] is not None:
        lines.append(f"  held-out steps to target: median |error| "
                     f"{check['median_abs_error']:.1%}, worst {check['worst_abs_error']:.1%} "
                     f"over {check['points']} points ({check['check_runs']} runs)")
    for c in crit.get("targets", []):
        bs = c["b_simple_tokens"]
        bc = c["b_crit_tokens"]
        lines.append(f"  target {c['target_loss']:.3f}: S_min {c['s_min']:.1f}, E_min "
                     f"{c['e_min_tokens']:.4g} tokens, B_crit "
                     + (f"{bc:.4g}" if bc is not None else "-")
                     + " tokens; measured B_simple " + (f"{bs:.4g}" if bs else "-"))
    lines.append(f"wrote {out} and {report}")
    return lines
