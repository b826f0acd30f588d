"""realrun's error contract for its output folder: checked before any process starts."""

from click.testing import CliRunner

from realrun.cli import main

from ..conftest import SCENARIOS


def test_unwritable_out_is_one_line_before_launch(tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    res = CliRunner().invoke(main, ["run", str(SCENARIOS / "cpu4.yaml"), "-a", "fsdp",
                                    "--out", str(blocker / "run")])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert lines == [f"error: --out {blocker / 'run'}: {blocker} is not a folder"]
    res = CliRunner().invoke(main, ["run", str(SCENARIOS / "cpu4.yaml"), "-a", "fsdp",
                                    "--out", "/proc/simfed-run"])
    assert res.exit_code == 2 and "cannot write in /proc" in res.output
