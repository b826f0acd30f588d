"""Every plot renders from a small input: the right axes, labels, lines and bars, and a
non-empty PNG and SVG (not pixel-perfect)."""

import json

import pytest
from click.testing import CliRunner
from matplotlib.collections import PolyCollection
from matplotlib.image import AxesImage

from simfed.cli import main
from simfed.engine import simulate
from simfed.plots import (
    plot_gantt,
    plot_heatmap,
    plot_perplexity,
    plot_phases,
    plot_scaling,
    plot_validation,
    save_figure,
)
from simfed.spec import load_scenario

from ..conftest import ROOT

TINY = str(ROOT / "tests" / "fixtures" / "tiny2x2.yaml")


def row(point, name, label, gpus, step_s, base_s, status="ok", **params):
    return {"point": point, "params": {"cluster.nodes": gpus // 4, **params}, "status": status,
            "error": "", "scenario": "toy", "cluster": {"world": gpus, "gpu": "A100"},
            "model": {"name": "m"}, "baseline": "FSDP", "name": name, "label": label,
            "step_time_s": step_s, "tokens_per_s": gpus * 4096 / step_s,
            "tokens_per_s_per_gpu": 4096 / step_s, "speedup": base_s / step_s}


def gpu_rows():
    rows = []
    for p, gpus in enumerate((64, 128, 256)):
        fsdp = 1.0 + gpus / 100
        rows.append(row(p, "fsdp", "FSDP", gpus, fsdp, fsdp))
        rows.append(row(p, "fl_fsdp", "FL+FSDP", gpus, 1.0, fsdp))
    return rows


def grid_rows():
    rows, p = [], 0
    for g in (1, 2, 4):
        for k in (1, 8):
            params = {"algorithms.fl_fsdp.group_nodes": g, "algorithms.fl_fsdp.aggregate_every": k}
            rows.append(row(p, "fsdp", "FSDP", 512, 3.0, 3.0, **params))
            if g == 4 and k == 1:
                rows.append({"point": p, "params": params, "status": "invalid", "name": "fl_fsdp",
                             "label": "FL+FSDP", "error": "does not divide"})
            else:
                rows.append(row(p, "fl_fsdp", "FL+FSDP", 512, 1.0 + g / 4 + 1 / k, 3.0, **params))
            p += 1
    return rows


@pytest.fixture(scope="module")
def tiny_run():
    return simulate(load_scenario(TINY, {"training.steps": 2}), trace=True, trace_steps=2)


def check_saved(fig, tmp_path, name="fig.png"):
    [written] = save_figure(fig, tmp_path / name)
    png = written.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5_000


def test_scaling(tmp_path):
    fig = plot_scaling(gpu_rows())
    ax_t, ax_s = fig.axes
    assert ax_t.get_xlabel() == "GPUs" and "tokens/s" in ax_t.get_ylabel()
    assert ax_s.get_ylabel().startswith("speedup over FSDP")
    labels = [t.get_text() for t in ax_t.get_legend().get_texts()]
    assert labels == ["FSDP", "FL+FSDP", "linear scaling from FL+FSDP at 64"]
    # the reference is a wide band under the lines: visible even where a line follows it
    *series, linear = ax_t.get_lines()
    assert linear.get_zorder() < min(s.get_zorder() for s in series)
    assert linear.get_linewidth() > 3 * max(s.get_linewidth() for s in series)
    fl = ax_s.get_lines()[0]
    assert list(fl.get_xdata()) == [64, 128, 256]
    assert list(fl.get_ydata()) == pytest.approx([1.64, 2.28, 3.56])
    assert any(t.get_text() == "3.6x" for t in ax_s.texts)
    check_saved(fig, tmp_path)


def test_scaling_splits_lines_by_other_swept_keys():
    rows = []
    for g in (1, 2):
        for r in gpu_rows():
            rows.append({**r, "params": {**r["params"], "algorithms.fl_fsdp.group_nodes": g}})
    labels = [t.get_text() for t in plot_scaling(rows).axes[0].get_legend().get_texts()]
    # FSDP does not depend on FL+FSDP's group size: one line; FL+FSDP: one per group size
    assert labels == ["FSDP", "FL+FSDP (group=1)", "FL+FSDP (group=2)",
                      "linear scaling from FL+FSDP at 64"]
    with pytest.raises(ValueError, match="no simulated rows"):
        plot_scaling([{"status": "invalid"}])


def test_heatmap(tmp_path):
    fig = plot_heatmap(grid_rows(), x="algorithms.fl_fsdp.aggregate_every",
                       y="algorithms.fl_fsdp.group_nodes", algorithm="fl_fsdp")
    ax = fig.axes[0]
    img = next(c for c in ax.get_children() if isinstance(c, AxesImage))
    assert img.get_array().shape == (3, 2)
    assert ax.get_xlabel() == "K (local steps between FedAvg) (fl_fsdp)"
    assert ax.get_ylabel() == "nodes per federation group (fl_fsdp)"
    texts = [t.get_text() for t in ax.texts]
    assert "n/a" in texts and "1.33x" in texts  # 3.0 / (1 + 1/4 + 1)
    assert "speedup over FSDP" in ax.get_title()
    check_saved(fig, tmp_path)
    fig = plot_heatmap(grid_rows(), x="algorithms.fl_fsdp.aggregate_every",
                       y="algorithms.fl_fsdp.group_nodes", algorithm="fl_fsdp",
                       value="step_time_s")
    assert "2.25 s" in [t.get_text() for t in fig.axes[0].texts]


def test_phases(tmp_path, tiny_run):
    out, _ = tiny_run
    fig = plot_phases(out)
    ax, ax_w = fig.axes[:2]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["FSDP", "HSDP", "FL+FSDP",
                                                           "FL+HSDP"]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"forward", "backward", "optimizer", "aggregation"} <= set(legend)
    assert len(ax.patches) == 4 * len(legend)  # one bar per algorithm per shown phase
    assert ax.get_ylabel() == "time per step (s)"
    assert len(ax_w.patches) == 4 * 3
    check_saved(fig, tmp_path)


