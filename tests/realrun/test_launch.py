"""`realrun run` and `python -m realrun.train` before any training: bad input is one line
naming the field and the numbers, with a non-zero status and no traceback; torchrun's failure
report is turned into the culprit rank, a dead one or a hung one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from realrun.errors import EXIT_BAD_INPUT, EXIT_PEER_LOST
from realrun.launch import diagnose, reap_workers
from simfed.spec import write_trace

from ..conftest import ROOT, SCENARIOS

CPU4 = str(SCENARIOS / "cpu4.yaml")


def _cli(*args: str, module: str = "realrun.cli") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def _one_line_error(res: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in res.stderr + res.stdout
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_help_lists_run_bench_and_testbed():
    res = _cli("--help")
    assert res.returncode == 0
    for command in ("run", "bench", "testbed"):
        assert f"  {command} " in res.stdout


@pytest.mark.parametrize("args,expected", [
    (["--algorithm", "nope"],
     "algorithm 'nope' is not in this scenario; it has: fsdp, hsdp, fl_fsdp, fl_hsdp"),
    (["--algorithm", "fsdp", "--nproc", "3"],
     "--nproc 3: the scenario's cluster cpu-loopback has 2 nodes x 2 = 4 ranks"),
    (["--algorithm", "fsdp", "--set", "training.steps=0"], "training.steps: must be >= 1, got 0"),
    (["--algorithm", "fsdp", "--set", "training.steps"], "--set 'training.steps': expected KEY="),
    (["--algorithm", "fl_hsdp", "--set", "algorithms.fl_hsdp.shard_size=3"],
     "shard_size: 3 does not divide the 2 GPUs of a group"),
    (["--algorithm", "fsdp", "--kill-rank", "4"], "--kill-rank 4: ranks are 0..3"),
    (["--algorithm", "fsdp", "--set", "data.source=tokens", "--set", "data.path=nope.npy"],
     "data.path: file not found: nope.npy"),
    (["--algorithm", "fsdp", "--profile-steps", "3:1"], "--profile-steps '3:1': expected A:B"),
    # before: a rank's int(nan) once 4 processes were up (exit 4)
    (["--algorithm", "fsdp", "--timeout-s", "nan"], "--timeout-s nan: must be a finite"),
    # before: accepted, and the fault or the profile asked for never came (a full run, exit 0)
    (["--algorithm", "fsdp", "--profile-steps", "0:999"],
     "--profile-steps 0:999: the run has 24 steps"),
    (["--algorithm", "fsdp", "--kill-rank", "-2"], "--kill-rank -2: ranks are 0..3"),
    (["--algorithm", "fsdp", "--kill-rank", "0", "--kill-at-step", "999"],
     "--kill-at-step 999: the run has 24 steps"),
    (["--algorithm", "fsdp", "--kill-at-step", "1"], "--kill-at-step 1: give --kill-rank"),
])
def test_run_rejects_bad_input_in_one_line(tmp_path, args, expected):
    res = _cli("run", CPU4, "--out", str(tmp_path / "o"), *args)
    assert res.returncode == EXIT_BAD_INPUT
    assert expected in _one_line_error(res)


def test_train_outside_torchrun_says_how_to_launch(tmp_path):
    res = _cli(CPU4, "--algorithm", "fsdp", "--out", str(tmp_path), module="realrun.train")
    assert res.returncode == EXIT_BAD_INPUT
    assert _one_line_error(res) == (
        "error: rank 0: environment variable RANK is not set: launch with torchrun or "
        "`realrun run`"
    )


TORCHRUN_REPORT = """\
error: rank 1: step 3 (forward): all_gather over the shard group (ranks 0,1,2,3) failed
Root Cause (first observed failure):
[0]:
  time      : 2026-12-02_10:52:53
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 3 (pid: 4183)
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 4182)  (SIGTERM)
[2]:
  rank      : 2 (local_rank: 2)
  exitcode  : -9 (pid: 4184)  (SIGKILL)
"""


def test_diagnose_blames_the_killed_rank_not_the_first_to_notice(tmp_path):
    msg, code = diagnose(TORCHRUN_REPORT, tmp_path)
    assert msg == "rank 2 died (SIGKILL); the other ranks were stopped"
    assert code == EXIT_PEER_LOST


def test_diagnose_prefers_bad_input_over_lost_peers(tmp_path):
    log = ("error: rank 0: step 0 (forward): all_gather failed\n"
           "error: rank 3: data.path: file not found: x.npy\n"
           "  rank      : 0 (local_rank: 0)\n  exitcode  : 3 (pid: 1)\n"
           "  rank      : 3 (local_rank: 3)\n  exitcode  : 2 (pid: 2)\n")
    assert diagnose(log, tmp_path) == ("rank 3: data.path: file not found: x.npy",
                                       EXIT_BAD_INPUT)


def test_diagnose_names_the_hung_rank_the_others_waited_for(tmp_path):
    # FL+FSDP, rank 1 hangs: rank 0 times out in its shard group {0, 1}; rank 2 then loses rank 0
    # in FedAvg; rank 3, still waiting for rank 1 in FedAvg, is killed with it but not blamed
    log = ("error: rank 0: step 3 (forward): all_gather over the shard group (ranks 0,1) "
           "failed after 5.0 s (timeout 5 s; a peer rank died or hangs): Timed out\n"
           "error: rank 2: step 3 (aggregation): all_reduce over the fed group (ranks 0,2) "
           "failed after 0.1 s (timeout 5 s; a peer rank died or hangs): Connection reset\n"
           "  rank      : 0 (local_rank: 0)\n  exitcode  : 3 (pid: 1)\n"
           "  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 2)\n")
    msg, code = diagnose(log, tmp_path, frozenset({1, 3}))
    assert msg == ("rank 1 stopped responding: rank 0 gave up after 5.0 s in all_gather "
                   "over the shard group (step 3, forward); the hung rank was killed")
    assert code == EXIT_PEER_LOST


def test_reap_workers_kills_only_children_named_in_fresh_traces(tmp_path):
    since = time.time() - 1
    child = subprocess.Popen(["sleep", "60"])
    stranger = 1  # init: not our child, must be left alone
    for rank, pid in ((2, child.pid), (3, stranger)):
        write_trace(tmp_path / f"trace_rank{rank}.jsonl", {"rank": rank, "pid": pid}, [])
    assert reap_workers(tmp_path, os.getpid(), since) == {2}
    assert child.wait(timeout=10) == -signal.SIGKILL
