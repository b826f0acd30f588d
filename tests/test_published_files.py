"""A published-measurements folder with a bad entry is a one-line error naming the file, the
entry and the field, before anything is simulated (simfed/calibration/published_files.py)."""

import copy
import shutil
from pathlib import Path

import pytest
import yaml

from simfed.calibration.published import load_cases, speedup_cases
from simfed.calibration.published_collectives import load as load_collectives
from simfed.spec.schema import SpecError

PUBLISHED = Path(__file__).resolve().parents[1] / "validation" / "published"


@pytest.fixture
def folder(tmp_path):
    """A copy of the published folder beside a copy of scenarios/ (the cases include
    ../../scenarios/...), so every relative path still resolves."""
    dst = tmp_path / "validation" / "published"
    shutil.copytree(PUBLISHED, dst)
    shutil.copytree(PUBLISHED.parents[1] / "scenarios", tmp_path / "scenarios")
    return dst


def _mutate(folder: Path, name: str, change) -> None:
    data = yaml.safe_load((folder / name).read_text())
    change(data)
    (folder / name).write_text(yaml.safe_dump(data))


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_the_shipped_files_load():
    cases = load_cases(PUBLISHED)
    assert len(cases) == 383 and len({c["name"] for c in cases}) == 383
    assert sum(bool(c.get("study")) for c in cases) == 270
    coll = load_collectives(PUBLISHED / "collectives.yaml")
    assert coll["tables"] and coll["cases"] and "claims" in coll


@pytest.mark.parametrize("change, expected", [
    (lambda d: d["cases"][0].update(set="train"), "cases[0].set: input should be 'fit' or 'check'"),
    (lambda d: d["cases"][1].update(published_tokens_per_s_per_gpu="fast"),
     "cases[1].published_tokens_per_s_per_gpu: input should be a valid number"),
    (lambda d: d["cases"][1].update(published_tokens_per_s_per_gpu=-1),
     "cases[1].published_tokens_per_s_per_gpu: input should be greater than 0, got -1"),
    (lambda d: d["cases"][1].update(published_peak_memory_GiB=0),
     "cases[1].published_peak_memory_GiB: input should be greater than 0, got 0"),
    (lambda d: d["cases"][2].update(scenari="x.yaml"), "cases[2].scenari: extra inputs"),
    (lambda d: d["cases"][3].pop("source"), "cases[3].source: missing"),
    (lambda d: d["cases"].__setitem__(0, 5), "cases[0]: expected a mapping, got 5"),
    (lambda d: d.update(cases={"a": 1}), "cases: expected a list of entries, got dict"),
])
def test_a_bad_published_run_names_its_field(folder, change, expected):
    _mutate(folder, "cases.yaml", change)
    with pytest.raises(SpecError) as exc:
        load_cases(folder)
    msg = _one_line(exc)
    assert str(folder / "cases.yaml") in msg and expected in msg


def test_repeated_names_point_at_the_first(folder):
    n = len(load_cases(folder))
    _mutate(folder, "cases.yaml", lambda d: d["cases"].append(copy.deepcopy(d["cases"][4])))
    with pytest.raises(SpecError, match=rf"cases\[{n}\]\.name: '.*' repeats cases\[4\]"):
        load_cases(folder)


@pytest.mark.parametrize("text, expected", [
    ("cases: [1, 2", "invalid YAML"),
    ("cases: &a [*a]", "alias refers to a value that contains it"),
    ("cases: []\ncases: []\n", "duplicate key"),
    ("- 1\n- 2\n", "expected a mapping with a list of entries, got list"),
    ("cases: 0\n", "cases: expected a list of entries, got int"),  # before: taken as none
])
def test_a_malformed_file_is_one_line(folder, text, expected):
    (folder / "cases.yaml").write_text(text)
    with pytest.raises(SpecError) as exc:
        load_cases(folder)
    assert expected in _one_line(exc)


def test_an_undecodable_file_is_one_line(folder):
    (folder / "speedups.yaml").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(SpecError) as exc:
        speedup_cases(folder)
    assert "speedups.yaml is UTF-16, not UTF-8" in _one_line(exc)


@pytest.mark.parametrize("change, expected", [
    (lambda c: c["published"].update(baseline="abc"),
     "cases[0].published.baseline: input should be a valid number"),
    (lambda c: c["published"].pop("variant"), "cases[0].published.variant: missing"),
    (lambda c: c.update(variant=[1, 2]), "cases[0].variant: input should be a valid dictionary"),
    # a scenario error inside a case names the case, then the scenario's own field
    (lambda c: c.update(variant={"training.nope": 1}), "cases[0] (torchao-8xh100-llama3-8b-"
                                                       "float8-tensorwise): training.nope: "
                                                       "unknown key"),
])
def test_a_bad_speedup_names_its_field(folder, change, expected):
    _mutate(folder, "speedups.yaml", lambda d: change(d["cases"][0]))
    with pytest.raises(SpecError) as exc:
        speedup_cases(folder)
    assert expected in _one_line(exc)


@pytest.mark.parametrize("change, expected", [
    (lambda d: d["tables"][0].update(rows=[[1, 2, 3]]), "tables[0].rows[0]: tuple"),
    (lambda d: d["tables"][0]["rows"].__setitem__(0, [1048576, -3]),
     "tables[0].rows[0][1]: input should be greater than 0, got -3"),
    (lambda d: d["tables"][0].update(op="broadcast"), "tables[0].op: input should be"),
    (lambda d: d["cases"][0].pop("nbytes"), "cases[0].nbytes: missing"),
])
def test_a_bad_collective_entry_names_its_field(folder, change, expected):
    path = folder / "collectives.yaml"
    _mutate(folder, "collectives.yaml", change)
    with pytest.raises(SpecError) as exc:
        load_collectives(path)
    assert str(path) in _one_line(exc) and expected in str(exc.value)


@pytest.mark.parametrize("change, expected", [
    (lambda d: d["claims"].update(p90_abs_error="wide"),
     "claims.p90_abs_error: expected a number, got 'wide'"),
    (lambda d: d["claims"]["widen"].update(framework=True),
     "claims.widen.framework: expected a number, got True"),
    (lambda d: d["claims"].update(widen=[1]), "claims.widen: expected a mapping, got [1]"),
])
def test_a_bad_claim_names_its_field(folder, change, expected):
    from simfed.calibration.published import load_claims

    _mutate(folder, "cases.yaml", change)
    with pytest.raises(SpecError) as exc:
        load_claims(folder)
    assert expected in _one_line(exc)
