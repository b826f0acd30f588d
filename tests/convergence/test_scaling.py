"""The scaling convergence model (simfed/convergence/scaling.py), its fit and held-out checks.

Oracles: one step of the model against its closed form (McCandlish's quadratic written for
Adam); its limits (one group ignores K; at the noise-free optimal lr a step makes McCandlish's
statistical efficiency 1 / (1 + B_noise / B); a larger batch never learns slower per step; more
groups at K = 1 never learn slower); the fit recovers parameters of curves the model generated at
three sizes and predicts a fourth size it never saw."""

from __future__ import annotations

import io
import json
import math
from dataclasses import replace

import numpy as np
import pytest
import yaml

from simfed.convergence import fitting, scaling
from simfed.convergence.runs import Run, Shape
from simfed.spec import SpecError

from ..conftest import ROOT

TRUE = {"log_lr_star": math.log(4e-3), "lr_size_exponent": 0.35,
        "log_noise_star": math.log(2e4), "noise_loss_exponent": 3.0,
        "log_progress_scale": math.log(8.0), "exponent": 0.6, "progress_size_exponent": 0.2,
        "loss_floor": 1.2, "log_floor_coef": math.log(0.4), "floor_size_exponent": 0.3,
        "log_fl_kappa": math.log(0.5), "unigram_loss": 3.0, "log_unigram_scale": math.log(0.5),
        "log_unigram_lr_star": math.log(8e-3), "lr_tail": 0.7, "lr_tail_size_exponent": 0.1,
        "lr_damage": 0.0}
X = np.array([TRUE[p] for p in scaling.PARAMS])
L0 = 5.5


def shape(**kw) -> Shape:
    base = {"params": 4e5, "batch_tokens": 1024.0, "steps": 48, "lr": 3e-3,
            "warmup_steps": 5, "loss_init": L0}
    return Shape(**{**base, **kw})


def curve(s: Shape, x: np.ndarray = X) -> np.ndarray:
    return scaling.loss_curves_many(x, [s])[0][0]


def loss_of(progress: float, params: float, progress1: float | None = None) -> float:
    """The model's loss at stage 2's and stage 1's progress, by hand."""
    n_rel = params / 1e6
    pc = math.exp(TRUE["log_progress_scale"]) * n_rel ** -TRUE["progress_size_exponent"]
    floor = TRUE["loss_floor"] + 0.4 * n_rel ** -TRUE["floor_size_exponent"]
    p1 = progress if progress1 is None else progress1
    lu = TRUE["unigram_loss"]
    return (floor + (lu - floor) * (1 + progress / pc) ** -TRUE["exponent"]
            + (L0 - lu) * math.exp(-p1 / 0.5))


def test_one_step_is_the_closed_form():
    """Step 0 has lr 0 (warm-up from 0); step 1 at lr eta: each stage's dP = 2 x s / (1 + x^2
    q / s^2)^gamma, with x = eta / eta* of that stage (and 2 x s - x^2 q with the quadratic)."""
    s = shape(groups=8, aggregate_every=1, warmup_steps=2)
    c = curve(s)
    assert c[1] == pytest.approx(L0)  # lr 0 at step 0: nothing learnt
    eta = s.lr_values()[1]
    bn = scaling.noise_scale(X, L0)
    s2 = 8 * s.batch_tokens / (8 * s.batch_tokens + bn)  # K = 1: G_eff = G, one model on G b
    q = 1.0
    gamma = TRUE["lr_tail"] * (s.params / 1e6) ** -TRUE["lr_tail_size_exponent"]

    def dp(lr_star: float, quadratic: bool = False) -> float:
        x = eta / lr_star
        if quadratic:
            return 2 * x * math.sqrt(s2) - x * x * q
        return 2 * x * math.sqrt(s2) / (1 + x * x * q / s2) ** gamma

    star1 = 8e-3 * (s.params / 1e6) ** -TRUE["lr_size_exponent"]
    # eta* (2) sits sqrt(2 gamma(N) - 1) above the optimal learning rate that optimal_lr reports
    star2 = scaling.optimal_lr(X, s.params) * math.sqrt(2 * gamma - 1)
    assert c[2] == pytest.approx(loss_of(dp(star2), s.params, dp(star1)), rel=1e-12)
    monkey = pytest.MonkeyPatch()
    monkey.setattr(scaling, "RESPONSE", "quadratic")
    try:
        c = curve(s)
    finally:
        monkey.undo()
    want = loss_of(dp(star2, True), s.params, dp(star1, True))
    assert c[2] == pytest.approx(want, rel=1e-12)


def test_one_group_ignores_k():
    assert np.array_equal(curve(shape()), curve(shape(groups=1, aggregate_every=8)))


def test_optimal_lr_step_is_mccandlish_efficiency():
    """With a noise scale that does not move (1/alpha_B = 0), the lorentzian at gamma = 1 and
    lr = eta* s, one model's progress per step is s^2 = 1 / (1 + B_noise / B) (both stages at
    one optimum here)."""
    x = X.copy()
    x[scaling.IDX["lr_tail"]] = 1.0
    x[scaling.IDX["lr_tail_size_exponent"]] = 0.0
    x[scaling.IDX["noise_loss_exponent"]] = 0.0
    x[scaling.IDX["log_unigram_lr_star"]] = x[scaling.IDX["log_lr_star"]]
    bn = math.exp(TRUE["log_noise_star"])
    b = 4096.0
    s = math.sqrt(b / (b + bn))
    lr = scaling.optimal_lr(x, 4e5) * s
    one = shape(batch_tokens=b, lr=lr, steps=2, warmup_steps=0, schedule="constant")
    c = curve(one, x)
    assert c[1] == pytest.approx(loss_of(b / (b + bn), 4e5), rel=1e-12)


