"""Golden output: `simfed run scenarios/512gpu.yaml --json` (the paper's scenario) must give
these exact bytes. A refactor must not move a single digit; a model change that is meant to
move them regenerates the file and says so in its commit:

    .venv/bin/simfed run scenarios/512gpu.yaml --json tests/golden/512gpu.json
"""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from simfed.cli import main

from ..conftest import SCENARIOS

GOLDEN = Path(__file__).parent


def test_paper_scenario_json_is_byte_identical(tmp_path):
    out = tmp_path / "512gpu.json"
    res = CliRunner().invoke(main, ["run", str(SCENARIOS / "512gpu.yaml"), "--json", str(out),
                                    "-q"])
    assert res.exit_code == 0, res.output
    want = (GOLDEN / "512gpu.json").read_bytes()
    got = out.read_bytes()
    if got != want:
        import difflib

        diff = "".join(list(difflib.unified_diff(
            want.decode().splitlines(True), got.decode().splitlines(True),
            "tests/golden/512gpu.json", "now", n=1))[:40])
        raise AssertionError(
            "simfed run scenarios/512gpu.yaml --json no longer gives tests/golden/512gpu.json "
            "byte for byte. If the model change is intended, regenerate it with\n"
            "  .venv/bin/simfed run scenarios/512gpu.yaml --json tests/golden/512gpu.json\n"
            "and say so in the commit message. First differences:\n" + diff)
