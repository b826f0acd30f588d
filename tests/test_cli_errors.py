"""The command line's error contract: bad input is one line and exit 2, before any work; an
internal error is one line naming a log file with the traceback, exit 3; never a traceback."""

import json

import pytest
import yaml
from click.testing import CliRunner

from simfed.cli import INTERNAL_ERROR, main
from simfed.spec import load_scenario_data

from .conftest import SCENARIOS

CPU4 = str(SCENARIOS / "cpu4.yaml")


def _run(*args):
    res = CliRunner().invoke(main, list(args))
    assert "Traceback" not in res.output
    return res


def _one_line_error(res, *needles):
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith(("error:", "Error:"))]
    assert len(lines) == 1, res.output
    for n in needles:
        assert n in lines[0], lines[0]


def test_output_paths_are_checked_before_any_work(tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    _one_line_error(_run("run", CPU4, "-q", "--json", str(blocker / "out.json")),
                    "--json", "is not a folder")
    _one_line_error(_run("run", CPU4, "-q", "--trace", str(blocker / "t")), "--trace")
    _one_line_error(_run("run", CPU4, "-q", "--json", str(tmp_path)), "--json")


def test_empty_algorithm_and_negative_trace_steps_are_refused(tmp_path):
    _one_line_error(_run("run", CPU4, "-q", "--algorithm", ""), "--algorithm", "empty")
    _one_line_error(_run("run", CPU4, "-q", "--trace", str(tmp_path), "--trace-steps", "-5"),
                    "--trace-steps")


@pytest.mark.parametrize("label", ["../x", "/tmp/abs", "a/b", "..", "hsdp"])
def test_a_label_is_a_name_not_a_path(tmp_path, label):
    data = load_scenario_data(SCENARIOS / "cpu4.yaml")
    data["algorithms"] = [{"name": "fsdp", "label": label}, {"name": "hsdp"}]
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data))
    _one_line_error(_run("run", str(p), "-q", "--trace", str(tmp_path / "t")),
                    "algorithms[0].label")
    assert not (tmp_path / "t").exists()


def test_an_internal_error_names_its_log_and_exits_3(monkeypatch, tmp_path):
    import simfed.engine

    def boom(*a, **k):
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(simfed.engine, "simulate", boom)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    res = _run("run", CPU4, "-q")
    assert res.exit_code == INTERNAL_ERROR != 2
    line = res.output.strip().splitlines()[-1]
    assert line.startswith("internal error") and "ZeroDivisionError" in line
    log = line.rsplit("traceback in ", 1)[1].rstrip(")")
    with open(log, encoding="utf-8") as f:
        text = f.read()
    assert "Traceback" in text and "boom" in text


def test_json_output_is_strict(tmp_path):
    out = tmp_path / "o.json"
    res = _run("run", CPU4, "-q", "--json", str(out))
    assert res.exit_code == 0, res.output
    json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


def test_a_sweep_name_is_a_name_not_a_path(tmp_path):
    sweep = tmp_path / "sw.yaml"
    sweep.write_text(f"sweep:\n  scenario: {CPU4}\n  name: ../escape\n"
                     "  vary: {training.steps: [2, 3]}\n")
    _one_line_error(_run("sweep", str(sweep), "--out", str(tmp_path / "o")), "sweep.name")
    assert not (tmp_path / "escape.csv").exists()


def test_collective_min_bytes_above_max_bytes_is_refused():
    """Before: an empty table, exit 0."""
    _one_line_error(_run("collective", CPU4, "--min-bytes", "8G", "--max-bytes", "1M"),
                    "--min-bytes 8G", "above --max-bytes 1M")


@pytest.mark.parametrize("axis", ["cluster.nodes=nan:4", "cluster.nodes=1:inf:x2",
                                  "cluster.nodes=1:4:nan", "cluster.nodes=1:1e400"])
def test_a_sweep_range_bound_that_is_not_finite_is_refused(tmp_path, axis):
    """Before: ValueError int(nan) / OverflowError (exit 3)."""
    _one_line_error(_run("sweep", CPU4, "-q", "-j", "1", "--out", str(tmp_path), "--vary",
                         axis), "is not a finite number")
    assert not list(tmp_path.iterdir())
