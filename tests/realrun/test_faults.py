"""realrun's faults: a rank killed inside a FedAvg round, a rank that hangs while its
peers wait in the FedAvg all-reduce, and a disk that fills during the run. Each ends `realrun
run` with one line naming the rank, within the collective timeout, and keeps the traces
written so far whole."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from realrun.errors import EXIT_BAD_INPUT, EXIT_PEER_LOST
from simfed.spec import read_trace

from ..conftest import ROOT, SCENARIOS

pytestmark = pytest.mark.slow

TIMEOUT_S = 6
# FL+FSDP on 4 ranks in 2 groups of 2 (shard groups {0,1} and {2,3}; FedAvg groups {0,2} and
# {1,3}), FedAvg after steps 1 and 3
SETS = ("--set", "training.steps=4", "--set", "algorithms.fl_fsdp.aggregate_every=2")


def realrun(out: Path, *args: str, fsize: int | None = None
            ) -> tuple[subprocess.CompletedProcess, float]:
    cmd = [sys.executable, "-m", "realrun.cli", "run", str(SCENARIOS / "cpu4.yaml"),
           "--nproc", "4", "--algorithm", "fl_fsdp", "--out", str(out), "-q",
           "--timeout-s", str(TIMEOUT_S), *SETS, *args]

    def limit_file_size() -> None:  # a disk that fills: writes past `fsize` bytes fail
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))  # (Python ignores SIGXFSZ)

    start = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=240,
                         env={**os.environ, "OMP_NUM_THREADS": "1"},
                         preexec_fn=limit_file_size if fsize else None)
    return res, time.monotonic() - start


def one_error_line(res: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in res.stdout + res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("error: ")
    return line


def assert_traces_whole(out: Path, ranks=range(4)) -> dict[int, set[int]]:
    """Every rank's trace parses to its last line; the steps each shows complete."""
    done = {}
    for rank in ranks:
        path = out / f"trace_rank{rank}.jsonl"
        assert path.read_bytes().endswith(b"\n"), path  # no torn line
        _, spans = read_trace(path)
        done[rank] = {x.step for x in spans if x.cat == "step"}
    return done


def test_a_rank_killed_inside_fedavg(tmp_path):
    res, _ = realrun(tmp_path, "--kill-rank", "2", "--kill-at-step", "1",
                     "--kill-in", "aggregation")
    assert res.returncode == EXIT_PEER_LOST
    line = one_error_line(res)
    assert line.startswith("error: rank 2 died (SIGKILL) after completing 1 step(s)"), line
    done = assert_traces_whole(tmp_path)
    assert done[2] == {0}  # it died in step 1's FedAvg round
    assert not (tmp_path / "summary.json").exists()


def test_a_rank_that_hangs_while_its_peers_are_in_the_fedavg_all_reduce(tmp_path):
    res, elapsed_s = realrun(tmp_path, "--kill-rank", "2", "--kill-at-step", "1",
                             "--kill-in", "aggregation", "--kill-signal", "STOP")
    assert res.returncode == EXIT_PEER_LOST
    line = one_error_line(res)
    assert line.startswith("error: rank 2 stopped responding: rank "), line
    assert f"gave up after {TIMEOUT_S:.1f} s in " in line and "the hung rank was killed" in line
    done = assert_traces_whole(tmp_path)
    assert done[2] == {0}
    # the run ends a few timeouts after the hang, not never (start-up is ~5-15 s on 2 cores)
    assert elapsed_s < 120


def test_a_disk_that_fills_during_the_run(tmp_path):
    res, _ = realrun(tmp_path, fsize=9_000)  # a rank's trace outgrows this in step 1 or 2
    assert res.returncode == EXIT_BAD_INPUT
    line = one_error_line(res)
    assert "trace_rank" in line and "File too large; the trace keeps its" in line, line
    done = assert_traces_whole(tmp_path)
    assert {0} <= set.union(*done.values()) and not (tmp_path / "summary.json").exists()