def test_progress_peaks_at_the_optimal_lr_times_s_for_any_tail():
    """r = 2 x s / (1 + x^2 / s^2)^gamma peaks at lr = optimal_lr x s whatever gamma; a flatter
    tail (smaller gamma) loses less at 4x that learning rate."""
    bn = math.exp(TRUE["log_noise_star"])
    b = 4096.0
    s = math.sqrt(b / (b + bn))
    loss4x = {}
    for tail in (0.6, 0.7, 1.0, 2.0):
        x = X.copy()
        x[scaling.IDX["noise_loss_exponent"]] = 0.0
        x[scaling.IDX["lr_tail"]] = tail
        x[scaling.IDX["lr_tail_size_exponent"]] = 0.0
        x[scaling.IDX["log_unigram_lr_star"]] = x[scaling.IDX["log_lr_star"]]  # one optimum
        best = scaling.optimal_lr(x, 4e5) * s

        def after(lr: float, x: np.ndarray = x) -> float:
            one = shape(batch_tokens=b, lr=lr, steps=2, warmup_steps=0, schedule="constant")
            return curve(one, x)[1]

        assert after(best) < min(after(0.8 * best), after(1.25 * best))
        loss4x[tail] = after(4 * best) - after(best)
    assert loss4x[0.6] < loss4x[0.7] < loss4x[1.0] < loss4x[2.0]


def test_the_tail_flattens_with_size_as_its_exponent_says():
    """gamma(N) = gamma (N / 1e6)^-t: with t > 0 a 16x larger model loses less progress at
    4x its optimal learning rate than with t = 0, and gamma is held at 0.55 far out."""
    lost = {}
    for t in (0.0, 0.2):
        x = X.copy()
        x[scaling.IDX["lr_tail_size_exponent"]] = t
        x[scaling.IDX["noise_loss_exponent"]] = 0.0
        x[scaling.IDX["log_unigram_lr_star"]] = x[scaling.IDX["log_lr_star"]]
        best = scaling.optimal_lr(x, 16e6)

        def after(lr: float, x: np.ndarray = x) -> float:
            one = shape(params=16e6, batch_tokens=1e9, lr=lr, steps=2, warmup_steps=0,
                        schedule="constant")
            return curve(one, x)[1]

        lost[t] = after(4 * best) - after(best)
    assert lost[0.2] < lost[0.0]
    assert scaling.tail_at(0.7, 0.2, 1e6) == pytest.approx(scaling.TAIL_MIN)


def test_a_step_above_its_optimum_slows_every_later_step():
    """lr_damage beta: a step at x above its optimum x_pk multiplies every later context step's
    progress by exp(-beta (x / x_pk - 1)^2). Below the optimum nothing changes; above it the
    run ends higher, and the harm outlives the learning rate: after it falls to the optimum the
    damaged run still learns more slowly; a "post" segment carries the damage of the steps
    before its start."""
    x0 = X.copy()
    x0[scaling.IDX["lr_tail_size_exponent"]] = 0.0
    hurt = x0.copy()
    hurt[scaling.IDX["lr_damage"]] = 0.02
    best = scaling.optimal_lr(x0, 4e5)
    low = shape(lr=0.5 * best, steps=64)
    assert np.array_equal(curve(low, hurt), curve(low, x0))
    high = shape(lr=6 * best, steps=64)
    assert curve(high, hurt)[-1] > curve(high, x0)[-1] + 0.01
    # 16 steps at 6x the optimum, then 48 at it: the second part learns less when damaged
    knots = ((1, 6 * best), (16, 6 * best), (17, best), (64, best))
    both = shape(lr=6 * best, steps=64, warmup_steps=1, lr_knots=knots)
    drop = {k: (c[20] - c[-1]) for k, c in (("hurt", curve(both, hurt)),
                                             ("whole", curve(both, x0)))}
    assert 0 < drop["hurt"] < 0.9 * drop["whole"]
    post = replace(both, segment="post", start_step=16, loss_init=2.9)
    assert curve(post, hurt)[-1] > curve(post, x0)[-1] + 0.01
    calm = replace(both, lr_knots=((1, best / 2), (64, best / 2)), segment="post", start_step=16,
                   loss_init=2.9)
    assert np.array_equal(curve(calm, hurt), curve(calm, x0))


def test_larger_batches_and_more_groups_never_learn_slower_per_step():
    c = [curve(shape(batch_tokens=b)) for b in (128, 1024, 8192)]
    assert np.all(c[0] >= c[1] - 1e-12) and np.all(c[1] >= c[2] - 1e-12)
    assert c[0][-1] > c[2][-1] + 0.01
    # more groups at K = 1 never learn slower, and averaging fades with K
    fl = [curve(shape(batch_tokens=128, groups=g, aggregate_every=1)) for g in (1, 4, 64)]
    assert np.all(fl[0] >= fl[1] - 1e-12) and np.all(fl[1] >= fl[2] - 1e-12)
    ks = [curve(shape(batch_tokens=128, groups=64, aggregate_every=k, lr=2e-2))[-1]
          for k in (1, 8, 64)]
    assert ks[0] <= ks[1] <= ks[2]


def test_averaging_every_step_is_one_model_on_all_groups_batches():
    """K = 1 keeps the copies equal: FL+FSDP with G groups of b tokens is FSDP on G b tokens;
    with K > 1 the average is worth less than that and more than one group."""
    fl = curve(shape(batch_tokens=128, groups=16, aggregate_every=1))
    assert np.allclose(fl, curve(shape(batch_tokens=16 * 128)), rtol=0, atol=1e-12)
    k8 = curve(shape(batch_tokens=128, groups=16, aggregate_every=8))
    one = curve(shape(batch_tokens=128))
    assert fl[-1] < k8[-1] < one[-1]


def synthetic_runs(sizes: tuple[float, ...], x: np.ndarray = X) -> list[Run]:
    runs = []
    for n in sizes:
        for kw in ({"lr": 1e-3}, {"lr": 3e-3}, {"lr": 1e-2}, {"batch_tokens": 128},
                   {"batch_tokens": 8192}, {"batch_tokens": 128, "groups": 16,
                                            "aggregate_every": 1},
                   {"batch_tokens": 128, "groups": 16, "aggregate_every": 8, "lr": 1e-2},
                   {"batch_tokens": 128, "groups": 64, "aggregate_every": 4, "lr": 1e-2}):
            s = shape(params=n, steps=64, warmup_steps=6, **kw)
            c = curve(s, x)
            steps = tuple(range(0, 65, 4))
            runs.append(Run(key=f"{n:g}/{kw}", shape=s, eval_steps=steps,
                            eval_loss=tuple(float(c[i]) for i in steps), source=f"n{n:g}"))
    return runs


