"""`simfed figures` regenerates every figure (here on the tiny scenario and small grids), and
skips the measured-data figures with a note when their inputs are missing."""

import json

import yaml
from click.testing import CliRunner

from simfed.cli import main
from simfed.convergence.fit import fit_profile
from simfed.figures import make_figures

from ..conftest import ROOT
from ..convergence.test_convergence import synthetic_study
from .test_plots import VALIDATE, summary

TINY = ROOT / "tests" / "fixtures" / "tiny2x2.yaml"
SMALL = {"gpu_nodes": "1:4:x2", "gpu_steps": 2, "group_sizes": (1, 2), "heatmap_groups": "1,2",
         "heatmap_k": "1,2", "gantt_steps": 2, "straggler_nodes": (2, 4),
         "straggler_slow_pct": (0, 50), "straggler_jitter_pct": (0, 10)}


def test_every_figure(tmp_path):
    results = tmp_path / "results"
    (results / "realrun" / "fsdp").mkdir(parents=True)
    (results / "validate.json").write_text(json.dumps(VALIDATE))
    (results / "realrun" / "fsdp" / "summary.json").write_text(
        json.dumps(summary("fsdp", 1.0, [5.0, 4.0])))
    # convergence: a study file, and SCENARIO-time-to-target.yaml with a profile fitted on it
    study = synthetic_study(seeds=(0,))
    (results / "convergence").mkdir()
    on_disk = {k: v for k, v in study.items() if k != "path"}  # what read_study adds
    (results / "convergence" / "toy.json").write_text(json.dumps(on_disk))
    scn_dir = tmp_path / "scn"
    scn_dir.mkdir()
    tiny = scn_dir / TINY.name
    tiny.write_text(TINY.read_text())
    (scn_dir / "profile.yaml").write_text(yaml.safe_dump(fit_profile(study, hold_out=False)))
    (scn_dir / "tiny2x2-time-to-target.yaml").write_text(
        "include: tiny2x2.yaml\nconvergence: {model: noise_progress, target_perplexity: 700, "
        "transfer: true, loss_floor: 1.5, profile: {include: profile.yaml}}\n")
    lines: list[str] = []
    written = make_figures(tiny, tmp_path / "fig", results_dir=results, jobs=1, progress=False,
                           echo=lines.append, **SMALL)
    names = sorted(p.name for p in written)
    assert names == sorted([
        "tiny2x2_gpus_sweep.csv", "tiny2x2_speedup_vs_gpus.png",
        "tiny2x2_speedup_vs_gpus_with_debug_checks.png", "tiny2x2_fl_fsdp_group_size_vs_gpus.png",
        "tiny2x2_group_k_sweep.csv", "tiny2x2_fl_fsdp_speedup_over_fsdp_group_size_x_k.png",
        "tiny2x2_fl_fsdp_speedup_over_hsdp_group_size_x_k.png", "tiny2x2_phases.png",
        "tiny2x2_gantt_step2.png", "tiny2x2_stragglers_sweep.csv", "tiny2x2_stragglers.png",
        "validate_predicted_vs_measured.png",
        "realrun_perplexity_vs_time.png", "tiny2x2_perplexity_vs_time_to_target.png",
        "convergence_toy_fl_grid.png"])
    for p in written:
        assert 0 < p.stat().st_size < 150_000, p
    assert not any(line.startswith("note:") for line in lines)


def test_missing_inputs_are_skipped_with_a_note(tmp_path):
    res = CliRunner().invoke(main, ["figures", "--scenario", str(TINY), "--out",
                                    str(tmp_path / "fig"), "--results", str(tmp_path / "none"),
                                    "--only", "validation", "--only", "perplexity",
                                    "--only", "phases", "-q"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "note: " in res.output and "skipping predicted-vs-measured" in res.output
    assert "skipping perplexity-vs-time" in res.output
    assert [p.name for p in (tmp_path / "fig").iterdir()] == ["tiny2x2_phases.png"]
    res = CliRunner().invoke(main, ["figures", "--scenario", str(tmp_path / "nope.yaml")])
    assert res.exit_code == 2 and "error: scenario not found" in res.output


def _figures(results, out, only):
    res = CliRunner().invoke(main, ["figures", "--scenario", str(TINY), "--out", str(out),
                                    "--results", str(results), "--only", only, "-q"])
    assert "Traceback" not in res.output and "internal error" not in res.output, res.output
    return res


def test_a_damaged_validate_json_or_summary_is_one_line(tmp_path):
    """Before: an empty, truncated or binary validate.json was a JSONDecodeError or
    UnicodeDecodeError, a JSON list an AttributeError, {} a ValueError ("nothing to compare"), a
    summary without series a ValueError: all internal errors (exit 3)."""
    results = tmp_path / "results"
    results.mkdir()
    for body, needle in (("", "not JSON"), ('{"runs": [', "not JSON"), ("[1]", "expected"),
                         ("{}", "nothing to compare"), (b"\xff\xfe\x00", "not UTF-8")):
        p = results / "validate.json"
        p.write_bytes(body if isinstance(body, bytes) else body.encode())
        res = _figures(results, tmp_path / "fig", "validation")
        assert res.exit_code == 2, res.output
        assert res.output.startswith("error: ") and str(p) in res.output, res.output
        assert needle in res.output and len(res.output.strip().splitlines()) == 1, res.output
    s = results / "realrun" / "a" / "summary.json"
    s.parent.mkdir(parents=True)
    for body, needle in (("{}", "no summary has step_times_s"),
                         (json.dumps({"step_times_s": 1.5, "train_loss": [2.0]}),
                          "step_times_s: expected a list")):
        s.write_text(body)
        res = _figures(results, tmp_path / "fig", "perplexity")
        assert res.exit_code == 2 and needle in res.output, res.output
        assert len(res.output.strip().splitlines()) == 1, res.output


def test_a_study_with_no_run_at_its_paper_lr_draws_no_fl_grid(tmp_path):
    """The FL-grid figure is of the runs at the study's paper lr: none there is a note, not a
    crash (an IndexError on runs[0])."""
    study = {k: v for k, v in synthetic_study(seeds=(0,)).items() if k != "path"}
    study["recipe"] = {**study["recipe"], "paper_lr": 1e30}
    results = tmp_path / "results"
    (results / "convergence").mkdir(parents=True)
    (results / "convergence" / "toy.json").write_text(json.dumps(study))
    res = CliRunner().invoke(main, ["figures", "--scenario", str(TINY), "--out",
                                    str(tmp_path / "fig"), "--results", str(results),
                                    "--only", "convergence"])
    assert res.exit_code == 0, res.output
    assert "no run at its paper lr 1e+30: no FL-grid figure" in res.output
    assert not list((tmp_path / "fig").glob("convergence_toy_fl_grid*"))
