"""Convergence study files as inputs: `simfed calibrate --convergence` and the report refuse a
damaged study in one line naming the file, run and field (exit 2), and `realrun
converge-study` refuses to resume over a damaged or foreign file before it runs anything."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ..conftest import ROOT

STUDY = ROOT / "results" / "convergence" / "kjv-h48.json"


def simfed(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simfed.cli", *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)


def damaged(tmp_path, change) -> str:
    data = json.loads(STUDY.read_text())
    change(data)
    p = tmp_path / "s.json"
    p.write_text(json.dumps(data))
    return str(p)


def _set(path, value):
    def f(data):
        obj = data
        for k in path[:-1]:
            obj = obj[k]
        if value is KeyError:
            del obj[path[-1]]
        else:
            obj[path[-1]] = value
    return f


@pytest.mark.parametrize("change, message", [
    (_set(["runs"], KeyError), r"runs: required"),
    (_set(["runs", 0, "lr"], KeyError), r"runs\[0\]\.lr: required"),
    (_set(["runs", 0, "eval_loss", 3], 1e308), r"runs\[0\]\.eval_loss\[3\]: input should be "
                                                 r"less than or equal to 100"),
    (_set(["runs", 0, "eval_steps"], [0, 16, 8, *list(range(24, 129, 8))]),
     r"runs\[0\]: eval_steps must increase: 16 then 8 at point 2"),
    (_set(["runs", 0, "eval_steps", 0], 4), r"eval_steps must start at 0"),
    (_set(["model", "vocab"], "abc"), r"model\.vocab: input should be a valid integer"),
    (_set(["bogus"], 1), r"bogus: unknown key"),
    # before: a unigram loss of "12" (lax: 12 nats, above ln 256) ran the fit past 10 s
    (_set(["data", "unigram_loss_nats"], "12"), r"data\.unigram_loss_nats 12 must be below "
                                                r"the untrained loss ln\(model\.vocab\) = 5\.545"),
    (_set(["data", "entropy_floor_nats"], 3.5), r"entropy_floor_nats 3\.5 is above"),
    (_set(["model", "non_embedding_params"], 10**9), r"non_embedding_params 1000000000 exceeds"),
])
def test_a_damaged_study_is_one_line(tmp_path, change, message):
    path = damaged(tmp_path, change)
    res = simfed("calibrate", "--convergence", path, "--out", str(tmp_path / "p.yaml"))
    assert res.returncode == 2, res.stderr
    line = (res.stderr + res.stdout).strip()
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith("error: ") and path in line
    import re
    assert re.search(message, line), line
    assert not (tmp_path / "p.yaml").exists()


def test_nan_and_truncated_studies_are_refused(tmp_path):
    text = STUDY.read_text()
    nan = tmp_path / "nan.json"
    nan.write_text(text.replace('"eval_loss":[5.53', '"eval_loss":[NaN', 1))
    res = simfed("calibrate", "--convergence", str(nan), "--out", str(tmp_path / "p.yaml"))
    assert res.returncode == 2 and "not strict JSON" in res.stderr
    cut = tmp_path / "cut.json"
    cut.write_text(text[: len(text) // 2])
    res = simfed("calibrate", "--convergence", str(cut), "--out", str(tmp_path / "p.yaml"))
    assert res.returncode == 2 and "not JSON" in res.stderr


def test_converge_study_resumes_only_what_it_can_verify(tmp_path):
    out = tmp_path / "study"
    out.mkdir()
    (out / "kjv-h48.json").write_text(STUDY.read_text()[:1000])  # a run cut short
    res = subprocess.run([sys.executable, "-m", "realrun.cli", "converge-study", "--out",
                          str(out), "--only", "kjv-h48", "--quick", "--seeds", "0"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 2, res.stderr
    assert "kjv-h48.json: not JSON" in res.stderr and "Traceback" not in res.stderr
    # another experiment's (or a full-length study's) file is not resumed as --quick
    (out / "kjv-h48.json").write_text(STUDY.read_text())
    res = subprocess.run([sys.executable, "-m", "realrun.cli", "converge-study", "--out",
                          str(out), "--only", "kjv-h48", "--quick", "--seeds", "0"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 2 and "would mix them" in res.stderr, res.stderr


def report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simfed.convergence.report", *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_the_report_refuses_a_damaged_or_missing_study_in_one_line(tmp_path):
    """The report keeps simfed's error contract (it raised the reader's SpecError as a
    traceback, exit 1)."""
    cases = [(damaged(tmp_path, _set(["runs", 0, "lr"], KeyError)), r"runs\[0\]\.lr: required"),
             (str(tmp_path / "none.json"), r"file not found")]
    (tmp_path / "list.json").write_text("[1, 2]")
    cases.append((str(tmp_path / "list.json"), r"not a convergence study file"))
    for path, message in cases:
        res = report(path)
        assert res.returncode == 2, res.stderr
        line = res.stderr.strip()
        assert "\n" not in line and "Traceback" not in line, line
        assert line.startswith("error: ") and path in line
        import re
        assert re.search(message, line), line
        assert res.stdout == ""
    res = report(damaged(tmp_path, lambda d: d.update(runs=d["runs"][:3])))
    assert res.returncode == 0 and "| llama-h48 |" in res.stdout, res.stderr


def test_a_study_is_read_as_checked(tmp_path):
    """Numbers the schema accepts as strings ("52080", lax mode) reach the readers as numbers
    (the raw strings did: the report crashed dividing a string, exit 3)."""
    from simfed.spec.study import read_study_file

    def change(d):
        d["runs"] = d["runs"][:3]
        d["model"]["non_embedding_params"] = "52080"
        d["runs"][0]["noise"][1]["eval_loss"] = "5.5"

    path = damaged(tmp_path, change)
    data = read_study_file(path)
    assert data["model"]["non_embedding_params"] == 52080
    assert data["runs"][0]["noise"][1]["eval_loss"] == 5.5
    assert data["model"] == json.loads(STUDY.read_text())["model"]
    res = report(path)
    assert res.returncode == 0 and "| llama-h48 |" in res.stdout, res.stderr


_NO_SIZE = _set(["model", "non_embedding_params"], None)


@pytest.mark.parametrize("change", [
    _set(["what"], KeyError), _set(["data", "describe"], KeyError), _NO_SIZE])
def test_the_report_reads_optional_keys_as_their_defaults(tmp_path, change):
    """A key the schema makes optional reaches the report as its default (a deleted `what` or
    `data.describe` was a KeyError, a null `non_embedding_params` a TypeError: exit 3)."""
    from simfed.spec.study import read_study_file

    def both(d):
        d["runs"] = d["runs"][:3]
        change(d)

    path = damaged(tmp_path, both)
    res = report(path)
    assert res.returncode == 0 and "### kjv-h48" in res.stdout, res.stderr
    # without its non-embedding size the file is no size study: no size table
    assert ("| llama-h48 |" in res.stdout) == (change is not _NO_SIZE), res.stdout[-300:]
    data = read_study_file(path)
    assert data["what"] is not None and data["data"]["describe"] is not None
    run = json.loads(STUDY.read_text())["runs"][0]
    del run["aggregate_every"]  # optional: FSDP runs have none (calibrate read it as a KeyError)
    (tmp_path / "r.json").write_text(json.dumps({**json.loads(STUDY.read_text()),
                                                  "runs": [run]}))
    assert read_study_file(tmp_path / "r.json")["runs"][0]["aggregate_every"] is None
    assert "aggregate_every" not in read_study_file(tmp_path / "r.json",
                                                    defaults=False)["runs"][0]