def test_gantt(tmp_path, tiny_run):
    out, spans = tiny_run
    fig = plot_gantt(spans, results=out["algorithms"])
    assert len(fig.axes) == 4
    first = fig.axes[0]
    lanes = [t.get_text() for t in first.get_yticklabels()]
    assert lanes == ["host", "comm: shard", "GPU compute", "phase"][-len(lanes):]
    assert first.get_title(loc="left").startswith("FSDP: step 2 of rank 0 takes")
    bars = [c for c in first.collections if isinstance(c, PolyCollection)]
    assert len(bars) >= 3
    fl = [t.get_text() for t in fig.axes[2].get_yticklabels()]
    assert "comm: FedAvg" in fl  # the last step of FL+FSDP ends with a FedAvg round
    assert fig.axes[-1].get_xlabel() == "time from the start of the step (s)"
    check_saved(fig, tmp_path)
    with pytest.raises(ValueError, match="step 7 not traced"):
        plot_gantt(spans, step=7)


VALIDATE = {
    "runs": [
        {"name": "fsdp 4 nodes", "algorithm": "fsdp", "predicted_step_time_s": 1.1,
         "measured_step_time_s": 1.0,
         "predicted_phases_s": {"forward": 0.3, "backward": 0.7, "optimizer": 0.1},
         "measured_phases_s": {"forward": 0.3, "backward": 0.6, "optimizer": 0.1}},
        {"name": "fl_fsdp 4 nodes", "algorithm": "fl_fsdp", "predicted_step_time_s": 0.5,
         "measured_step_time_s": 0.55},
    ],
    "speedups": [{"name": "fl_fsdp vs fsdp", "predicted": 2.2, "measured": 1.8}],
}


def test_validation(tmp_path):
    fig = plot_validation(VALIDATE)
    parity, phases, speedups = fig.axes
    assert parity.get_xlabel() == "measured step time (s)"
    assert parity.get_ylabel() == "predicted step time (s)"
    assert "mean |error| 10%" in parity.get_title()
    assert len(phases.get_xticklabels()) == 1  # only the run that has both phase sets
    assert len(speedups.patches) == 2
    check_saved(fig, tmp_path)


def test_validation_marks_fit_and_check_apart():
    runs = [dict(r, split=sp) for r, sp in zip(VALIDATE["runs"], ("fit", "check"), strict=True)]
    runs.append({"name": "hsdp 4 nodes", "algorithm": "hsdp", "split": "fit",
                 "predicted_step_time_s": 1.25, "measured_step_time_s": 1.0})
    parity = plot_validation({"runs": runs}).axes[0]
    title = parity.get_title()
    # fit: +10% and +25% (median 17.5%); check: -9.1%
    assert "fit median |error| 17.5%" in title and "check median |error| 9.1%" in title
    # a repeated FSDP run that only pairs a speedup does not count (validate's summary agrees)
    repeat = {"name": "fsdp K4", "algorithm": "fsdp", "split": "check", "baseline": True,
              "predicted_step_time_s": 2.0, "measured_step_time_s": 1.0}
    assert "check median |error| 9.1%" in plot_validation({"runs": [*runs, repeat]}
                                                           ).axes[0].get_title()
    assert [t.get_text() for t in parity.get_legend().get_texts()][-2:] == ["fit set",
                                                                            "check set"]
    from matplotlib.collections import PathCollection

    points = [c for c in parity.collections
              if isinstance(c, PathCollection) and len(c.get_offsets())]
    assert len(points) == 3
    assert points[1].get_facecolors()[0][3] == 1  # the check run: filled
    assert all(len(p.get_facecolors()) == 0 or p.get_facecolors()[0][3] == 0
               for p in (points[0], points[2]))  # fit runs: hollow
    # labelled only outside 10%: the +25% run, not the -9.1% one
    assert [t.get_text() for t in parity.texts] == ["hsdp 4 nodes (+25%)"]