def test_fit_recovers_the_curves_and_predicts_an_unseen_size():
    fixed = {"loss_floor": TRUE["loss_floor"]}  # far below what 64 steps reach
    train = synthetic_runs((5e4, 2e5, 8e5))
    f = fitting.fit(train, fixed=fixed)
    assert f["rms"] < 2e-3
    check = synthetic_runs((3.2e6,))
    res = fitting.check(train, check, fixed=fixed, draws=0,
                        targets=[4.0, 3.5, 3.0])
    assert res["points"] >= 10
    assert res["median_abs_error"] < 0.05
    assert res["unreached"] == 0 and res["unreached_rows"] == []
    assert res["median_abs_error_with_unreached"] == res["median_abs_error"]
    # a check run that stalls short of the targets the model has it reach: not scored as an
    # error (no measured steps), listed with its least error, and counted in the second median
    stalled = [replace(r, key=r.key + "/stalled",
                       eval_loss=(r.eval_loss[0], *(max(v, 3.75) for v in r.eval_loss[1:])))
               for r in check[:1]]
    res2 = fitting.check(train, check + stalled, fixed=fixed, draws=0, targets=[4.0, 3.5, 3.0])
    gone = [u for u in res2["unreached_rows"] if u["key"].endswith("/stalled")]
    assert {u["target_loss"] for u in gone} == {3.5, 3.0}
    for u in gone:
        assert u["run_steps"] == 64 and 0 < u["predicted_steps"] < 64
        assert u["error_at_least"] == pytest.approx(u["predicted_steps"] / 64 - 1, abs=1e-3)
    assert res2["unreached"] == len(res2["unreached_rows"]) >= 2
    assert res2["points"] == res["points"] + 1  # its 4.0 is still scored
    counted = sorted([abs(r["error"]) for r in res2["rows"]]
                     + [abs(u["error_at_least"]) for u in res2["unreached_rows"]])
    assert res2["median_abs_error_with_unreached"] == pytest.approx(float(np.median(counted)))
    assert len(counted) == res2["points"] + res2["unreached"]
    # "inside" with a band open above (p90 never reaching the target) counted as outside
    closed = [r["inside"] and r["band"][1] is not None for r in res2["rows"]]
    assert res2["inside_closed_band"] == pytest.approx(sum(closed) / len(closed))
    assert res2["inside_closed_band"] <= res2["inside_band"]


def test_check_lines_name_bands_open_above():
    from simfed.convergence.profile import closed_note

    assert closed_note({"inside_band": 0.8, "inside_closed_band": 0.8}) == ""
    assert closed_note({"inside_band": 0.8}) == ""
    assert closed_note({"inside_band": 1.0, "inside_closed_band": 3 / 7}) == (
        " (43% with a band open above counted outside)")


def test_progress_factors_recover_how_much_faster_a_run_learns():
    """A run made with its progress scaled by f (P_c and P_1 divided by it) is found at ln f
    against the true parameters; the spread is their rms; the band draws it."""
    runs = synthetic_runs((2e5,))
    factors = np.array([-0.4, -0.1, 0.0, 0.2, 0.5, 0.3, -0.25, 0.05])
    made = []
    for r, f in zip(runs, factors, strict=True):
        c = curve(r.shape, scaling.shift_progress(X, f)[0])
        made.append(replace(r, eval_loss=tuple(float(c[i]) for i in r.eval_steps)))
    got = fitting.progress_factors(X, made)
    assert got == pytest.approx(factors, abs=0.01)
    assert fitting.progress_sd(X, made) == pytest.approx(
        float(np.sqrt(np.mean(factors**2))), abs=0.01)
    # a faster run reaches every loss sooner: steps to a loss fall as the factor grows
    s = shape(steps=64, warmup_steps=6)
    fast, slow = (curve(s, scaling.shift_progress(X, f)[0]) for f in (0.3, -0.3))
    tgt = float(curve(s)[32])
    assert np.argmax(fast <= tgt) < 32 < np.argmax(slow <= tgt)
    # the band: each draw's progress scaled, no loss shift
    thetas, shift = fitting.draws_with_noise(X, np.empty((0, len(X))), 0.1, 50, progress=0.2)
    assert not shift.any()
    ln_f = X[scaling.IDX["log_progress_scale"]] - thetas[:, scaling.IDX["log_progress_scale"]]
    assert np.allclose(ln_f, X[scaling.IDX["log_unigram_scale"]]
                       - thetas[:, scaling.IDX["log_unigram_scale"]])
    assert 0.1 < float(np.std(ln_f)) < 0.3
    _, loss_shift = fitting.draws_with_noise(X, np.empty((0, len(X))), 0.1, 50)
    assert loss_shift.std() > 0.05


def test_check_reports_the_progress_band_and_the_loss_shift_band():
    train = synthetic_runs((5e4, 2e5, 8e5))
    res = fitting.check(train, synthetic_runs((3.2e6,)), fixed={"loss_floor": 1.2}, draws=0,
                        targets=[4.0, 3.5, 3.0])
    assert res["progress_sd"] < 0.05  # the model made every training run
    for row in res["rows"]:
        assert set(row) >= {"band", "inside", "band_loss_shift", "inside_loss_shift"}
    assert res["inside_band_loss_shift"] == pytest.approx(
        sum(r["inside_loss_shift"] for r in res["rows"]) / res["points"])
    assert res["inside_closed_band_loss_shift"] <= res["inside_band_loss_shift"]


