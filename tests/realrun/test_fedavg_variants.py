"""FedAvg's FL variants on 4 CPU ranks (gloo): FedNova-style weights by local steps, partial
participation, DiLoCo's outer Nesterov step. Each rank holds a different model; every rank checks
the round's result against the formula computed from all ranks' known parameters."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from realrun.fedavg import FedAvg, outer_step

from ..conftest import ROOT, SCENARIOS

WORLD = 4


def _params(rank: int, anchor: torch.Tensor) -> torch.Tensor:
    """Rank r's local model after its steps: the anchor moved by a rank-specific amount."""
    g = torch.Generator().manual_seed(100 + rank)
    return anchor + 0.1 * torch.randn(anchor.shape, generator=g)


def _model(flat: torch.Tensor) -> nn.Module:
    m = nn.Linear(3, 2)  # 8 parameters: weight (2, 3) then bias (2,)
    with torch.no_grad():
        m.weight.copy_(flat[:6].view(2, 3))
        m.bias.copy_(flat[6:])
    return m


def _flat(m: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def _worker(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        group = dist.new_group(list(range(WORLD)))
        anchor = torch.linspace(-1, 1, 8)
        local = [_params(r, anchor) for r in range(WORLD)]

        # 1. equal steps, all in: FedNova is plain FedAvg (the mean of the models)
        m = _model(anchor)
        fed = FedAvg(m, group, WORLD, "fp32", variant=True)
        with torch.no_grad():
            _write(m, local[rank])
        out = fed(steps_taken=4)
        assert out == {"participants": 4, "steps_mean": 4.0}
        torch.testing.assert_close(_flat(m), torch.stack(local).mean(0), rtol=0, atol=1e-6)

        # 2. steps 1..4: delta = mean(n) * mean((anchor - theta_g) / n_g)
        m = _model(anchor)
        fed = FedAvg(m, group, WORLD, "fp32", variant=True)
        with torch.no_grad():
            _write(m, local[rank])
        fed(steps_taken=rank + 1)
        per_step = torch.stack([(anchor - local[r]) / (r + 1) for r in range(WORLD)]).mean(0)
        torch.testing.assert_close(_flat(m), anchor - 2.5 * per_step, rtol=0, atol=1e-6)

        # 3. rank 3 missed the deadline: left out of the average, given its result
        m = _model(anchor)
        fed = FedAvg(m, group, WORLD, "fp32", variant=True)
        with torch.no_grad():
            _write(m, local[rank])
        out = fed(steps_taken=2, participate=rank != 3)
        assert out["participants"] == 3
        torch.testing.assert_close(_flat(m), torch.stack(local[:3]).mean(0), rtol=0, atol=1e-6)

        # 4. outer Nesterov, two rounds, against the formula (and SGD(nesterov=True) on the
        # pseudo-gradient)
        m = _model(anchor)
        fed = FedAvg(m, group, WORLD, "fp32", outer_optimizer="nesterov", outer_lr=0.7,
                     outer_momentum=0.9)
        ref = anchor.clone().requires_grad_()
        sgd = torch.optim.SGD([ref], lr=0.7, momentum=0.9, nesterov=True)
        for _ in range(2):
            start = _flat(m)
            with torch.no_grad():
                _write(m, _params(rank, start))
            delta = start - torch.stack([_params(r, start) for r in range(WORLD)]).mean(0)
            fed(steps_taken=3)
            ref.grad = delta.clone()
            sgd.step()
            torch.testing.assert_close(_flat(m), ref.detach(), rtol=0, atol=1e-5)
        # lr 1, momentum 0 is plain averaging
        buf = torch.zeros(8)
        torch.testing.assert_close(outer_step(anchor, anchor - local[0], buf, lr=1.0,
                                              momentum=0.0), local[0])
    finally:
        dist.destroy_process_group()


def _write(m: nn.Module, flat: torch.Tensor) -> None:
    m.weight.copy_(flat[:6].view(2, 3))
    m.bias.copy_(flat[6:])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_fedavg_variants_on_four_gloo_ranks():
    # fork: the parent has torch loaded already and no process group (a few seconds, not 30)
    mp.start_processes(_worker, args=(_free_port(),), nprocs=WORLD, join=True,
                       start_method="fork")


@pytest.mark.slow
def test_realrun_timed_rounds_and_outer_optimizer(tmp_path):
    """One short cpu4 launch: FL+FSDP with a deadline no group meets keeps the initial model
    (every group left out, every group re-synchronised to it); FL+HSDP with a budget every
    step fits in and the outer Nesterov step takes K steps in every group and learns."""
    cmd = [sys.executable, "-m", "realrun.cli", "run", str(SCENARIOS / "cpu4.yaml"),
           "--nproc", "4", "--out", str(tmp_path), "--timeout-s", "30",
           "--algorithm", "fl_fsdp,fl_hsdp", "--set", "training.steps=8",
           "--set", "algorithms.fl_fsdp.round_deadline_s=0.000001",
           "--set", "algorithms.fl_hsdp.round_budget_s=1000",
           "--set", "algorithms.fl_hsdp.outer_optimizer=nesterov"]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    late = json.loads((tmp_path / "fl_fsdp" / "summary.json").read_text())
    v = late["fl_variant"]
    assert v["timed"] == "deadline"
    for group in v["rounds_per_group"]:
        assert [r["participated"] for r in group] == [False, False]
        assert all(r["steps_taken"] == 1 and r["participants"] == 0 for r in group)
    assert late["eval_perplexity"] == late["untrained_eval_perplexity"]
    assert late["groups_identical"]
    fit = json.loads((tmp_path / "fl_hsdp" / "summary.json").read_text())
    v = fit["fl_variant"]
    assert (v["timed"], v["outer_optimizer"]) == ("budget", "nesterov")
    k = fit["fedavg"]["every"]
    for group in v["rounds_per_group"]:
        assert [r["steps_taken"] for r in group] == [k, k]
        assert all(r["participants"] == fit["plan"]["groups"] for r in group)
    assert fit["groups_identical"]
    assert fit["eval_perplexity"] < 0.9 * fit["untrained_eval_perplexity"]