def test_validation_subsets():
    assert len(plot_validation({"speedups": VALIDATE["speedups"]}).axes) == 1
    runs = [{k: v for k, v in r.items() if "phases" not in k} for r in VALIDATE["runs"]]
    assert len(plot_validation({"runs": runs}).axes) == 1
    with pytest.raises(ValueError, match="nothing to compare"):
        plot_validation({"runs": [{"name": "x", "predicted_step_time_s": 1.0}]})


def summary(algorithm, step_s, losses):
    return {"algorithm": algorithm, "title": algorithm.upper(), "world_size": 4,
            "step_times_s": [step_s] * len(losses), "train_loss": losses,
            "train_perplexity": [2.718281828 ** x for x in losses],
            "eval_perplexity": 2.718281828 ** (losses[-1] + 0.1),
            "untrained_eval_perplexity": 1024.0, "floor_perplexity": 4.0, "scenario": "cpu4"}


def test_perplexity(tmp_path):
    for name, step in (("fsdp", 2.0), ("fl_fsdp", 1.0)):
        d = tmp_path / name
        d.mkdir()
        (d / "summary.json").write_text(json.dumps(summary(name, step, [6.0, 4.0, 3.0])))
    from simfed.plots import load_summaries

    fig = plot_perplexity(load_summaries([tmp_path / "fsdp", tmp_path / "fl_fsdp" /
                                          "summary.json"]))
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    assert ax.get_xlabel().startswith("wall-clock training time (s")
    train = ax.get_lines()[0]
    assert list(train.get_xdata()) == [2.0, 4.0, 6.0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[0] == "FSDP (4 ranks): train" and labels[1].startswith("FSDP (4 ranks): eval")
    assert len(labels) == 4
    check_saved(fig, tmp_path)


def test_save_png_and_svg_reproducibly(tmp_path):
    fig = plot_validation({"speedups": VALIDATE["speedups"]})
    both = save_figure(fig, tmp_path / "a")
    assert [p.name for p in both] == ["a.png", "a.svg"]
    assert b"<svg" in both[1].read_bytes()[:2000]
    [svg] = save_figure(fig, tmp_path / "b.svg")
    assert svg.read_bytes() == both[1].read_bytes()  # no dates, fixed ids


def test_plot_command(tmp_path):
    runner = CliRunner()
    res = runner.invoke(main, ["plot", "phases", TINY, "--set", "training.steps=2", "--out",
                               str(tmp_path / "p.png")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "p.png").stat().st_size > 5_000
    res = runner.invoke(main, ["plot", "gantt", TINY, "-a", "FL+FSDP", "--trace-steps", "2",
                               "--out", str(tmp_path / "g")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "g.png").exists() and (tmp_path / "g.svg").exists()
    v = tmp_path / "validate.json"
    v.write_text(json.dumps(VALIDATE))
    res = runner.invoke(main, ["plot", "validation", str(v), "--out", str(tmp_path / "v.png")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["plot", "validation", str(tmp_path / "missing.json")])
    assert res.exit_code == 2 and "error: file not found" in res.output


def test_plot_command_from_sweep_files(tmp_path):
    runner = CliRunner()
    res = runner.invoke(main, ["sweep", TINY, "--vary", "cluster.nodes=1,2,4",
                               "--vary", "algorithms.fl_fsdp.aggregate_every=1,2",
                               "--set", "training.steps=2", "--out", str(tmp_path), "-q",
                               "-j", "1"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["plot", "scaling", str(tmp_path / "tiny2x2.csv"),
                               "--where", "algorithms.fl_fsdp.aggregate_every=2",
                               "--out", str(tmp_path / "s.png")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["plot", "heatmap", str(tmp_path / "tiny2x2.json"),
                               "--algorithm", "fl_fsdp", "--out", str(tmp_path / "h.png")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["plot", "heatmap", str(tmp_path / "tiny2x2.json"),
                               "--algorithm", "FL+FSDP", "--baseline", "HSDP",
                               "--out", str(tmp_path / "h2.png")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["plot", "heatmap", str(tmp_path / "tiny2x2.json"),
                               "--algorithm", "nope"])
    assert res.exit_code == 2 and "no rows for algorithm 'nope'" in res.output


def test_gantt_of_realrun_traces():
    """realrun writes streams `comm:shard`, set-up at step -1 and evaluation after the last
    step: the default step is the last one with a step span."""
    from simfed.spec import Span

    spans = [Span("setup", "host", 0, -1, 0.0, 0.1, stream="host"),
             Span("step", "step", 0, 0, 0.1, 1.0, stream="step"),
             Span("forward", "phase", 0, 0, 0.1, 0.4, stream="phase"),
             Span("backward", "phase", 0, 0, 0.5, 0.6, stream="phase"),
             Span("all_gather", "comm", 0, 0, 0.1, 0.1, group="shard", stream="comm:shard"),
             Span("all_reduce", "comm", 0, 0, 1.0, 0.1, group="fed", stream="comm:fed"),
             Span("eval", "host", 0, 1, 1.2, 0.5, stream="host")]
    fig = plot_gantt({"FL+FSDP": spans})
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["comm: FedAvg", "comm: shard",
                                                           "phase"]
    assert ax.get_title(loc="left") == "FL+FSDP: step 1 of rank 0 takes 1.00 s"


@pytest.mark.parametrize("key, value, needle", [
    # before: TypeError len() of a float / float() of a list (exit 3)
    ("step_times_s", 1.5, "step_times_s: expected a list"),
    ("step_times_s", [[1.0], 2.0, 3.0], "step_times_s[0]"),
    ("train_perplexity", 7.0, "train_perplexity: expected a list"),
    # before: drawn silently
    ("step_times_s", [1.0, float("nan"), 1.0], "step_times_s[1]"),
    ("step_times_s", [1.0, -2.0, 1.0], "step_times_s[1]"),
    ("train_loss", [6.0, "a", 3.0], "train_loss[1]"),
])
def test_a_damaged_summary_is_one_line(tmp_path, key, value, needle):
    from click.testing import CliRunner

    from simfed.cli import main

    p = tmp_path / "summary.json"
    p.write_text(json.dumps({**summary("fsdp", 1.0, [6.0, 4.0, 3.0]), key: value}))
    res = CliRunner().invoke(main, ["plot", "perplexity", str(p), "-o",
                                    str(tmp_path / "o.png")])
    assert res.exit_code == 2, res.output
    assert res.output.startswith(f"error: {p}: {needle}"), res.output
    assert len(res.output.strip().splitlines()) == 1


def test_a_diverged_run_still_plots(tmp_path):
    """NaN and infinite losses are what a run that diverged writes: drawn, not refused."""
    p = tmp_path / "summary.json"
    s = summary("fsdp", 1.0, [6.0, float("nan"), float("inf")])
    p.write_text(json.dumps(s))
    from simfed.plots import load_summaries

    check_saved(plot_perplexity(load_summaries([p])), tmp_path)


def test_size_study_panels_use_the_lr_each_size_has():
    """One panel per size: lr 3e-3 where the size has the central comparison there, else the
    paper's 3e-4, with FL+FSDP 8 x 4 where 32 x 4 was not run."""
    from simfed.plots import plot_size_study

    def study(name, n, keys):
        runs = [{"key": k, "seed": 0, "steps": 128, "eval_steps": [0, 64, 128],
                 "eval_loss": [5.5, 3.0, 2.5]} for k in keys]
        return {"model": {"name": name, "non_embedding_params": n, "params": n},
                "data": {"unigram_loss_nats": 2.94}, "runs": runs}

    small = study("llama-h64", 9e4, ["fsdp/n32/k0/lr0.003", "fl_fsdp/n32/k8/lr0.003",
                                     "fsdp/n1/k0/lr0.003", "fsdp/n32/k0/lr0.0003"])
    large = study("llama-h1792", 7.2e7, ["fsdp/n32/k0/lr0.0003", "fl_fsdp/n8/k8/lr0.0003",
                                         "fsdp/n1/k0/lr0.0003", "fl_fsdp/n4/k4/lr0.0003"])
    fig = plot_size_study([large, small])
    a, b = fig.axes[:2]
    assert a.get_title().endswith("lr 0.003") and b.get_title().endswith("lr 0.0003")
    assert [line.get_label() for line in b.get_lines()[:3]] == [
        "FSDP, 128 sequences", "FL+FSDP, 8 groups x 4, K = 8", "one group of 4"]
    assert len(a.get_lines()) == len(b.get_lines()) == 4  # three shapes and the unigram loss
    assert "FL+FSDP, 32 groups x 4, K = 8" in [line.get_label() for line in a.get_lines()]