def test_check_measures_the_check_runs_factors_and_bands_with_a_given_spread():
    """The check runs' own progress factors under the fit are reported (the spread a held-out
    prediction meets); a given band_sd draws the band, the fit runs' spread's band beside."""
    train = synthetic_runs((5e4, 2e5, 8e5))
    held = synthetic_runs((3.2e6,))
    factors = np.linspace(-0.3, 0.3, len(held))
    made = []
    for r, f in zip(held, factors, strict=True):
        c = curve(r.shape, scaling.shift_progress(X, f)[0])
        made.append(replace(r, eval_loss=tuple(float(c[i]) for i in r.eval_steps)))
    kw = {"fixed": {"loss_floor": 1.2}, "draws": 0, "targets": [4.0, 3.5, 3.0]}
    plain = fitting.check(train, made, **kw)
    assert [f["ln_f"] for f in plain["check_factors"]] == pytest.approx(factors, abs=0.02)
    assert plain["check_progress_sd"] == pytest.approx(
        float(np.sqrt(np.mean(factors**2))), abs=0.02)
    assert plain["band_sd"] == plain["progress_sd"] < 0.05
    assert "inside_band_fit_spread" not in plain
    wide = fitting.check(train, made, band_sd=0.3, **kw)
    assert wide["band_sd"] == 0.3 and wide["progress_sd"] == plain["progress_sd"]
    for w, p in zip(wide["rows"], plain["rows"], strict=True):
        assert w["band_fit_spread"] == p["band"] and w["inside_fit_spread"] == p["inside"]
        lo, hi = w["band"]
        assert lo <= p["band"][0] and (hi is None or hi >= p["band"][1])
    # the factors of +-0.3 lie outside the fit runs' near-zero spread, inside 0.3's
    assert wide["inside_band"] > wide["inside_band_fit_spread"]


def test_held_out_spread_pools_the_named_checks_runs():
    from simfed.convergence.calibrate_scaling import held_out_spread

    def c(what: str, ln_f: list[float], free: tuple[str, ...] = ()) -> dict:
        return {"what": what, "free": list(free),
                "check_factors": [{"ln_f": v} for v in ln_f]}

    checks = [c("a", [0.1, -0.3]), c("b", [0.2]), c("c", [5.0]), c("a", [9.0], ("lr_damage",))]
    got = held_out_spread(checks, ("a", "b"))
    assert got["sd"] == pytest.approx(math.sqrt((0.01 + 0.09 + 0.04) / 3))
    assert got["runs"] == 3 and got["checks"] == ["a", "b"]
    assert held_out_spread(checks, ("z",)) is None


def test_held_out_checks_band_the_marked_plans_with_the_sources_spread(monkeypatch):
    """A plan marked held_out_band is scored after split.BAND_FROM_CHECKS (run even when not
    asked for) with their check runs' spread, recorded as band_from."""
    from simfed.convergence import calibrate_scaling as cs
    from simfed.convergence import split

    src = split.BAND_FROM_CHECKS
    plans = [{"what": w} for w in src] + [{"what": "new", "held_out_band": True}]
    monkeypatch.setattr(cs, "check_plans", lambda runs, whole: plans)
    calls = []

    def fake(plan, fmin, draws, fixed, band_sd=None):
        calls.append((plan["what"], band_sd))
        return {"what": plan["what"], "free": [], "check_factors": [{"ln_f": 0.2}]}

    monkeypatch.setattr(cs, "_run_check", fake)
    out = cs.held_out_checks([], 0.0, jobs=1, only=("new",))
    assert [c["what"] for c in out] == ["new"]
    assert calls[-1] == ("new", pytest.approx(0.2)) and len(calls) == len(src) + 1
    assert out[0]["band_from"]["checks"] == list(src)


def test_fit_refuses_too_few_points_and_unknown_fixed():
    one = synthetic_runs((1e5,))[:1]
    with pytest.raises(SpecError, match="evaluation points"):
        fitting.fit(one)
    with pytest.raises(SpecError, match="unknown parameter 'bogus'"):
        fitting.fit(synthetic_runs((1e5,)), fixed={"bogus": 1.0})


# ---- end to end: size-study files -> simfed calibrate --convergence -> a scenario ------------

