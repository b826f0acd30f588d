"""The fitted loaded-step latency (cluster.fabric.loaded_step_us) of the machines of the fourth
check: the shipped values are the fit rule's choice on the fit set (simfed.calibration.loaded_step),
and the rule reads only the set it is given."""

from __future__ import annotations

import pytest

from simfed.calibration.loaded_step import KEY, curve_errors, scan, study_cases
from simfed.calibration.published import DEFAULT_DIR
from simfed.spec import load_scenario


def _shipped(scenario: str) -> float:
    return load_scenario(DEFAULT_DIR / scenario, {}).cluster.fabric.loaded_step_us


@pytest.mark.parametrize("machine, scenarios, grid", [
    ("leonardo", ("scale-modalities-leonardo-2.7b.yaml", "scale-modalities-leonardo-6.7b.yaml",
                  "scale-modalities-leonardo-2.7b-hybrid.yaml",
                  "scale-modalities-leonardo-6.7b-hybrid.yaml"), (50.0, 56.25, 62.5)),
    ("mn5", ("scale-modalities-mn5-2.7b.yaml", "scale-modalities-mn5-6.7b-hybrid.yaml"),
     (3.125, 6.25, 9.375)),
])
def test_the_shipped_value_is_the_fit_rules_choice(machine, scenarios, grid):
    pts, best = scan(machine, grid)
    assert [p.value_us for p in pts] == list(grid)
    assert {_shipped(s) for s in scenarios} == {best.value_us}
    # the choice is a minimum: its neighbours on the grid fit the fit studies' curves worse
    assert all(round(p.mean_abs, 3) >= round(best.mean_abs, 3) for p in pts)


def test_the_term_bends_the_curves_the_fit_studies_show():
    """Leonardo's fit studies lose 16-62% per GPU at their largest counts; without the term the
    model's curves miss them by far more than with the fitted value."""
    studies = study_cases("leonardo")
    off = [abs(e) for e in curve_errors(studies, 0.0)]
    on = [abs(e) for e in curve_errors(studies, _shipped("scale-modalities-leonardo-2.7b.yaml"))]
    assert max(off) > 1.0 and max(on) < 0.3
    assert sum(on) < 0.4 * sum(off)


def test_a_machine_without_studies_in_the_set_is_one_line():
    with pytest.raises(ValueError) as exc:
        study_cases("nowhere")
    assert "\n" not in str(exc.value) and "named nowhere*" in str(exc.value)


def test_the_rule_reads_only_its_set():
    fit, check = study_cases("mn5", "fit"), study_cases("mn5", "check")
    assert fit and check and not set(fit) & set(check)
    assert all(c["set"] == "fit" for cs in fit.values() for c in cs)
    assert KEY == "cluster.fabric.loaded_step_us"


@pytest.mark.parametrize("grid", ["fast", "10,-5"])
def test_a_bad_grid_is_one_line_not_a_traceback(grid, capsys):
    from simfed.calibration.loaded_step import main

    with pytest.raises(SystemExit) as exc:
        main(["leonardo", "--grid", grid])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "error:" in err and "Traceback" not in err


def test_a_missing_folder_is_one_line(tmp_path, capsys):
    from simfed.calibration.loaded_step import main

    with pytest.raises(SystemExit) as exc:
        main(["leonardo", "--folder", str(tmp_path / "none")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "error:" in err.strip().splitlines()[-1] and "cases.yaml" in err.strip().splitlines()[-1]


def test_the_island_term_is_the_joint_rules_choice_and_documented():
    """MareNostrum 5's island term (fabric.loaded_step_island_us over its 160-node islands),
    fitted with the loaded step: at the shipped loaded step the island grid's best is the
    shipped value, each neighbour fitting the fit studies' curves worse, and no island term is
    clearly worse; the joint scan over a neighbourhood of both picks the shipped pair; the
    cluster file names the command."""
    from simfed.calibration.loaded_step import ISLAND_KEY, scan_joint

    fabric = load_scenario(DEFAULT_DIR / "scale-modalities-mn5-2.7b.yaml", {}).cluster.fabric
    assert (fabric.nodes_per_island, fabric.loaded_step_us,
            fabric.loaded_step_island_us) == (160, 6.25, 6.25)
    pts, best = scan("mn5", (0.0, 3.125, 6.25, 9.375), key=ISLAND_KEY)
    assert best.value_us == 6.25 and pts[0].mean_abs > best.mean_abs + 0.01
    jpts, jbest = scan_joint("mn5", (3.125, 6.25), (6.25, 9.375))
    assert len(jpts) == 4 and (jbest.value_us, jbest.island_us) == (6.25, 6.25)
    text = (DEFAULT_DIR / "clusters" / "marenostrum5-acc.yaml").read_text()
    assert "loaded_step mn5 --joint" in text


def test_joint_scan_cli_prints_every_pair_and_refuses_bad_grids(capsys):
    from simfed.calibration.loaded_step import main

    main(["mn5", "--joint", "--grid", "6.25", "--island-grid", "0,6.25"])
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 3 and out[-1] == "chosen: 6.25 us, island 6.25 us"
    with pytest.raises(SystemExit) as exc:
        main(["mn5", "--joint", "--island-grid", "1,x"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--island-grid: comma-separated numbers in us, got 1,x" in err


def test_the_island_fit_on_a_machine_without_islands_is_one_line(capsys):
    from simfed.calibration.loaded_step import main

    with pytest.raises(SystemExit) as exc:
        main(["leonardo", "--island", "--grid", "5"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "Traceback" not in err and "nodes_per_island" in err


def test_an_empty_prefix_takes_every_scale_study_and_no_single_run():
    """Cases outside any scale study (no `study`) never reach the fit, whatever the prefix."""
    every = study_cases("")
    assert every and all(c.get("study") == s for s, cs in every.items() for c in cs)
    assert set(study_cases("dgxc")) < set(every)


def test_extrapolate_fits_each_study_on_its_small_counts_only():
    """--extrapolate: a study's value comes from its counts up to the share of its largest; the
    loss it reports to the largest count is the model's with that value."""
    from simfed.calibration.loaded_step import extrapolate
    from simfed.calibration.published import predict_case

    (r,) = extrapolate("dgxc-paxml-gpt5b", (0.0, 50.0), share=0.25)
    assert r.fitted_on == (16, 32) and r.largest == 128
    cases = study_cases("dgxc-paxml-gpt5b")["dgxc-paxml-gpt5b-fp8"]
    lo, hi = (predict_case(DEFAULT_DIR, c, {KEY: r.value_us})["predicted"]
              for c in (cases[0], cases[-1]))
    assert r.calibrated_loss == pytest.approx(1 - hi / lo)
    small = {"dgxc-paxml-gpt5b-fp8": [c for c in cases if c["gpus"] <= 32]}
    errs = {v: sum(map(abs, curve_errors(small, v))) for v in (0.0, 50.0)}
    assert errs[r.value_us] == min(errs.values())


@pytest.mark.parametrize("share", ["0", "1.5", "0.01"])
def test_extrapolate_with_no_usable_share_is_one_line(share, capsys):
    from simfed.calibration.loaded_step import main

    with pytest.raises(SystemExit) as exc:
        main(["dgxc-paxml-gpt5b", "--extrapolate", share, "--grid", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "Traceback" not in err and "--extrapolate" in err
