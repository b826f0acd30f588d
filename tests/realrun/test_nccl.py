"""NCCL on GPUs: the same runs with --device cuda, one process per visible GPU (needs CUDA)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from simfed.spec import read_trace

from ..conftest import ROOT, SCENARIOS

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_four_algorithms_on_nccl(tmp_path):
    gpus = torch.cuda.device_count()
    cmd = [sys.executable, "-m", "realrun.cli", "run", str(SCENARIOS / "cpu4.yaml"),
           "--algorithm", "all", "--device", "cuda", "--out", str(tmp_path), "--timeout-s", "60",
           "--set", "cluster.nodes=1", "--set", f"cluster.node.gpus={gpus}",
           "--set", "model.dtype=bf16", "--set", "algorithms.fl_fsdp.fedavg_dtype=bf16"]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    for name in ("fsdp", "hsdp", "fl_fsdp", "fl_hsdp"):
        s = json.loads((tmp_path / name / "summary.json").read_text())
        assert (s["backend"], s["world_size"]) == ("nccl", gpus)
        assert s["device"].startswith("cuda")
        assert s["eval_perplexity"] < 0.6 * s["untrained_eval_perplexity"], name
        assert s["groups_identical"] and s["replicas_identical"]
        meta, spans = read_trace(tmp_path / name / "trace_rank0.jsonl")
        assert meta["model"]["dtype"] == "bf16"
        comm = [x for x in spans if x.cat == "comm" and x.step >= 0]
        if gpus > 1:
            assert comm and all(x.attrs.get("timing") == "cuda_event" for x in comm)