def size_study(hidden: int, params: float, steps: tuple[int, ...] = (32,)) -> dict:
    """A size-study file (realrun converge-study's form) whose curves the model made."""
    grid = [("fsdp", 8, 0, 3e-3), ("fsdp", 1, 0, 3e-3), ("fsdp", 32, 0, 1e-2),
            ("fl_fsdp", 8, 1, 3e-3), ("fl_fsdp", 8, 8, 1e-2), ("fsdp", 8, 0, 1e-3)]
    runs = []
    for total in steps:
        for alg, n, k, lr in grid:
            groups = n if alg == "fl_fsdp" else 1
            b = 4 if alg == "fl_fsdp" else 4 * n
            s = Shape(params=params, batch_tokens=b * 32.0, steps=total, lr=lr,
                      warmup_steps=max(1, round(0.1 * total)), groups=groups,
                      aggregate_every=k, loss_init=L0)
            c = curve(s)
            ev = list(range(0, total + 1, total // 8))
            runs.append({"key": f"{alg}/n{n}/k{k}/lr{lr:g}/s{total}", "seed": 0,
                         "algorithm": alg, "groups": groups, "batch_per_model": b,
                         "seq_len": 32, "aggregate_every": k or None, "lr": lr,
                         "steps": total, "warmup_steps": s.warmup_steps,
                         "lr_schedule": "cosine", "optimizer": "adamw", "eval_steps": ev,
                         "eval_loss": [float(c[i]) for i in ev], "train_loss": [],
                         "noise": []})
    return {"schema": "realrun.convergence_study/1", "experiment": f"made-h{hidden}",
            "what": "curves of known parameters",
            "model": {"name": f"h{hidden}", "params": params + 256 * hidden, "vocab": 256,
                      "layers": 2, "hidden": hidden, "non_embedding_params": params},
            "data": {"source": "kjv", "entropy_floor_nats": None, "describe": "made"},
            "recipe": {"paper_lr": 3e-4}, "ranks_per_group": 4, "micro_batch": 1,
            "runs": runs}


@pytest.fixture(scope="module")
def scaling_profile(tmp_path_factory):
    import json

    import yaml

    from simfed.convergence.calibrate import calibrate_convergence

    d = tmp_path_factory.mktemp("sizes")
    paths = []
    for h, n in ((64, 1e5), (128, 4e5), (256, 1.6e6)):
        p = d / f"made-h{h}.json"
        p.write_text(json.dumps(size_study(h, n)))
        paths.append(p)
    out = d / "profile.yaml"
    lines = calibrate_convergence(paths, out, d / "report.json", draws=2)
    assert any("seen before the model was fixed, across size" in line for line in lines)
    return yaml.safe_load(out.read_text())


def test_calibrated_profile_draws_the_held_out_checks_spread(tmp_path, monkeypatch):
    """Where split.HELD_OUT_BAND, the shipped profile's progress_sd is the rms of ln f over the
    check runs of split.PROFILE_BAND_FROM's checks, the fit runs' spread kept beside it."""
    import json

    import yaml

    from simfed.convergence import calibrate_scaling as cs
    from simfed.convergence import split
    from simfed.convergence.calibrate import calibrate_convergence

    paths = []
    for h, n in ((64, 1e5), (128, 4e5), (256, 1.6e6)):
        p = tmp_path / f"made-h{h}.json"
        p.write_text(json.dumps(size_study(h, n)))
        paths.append(p)
    real = cs.held_out_checks
    ln_f = {name: [0.1 * (i + 1), -0.2] for i, name in enumerate(split.PROFILE_BAND_FROM[:2])}

    def with_sources(*a, **kw):
        checks = real(*a, **kw)
        return checks + [{**checks[0], "what": w, "check_factors": [{"ln_f": v} for v in fs]}
                         for w, fs in ln_f.items()]

    monkeypatch.setattr(cs, "held_out_checks", with_sources)
    monkeypatch.setattr(split, "HELD_OUT_BAND", True)
    out = tmp_path / "profile.yaml"
    lines = calibrate_convergence(paths, out, tmp_path / "report.json", draws=0)
    prof = yaml.safe_load(out.read_text())
    every = [v for fs in ln_f.values() for v in fs]
    assert prof["progress_sd"] == pytest.approx(math.sqrt(sum(v * v for v in every) / 4))
    assert prof["fit_progress_sd"] < 0.05  # the model made every fit run
    assert prof["progress_sd_from"] == (f"held-out checks: {', '.join(ln_f)} (4 runs)")
    assert any("the spread the held-out checks:" in line for line in lines)
    monkeypatch.setattr(split, "HELD_OUT_BAND", False)
    calibrate_convergence(paths, out, tmp_path / "report.json", draws=0)
    plain = yaml.safe_load(out.read_text())
    assert plain["progress_sd"] == pytest.approx(prof["fit_progress_sd"])
    assert "progress_sd_from" not in plain


def scaling_scenario(profile, **over):
    from simfed.spec import load_scenario

    from ..conftest import SCENARIOS

    base = {"training.steps": 32, "training.warmup_steps": 3, "training.lr": 3e-3,
            "convergence.model": "scaling", "convergence.profile": profile,
            "cluster.nodes": 8, "data.source": "kjv"}
    return load_scenario(SCENARIOS / "convergence-tiny.yaml", {**base, **over})


def test_calibrated_profile_predicts_time_to_target(scaling_profile):
    import json

    from simfed.engine import simulate

    assert scaling_profile["model"] == "scaling"
    assert [c["what"] for c in scaling_profile["checks"]] == ["across size"]
    assert scaling_profile["checks"][0]["seen"] is True  # split.py's first check: seen
    scn = scaling_scenario(scaling_profile, **{"convergence.target_loss": 3.5})
    out, _ = simulate(scn)
    conv = out["convergence"]
    from simfed.analysis.report import convergence_lines

    said = " | ".join(convergence_lines(out))
    assert ("development checks (their runs seen before the model was fixed), median |steps "
            "error|: across size ") in said
    assert "how sure (time to target): held out" not in said
    from rich.console import Console

    from simfed.analysis.report import print_report

    con = Console(record=True, width=300, file=io.StringIO())
    print_report(out, con)
    assert "median |steps error|: across size" in con.export_text()
    held = {**out, "convergence": {**conv, "checks": [{**conv["checks"][0], "seen": False}]}}
    con = Console(record=True, width=300, file=io.StringIO())
    print_report(held, con)
    assert "inside [p10, p90]" in con.export_text()  # printed as text, not rich markup
    assert conv["model"] == "scaling" and conv["rule"].startswith("a federated run")
    for a in out["algorithms"]:
        s = a["steps_to_target"]
        curve_ = a["convergence"]["loss_curve"]
        assert s is not None and curve_[s] <= 3.5 < curve_[s - 1]
        lo, hi = a["steps_to_target_interval"]
        assert lo is None or hi is None or lo <= hi
        k = a["aggregate_every"]
        off = bool(k) and s % k != 0 and s < 32
        assert a["fedavg_to_reach_target"] == off
        extra = a["aggregation_per_event_s"] if off else 0.0
        assert a["time_to_target_s"] == pytest.approx(sum(a["step_times_s"][:s]) + extra)
    again, _ = simulate(scn)
    assert json.dumps(again, sort_keys=True) == json.dumps(out, sort_keys=True)
    # the band draws each run's progress factor; a profile without progress_sd (fitted
    # before it) draws a constant loss shift of residual_sd instead
    assert scaling_profile["progress_sd"] > 0
    old = {k: v for k, v in scaling_profile.items() if k != "progress_sd"}
    before, _ = simulate(scaling_scenario(old, **{"convergence.target_loss": 3.5}))
    for a, b in zip(out["algorithms"], before["algorithms"], strict=True):
        assert a["convergence"]["loss_curve"] == b["convergence"]["loss_curve"]
        assert a["convergence"]["loss_curve_p90"] != b["convergence"]["loss_curve_p90"]
        # a progress factor leaves the untrained loss where it is
        assert a["convergence"]["loss_curve_p90"][0] == pytest.approx(
            a["convergence"]["loss_curve"][0])
    # a spread the held-out checks met in place of the fit runs': the band draws it and says so
    assert "fit runs' spread" in conv["band"]
    held_sd = {**scaling_profile, "progress_sd": 2 * scaling_profile["progress_sd"],
               "fit_progress_sd": scaling_profile["progress_sd"],
               "progress_sd_from": "held-out checks: x, y (7 runs)"}
    wider, _ = simulate(scaling_scenario(held_sd, **{"convergence.target_loss": 3.5}))
    assert "the spread held-out checks: x, y (7 runs) met" in wider["convergence"]["band"]
    for a, b in zip(out["algorithms"], wider["algorithms"], strict=True):
        assert a["convergence"]["loss_curve"] == b["convergence"]["loss_curve"]
        assert b["convergence"]["loss_curve_p90"][20] > a["convergence"]["loss_curve_p90"][20]


def test_extrapolation_and_data_constants_are_said(scaling_profile):
    from simfed.engine import simulate

    out, _ = simulate(scaling_scenario(scaling_profile, **{"training.lr": 0.1,
                                                           "model.hidden": 512,
                                                           "model.ffn_hidden": 1408}))
    ex = " | ".join(out["convergence"]["extrapolation"])
    assert "learning rate 0.1 outside the fitted 0.001..0.01" in ex
    assert "model size (non-embedding params)" in ex
    with pytest.raises(SpecError, match=r"convergence.data_constants: the profile was fitted "
                                        r"on kjv \(vocab 256\) .* \(missing: floor_coef, "):
        simulate(scaling_scenario(scaling_profile, **{
            "model.vocab": 1024, "convergence.data_constants": {"loss_floor": 1.0,
                                                                "unigram_loss": 4.0}}))
    consts = {"loss_floor": 1.0, "floor_coef": 0.5, "floor_size_exponent": 0.3,
              "noise_star_tokens": 3e4, "noise_loss_exponent": 3.0, "unigram_loss": 4.0,
              "optimal_lr": 2e-3}
    out, _ = simulate(scaling_scenario(scaling_profile, **{
        "model.vocab": 1024, "convergence.data_constants": consts}))
    conv = out["convergence"]
    assert "loss_floor 1" in conv["data_constants"] and "optimal_lr 0.002" in conv["data_constants"]
    assert conv["loss_init"] == pytest.approx(math.log(1024))
    assert conv["optimal_lr"] == pytest.approx(2e-3)


def test_a_bad_profile_is_one_line(scaling_profile):
    bad = {**scaling_profile, "params": {**scaling_profile["params"], "exponent": -3}}
    with pytest.raises(SpecError, match=r"convergence.profile.params.exponent: input should "
                                        r"be greater than 0"):
        from simfed.engine import simulate

        simulate(scaling_scenario(bad))
    extra = {**scaling_profile, "bogus": 1}
    with pytest.raises(SpecError, match=r"convergence\.profile\.bogus: unknown key"):
        from simfed.engine import simulate

        simulate(scaling_scenario(extra))


def test_segments_take_the_plateau_out():
    """A run that reaches the unigram loss, sits on it, then leaves it: "pre" ends at the first
    point within 0.1 nats of L_u; "post" starts where the loss falls 0.1 below it (steps counted
    from there, the model started at that loss); the plateau between is in neither."""
    from simfed.convergence.runs import segments

    s = shape(steps=64)
    run = Run(key="r", shape=s, eval_steps=(0, 8, 16, 24, 32, 40, 48, 56, 64),
              eval_loss=(5.5, 4.0, 3.05, 3.01, 3.0, 2.95, 2.6, 2.4, 2.3), tags={})
    pre, post = segments(run, 3.0)
    assert pre.shape.segment == "pre" and pre.eval_steps == (0, 8, 16)
    assert post.shape.segment == "post" and post.shape.loss_init == pytest.approx(2.9)
    # 2.9 is crossed at 40 + 8 * (2.95 - 2.9) / (2.95 - 2.6) = 41.1: start at step 41
    assert post.shape.start_step == 41 and post.eval_steps == (0, 7, 15, 23)
    assert post.eval_loss == (pytest.approx(2.9), 2.6, 2.4, 2.3)
    assert post.tags["escape_step"] == pytest.approx(40 + 8 * 0.05 / 0.35)
    # the model starts a post segment at its loss, and integrates the schedule from there
    c = scaling.loss_curves_many(X, [post.shape])[0][0]
    assert c[0] == pytest.approx(2.9) and len(c) == 64 - 41 + 1
    stuck = Run(key="s", shape=s, eval_steps=(0, 32, 64), eval_loss=(5.5, 3.02, 2.99), tags={})
    assert [g.shape.segment for g in segments(stuck, 3.0)] == ["pre"]


def test_check_plans_follow_the_split():
    """The held-out checks of split.py: which runs each fits and predicts, and its targets."""
    from simfed.convergence import split
    from simfed.convergence.calibrate_scaling import check_plans

    def run(hidden: int, steps: int, final: float, source: str = "") -> Run:
        s = shape(params=hidden * 1e4, steps=steps)
        return Run(key=f"h{hidden}/s{steps}{source}", shape=s, eval_steps=(0, steps),
                   eval_loss=(5.0, final), tags={"model": {"hidden": hidden}, "steps": steps},
                   source=source)

    runs = [run(h, n, 3.0 - h / 1000 - n / 10000) for h in (48, 64, 128, 256)
            for n in (128, 512)]
    runs += [run(384, 128, 2.5), run(64, 2048, 2.0), run(128, 2048, 1.9)]
    runs += [run(512, 128, 2.4), run(64, 4096, 1.8)]
    runs += [run(640, 128, 2.3), run(64, 8192, 1.7)]
    # the fifth check: fit additions at hidden 512 and 640 (its fit alone) and hidden 768
    lr_ends = [run(512, 128, 2.45, "kjv-h512-lr"), run(640, 128, 2.35, "kjv-h640-lr")]
    runs += [*lr_ends, run(768, 128, 2.2), run(1024, 128, 2.1)]
    # data made after the sixth check was scored: no check up to the sixth reads it, the
    # seventh fits it
    after = run(1024, 128, 2.0, "kjv-h1024-lr")
    seventh = run(1280, 128, 1.9)
    # the eighth check's runs come in two files; both are its check set
    eighth = [run(1536, 128, 1.85), run(1536, 128, 1.8, "kjv-h1536-b")]
    # the ninth's in three
    ninth = [run(1792, 128, 1.75), run(1792, 128, 1.74, "kjv-h1792-b"),
             run(1792, 128, 1.76, "kjv-h1792-c")]
    # the tenth's in two
    tenth = [run(1920, 128, 1.7), run(1920, 128, 1.71, "kjv-h1920-b")]
    plans = {p["what"]: p for p in check_plans([*runs, after, seventh, *eighth, *ninth,
                                                 *tenth])}
    assert list(plans) == ["across size", "past the horizon", "fresh size", "fresh horizon",
                           "third size", "third horizon", "fourth size", "fourth horizon",
                           "fifth size", "sixth size", "seventh size", "eighth size",
                           "ninth size", "tenth size", "tenth size, fresh-size targets",
                           "seventh size (lr damage fitted)"]
    # the ninth check was scored and read: only the tenth is held out, on the band of the
    # held-out checks' spread, at its own targets and the fresh size's
    assert [p["seen"] for p in plans.values()] == [True] * 13 + [False, False, True]
    assert [bool(p.get("held_out_band")) for p in plans.values()] == [False] * 13 + [
        True, True, False]
    t10, t10_usual = plans.pop("tenth size"), plans.pop("tenth size, fresh-size targets")
    assert t10["check_set"] == t10_usual["check_set"] == tenth
    assert {r.key for r in t10["fit_set"]} == {
        r.key for r in [*runs, after, seventh, *eighth, *ninth]}
    drop = t10_usual["targets"][0] - t10_usual["targets"][1]  # 0.5 to 0.75 of the drop
    assert t10["targets"][1] == pytest.approx(t10_usual["targets"][0])  # both at 0.5
    assert t10["targets"][0] - t10["targets"][1] == pytest.approx(drop)  # 0.25 to 0.5
    assert len(t10["targets"]) == len(split.TENTH_FRACTIONS) == 3
    assert plans["ninth size"]["check_set"] == ninth
    assert {r.key for r in plans["ninth size"]["fit_set"]} == {
        r.key for r in [*runs, after, seventh, *eighth]}
    assert plans.pop("ninth size")["targets"] != plans["eighth size"]["targets"]
    assert plans["eighth size"]["check_set"] == eighth
    assert {r.key for r in plans["eighth size"]["fit_set"]} == {
        r.key for r in [*runs, after, seventh]}
    assert plans.pop("eighth size")["targets"] != plans["seventh size"]["targets"]
    assert plans["seventh size"]["check_set"] == [seventh]
    assert {r.key for r in plans["seventh size"]["fit_set"]} == {r.key for r in [*runs, after]}
    variant = plans.pop("seventh size (lr damage fitted)")
    assert variant["free"] == ("lr_damage",) and "free" not in plans["seventh size"]
    assert variant["fit_set"] == plans["seventh size"]["fit_set"]
    assert variant["check_set"] == plans.pop("seventh size")["check_set"]
    assert {r.key for r in plans["sixth size"]["check_set"]} == {"h1024/s128"}
    assert {r.key for r in plans["sixth size"]["fit_set"]} == {r.key for r in runs} - {
        "h1024/s128"}
    assert {r.key for r in plans["fifth size"]["check_set"]} == {"h768/s128"}
    assert {r.key for r in plans["fifth size"]["fit_set"]} == {r.key for r in runs} - {
        "h768/s128", "h1024/s128"}
    # given the unsegmented runs, the sixth check is scored from step 0 too: same fit and
    # targets, the size's whole runs
    whole = [run(1024, 128, 2.1, "whole"), run(768, 128, 2.2, "whole")]
    zero = {p["what"]: p for p in check_plans(runs, [*whole, run(1024, 128, 2.0, "kjv-h1024-lr")])}
    assert list(zero) == [*plans, "sixth size, from step 0"]
    both = {p["what"]: p for p in check_plans([*runs, seventh],
                                               [*whole, run(1280, 128, 1.9, "whole")])}
    assert list(both) == [*plans, "seventh size", "sixth size, from step 0",
                          "seventh size, from step 0", "seventh size (lr damage fitted)",
                          "seventh size, from step 0 (lr damage fitted)"]
    assert [r.key for r in both["seventh size, from step 0"]["check_set"]] == ["h1280/s128whole"]
    assert both["seventh size, from step 0"]["seen"]
    assert both["seventh size, from step 0"]["targets"] == both["seventh size"]["targets"]
    # the eighth, judged from step 0: held out, the same fit and targets as from the plateau
    whole8 = [run(1536, 128, 1.85, "whole"), run(1536, 128, 1.8, "kjv-h1536-b whole")]
    all8 = {p["what"]: p for p in check_plans([*runs, seventh, *eighth],
                                              [*whole, run(1280, 128, 1.9, "whole"), *whole8])}
    assert list(all8)[-5:] == ["sixth size, from step 0", "seventh size, from step 0",
                               "eighth size, from step 0", "seventh size (lr damage fitted)",
                               "seventh size, from step 0 (lr damage fitted)"]
    assert all8["eighth size, from step 0"]["seen"]  # scored and read
    # the ninth, judged from step 0 (scored and read since), the same fit and targets as from
    # the plateau; the tenth, judged from step 0, held out, at both of its target sets
    whole9 = [run(1792, 128, 1.75, "whole"), run(1792, 128, 1.74, "kjv-h1792-b whole")]
    whole10 = [run(1920, 128, 1.7, "whole"), run(1920, 128, 1.71, "kjv-h1920-b whole")]
    all10 = {p["what"]: p for p in check_plans(
        [*runs, seventh, *eighth, *ninth, *tenth],
        [*whole, run(1280, 128, 1.9, "whole"), *whole8, *whole9, *whole10])}
    ninth0 = all10["ninth size, from step 0"]
    assert ninth0["check_set"] == whole9 and ninth0["seen"]
    assert ninth0["fit_set"] == all10["ninth size"]["fit_set"]
    assert ninth0["targets"] == all10["ninth size"]["targets"]
    for name in ("tenth size", "tenth size, fresh-size targets"):
        judged = all10[f"{name}, from step 0"]
        assert judged["check_set"] == whole10 and not judged["seen"]
        assert judged["held_out_band"]
        assert judged["fit_set"] == all10[name]["fit_set"]
        assert judged["targets"] == all10[name]["targets"]
    assert [r.key for r in zero["sixth size, from step 0"]["check_set"]] == ["h1024/s128whole"]
    assert zero["sixth size, from step 0"]["fit_set"] == zero["sixth size"]["fit_set"]
    assert zero["sixth size, from step 0"]["targets"] == zero["sixth size"]["targets"]
    assert zero["sixth size, from step 0"]["seen"]
    for what, p in plans.items():  # the lr ends enter the fifth and sixth checks' fits alone
        if what not in ("fifth size", "sixth size"):
            assert not {r.key for r in lr_ends} & {r.key for r in p["fit_set"] + p["check_set"]}
    runs = [r for r in runs if r not in lr_ends and r.key not in ("h768/s128", "h1024/s128")]
    fourth = {r.key for r in plans["fourth size"]["fit_set"]}
    assert fourth == {r.key for r in runs} - {"h640/s128", "h64/s8192", "h64/s4096"}
    assert plans["fourth horizon"]["fit_set"] == plans["fourth size"]["fit_set"]
    assert {r.key for r in plans["fourth size"]["check_set"]} == {"h640/s128"}
    assert {r.key for r in plans["fourth horizon"]["check_set"]} == {"h64/s8192"}
    third = {r.key for r in plans["third size"]["fit_set"]}
    assert third == {r.key for r in runs} - {"h512/s128", "h64/s4096", "h640/s128",
                                             "h64/s8192"}
    assert plans["third horizon"]["fit_set"] == plans["third size"]["fit_set"]
    assert {r.key for r in plans["third size"]["check_set"]} == {"h512/s128"}
    assert {r.key for r in plans["third horizon"]["check_set"]} == {"h64/s4096"}
    # the third horizon's h64 target goes to its best fit run: the 2048-step one (2.0)
    long64 = plans["third horizon"]["check_set"][0]
    assert plans["third horizon"]["targets"](long64)[3] == pytest.approx(2.0)
    key = {k: {r.key for r in p["check_set"]} for k, p in plans.items()}
    assert key["across size"] == {"h256/s128", "h256/s512"}
    assert key["past the horizon"] == {f"h{h}/s512" for h in (48, 64, 128, 256)}
    assert key["fresh size"] == {"h384/s128"}
    assert key["fresh horizon"] == {"h64/s2048", "h128/s2048"}
    for what in ("across size", "past the horizon"):  # the fresh runs never enter the first
        assert all(int(r.tags["steps"]) <= 512 and r.tags["model"]["hidden"] <= 256
                   for r in plans[what]["fit_set"])
    assert {r.key for r in plans["fresh size"]["fit_set"]} == {
        f"h{h}/s{n}" for h in (48, 64, 128, 256) for n in (128, 512)}
    # fresh size: fractions of the drop to the best 128-step fit run (h256: 3 - 0.256 - 0.0128)
    best128 = 3.0 - 0.256 - 0.0128
    assert plans["fresh size"]["targets"] == pytest.approx(split.targets(5.0, best128))
    # fresh horizon: per run, to the best fit run of its size (h64: its 512-step run)
    long64 = next(r for r in plans["fresh horizon"]["check_set"] if r.key == "h64/s2048")
    best64 = 3.0 - 0.064 - 0.0512
    assert plans["fresh horizon"]["targets"](long64) == pytest.approx(
        [5.0 - f * (5.0 - best64) for f in split.LONG_FRACTIONS])


def test_a_profile_fitted_before_the_last_parameters_reads_them_as_defaults():
    """The shipped profile with its trailing optional parameters taken out (covariance and
    draws one to three columns shorter) parses, with those parameters at their defaults and no
    variance; a row of another length is refused in one line."""
    from simfed.convergence import profile

    prof = yaml.safe_load((ROOT / "scenarios/convergence/kjv-scaling.yaml").read_text())
    prof = prof["convergence"]["profile"] if "convergence" in prof else prof
    for drop in (1, 2, 3):
        old = json.loads(json.dumps(prof))
        n = len(scaling.PARAMS) - drop
        for k in scaling.PARAMS[n:]:
            old["params"].pop(k, None)
        old["covariance"] = [r[:n] for r in old["covariance"][:n]]
        old["draws"] = [r[:n] for r in old["draws"]]
        p = profile.parse(old, "scaling")
        assert len(p.covariance) == len(p.covariance[0]) == len(scaling.PARAMS)
        assert all(len(r) == len(scaling.PARAMS) for r in p.draws)
        assert p.draws[0][-1] == profile.ScalingParams.model_fields[scaling.PARAMS[-1]].default
        assert p.covariance[-1][-1] == 0.0
    old["draws"] = [r[:-4] for r in old["draws"]]
    with pytest.raises(SpecError, match=f"every row must have {len(scaling.PARAMS)} values"):
        profile.parse(old, "scaling")


def test_the_shipped_band_is_the_held_out_checks_spread():
    """The shipped profile's band spread is what its report's held-out checks measured: the rms
    of ln f over the check runs of split.PROFILE_BAND_FROM, each under its own check's fit; the
    tenth check, held out when scored, was banded with the seventh to ninth's spread alone."""
    from simfed.convergence import split
    from simfed.convergence.calibrate_scaling import held_out_spread

    rep = json.loads((ROOT / "scenarios/convergence/kjv-scaling.json").read_text())
    prof = yaml.safe_load((ROOT / "scenarios/convergence/kjv-scaling.yaml").read_text())
    assert split.HELD_OUT_BAND
    shipped = held_out_spread(rep["checks"], split.PROFILE_BAND_FROM)
    assert prof["progress_sd"] == pytest.approx(shipped["sd"])
    assert shipped["checks"] == list(split.PROFILE_BAND_FROM)
    assert prof["progress_sd_from"].endswith(f"({shipped['runs']} runs)")
    assert prof["fit_progress_sd"] > prof["progress_sd"]  # the fit runs' is wider (docs)
    tenth = {c["what"]: c for c in rep["checks"]}["tenth size, from step 0"]
    assert not tenth["seen"]
    assert tenth["band_sd"] == pytest.approx(held_out_spread(rep["checks"])["sd"])
    assert tenth["band_from"]["checks"] == list(split.BAND_FROM_CHECKS)
