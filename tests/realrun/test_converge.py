"""The convergence emulator's identities (in one process, no torchrun): FL with one group is FSDP;
FL with K = 1 and plain SGD is synchronous training on the union of the groups' batches (and
with AdamW it is not); FedAvg leaves every group with the mean; the noise-scale estimator
matches per-sequence gradients; the natural-language corpus is installed and is text.
The comparison with real 4-process runs is in test_runs.py."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from realrun.converge import GroupedTrainer, emulate
from realrun.data import kjv_bytes, load_corpus
from simfed.spec import load_scenario

from ..conftest import ROOT, SCENARIOS

BASE = SCENARIOS / "convergence-tiny.yaml"
SMALL = {"cluster.nodes": 4, "training.steps": 6, "training.eval_sequences": 8,
         "training.lr": 3e-3, "training.warmup_steps": 1}


def scenario(**over):
    return load_scenario(BASE, {**SMALL, **{k.replace("__", "."): v for k, v in over.items()}})


def run(sc, name, **kw):
    return emulate(sc, sc.algorithm(name), load_corpus(sc, BASE), **kw)


def test_fl_with_one_group_is_fsdp():
    sc = scenario(algorithms__fl_fsdp__group_nodes=4)
    fl, fsdp = run(sc, "fl_fsdp"), run(sc, "fsdp")
    assert fl.groups == 1
    assert fl.train_loss == fsdp.train_loss
    assert fl.eval_loss == fsdp.eval_loss


def test_hsdp_is_fsdp_and_fl_hsdp_is_fl_fsdp_with_equal_groups():
    sc = scenario()
    assert run(sc, "hsdp").train_loss == run(sc, "fsdp").train_loss
    fl_fsdp, fl_hsdp = run(sc, "fl_fsdp"), run(sc, "fl_hsdp")
    assert fl_fsdp.groups == fl_hsdp.groups == 4
    assert fl_fsdp.train_loss == fl_hsdp.train_loss


def test_fl_with_k1_and_sgd_is_synchronous_training_and_with_adamw_it_is_not():
    # averaging G models after one SGD step from a common start = one step on the mean gradient
    sgd = scenario(training__optimizer="sgd", training__lr=0.5, training__weight_decay=0.0,
                   algorithms__fl_fsdp__aggregate_every=1)
    fl, sync = run(sgd, "fl_fsdp"), run(sgd, "fsdp")
    assert fl.groups == 4 and sync.groups == 1
    np.testing.assert_allclose(fl.eval_loss, sync.eval_loss, rtol=0, atol=2e-6)
    assert fl.eval_loss[-1] < fl.eval_loss[0] - 0.01  # it trained
    adam = scenario(algorithms__fl_fsdp__aggregate_every=1)
    fl, sync = run(adam, "fl_fsdp"), run(adam, "fsdp")
    assert abs(fl.eval_loss[-1] - sync.eval_loss[-1]) > 1e-3  # local Adam moments differ


def test_fedavg_leaves_every_group_with_the_mean_model():
    sc = scenario(algorithms__fl_fsdp__aggregate_every=100)
    tr = GroupedTrainer(sc, sc.algorithm("fl_fsdp"), load_corpus(sc, BASE), seed=0,
                        eval_every=6)
    tr.run()  # the last step aggregates (after the last step, as the paper's code)
    for p in tr.params:
        assert torch.equal(p[0], p[-1])
    before = [p.detach().clone() for p in tr.params]
    with torch.no_grad():
        for p in tr.params:
            p.add_(torch.randn_like(p))
        noisy = [p.detach().clone() for p in tr.params]
    tr.fedavg()
    for p, n in zip(tr.params, noisy, strict=True):
        torch.testing.assert_close(p[1], n.mean(dim=0))
    assert any(not torch.equal(p, b) for p, b in zip(tr.params, before, strict=True))


def test_noise_scale_matches_per_sequence_gradients():
    """B_simple = tr(Sigma)/|G|^2: the two-batch estimator against the direct estimate from the
    per-sequence gradients of the same batch (their covariance and mean)."""
    sc = scenario(**{"cluster.nodes": 8})
    tr = GroupedTrainer(sc, sc.algorithm("fsdp"), load_corpus(sc, BASE), seed=0, eval_every=6)
    est = tr.gradient_noise(0, small=1)  # chunks of one sequence
    tok = tr.batch(0)[0]
    params = tuple(p[0].detach() for p in tr.params)
    grads = torch.func.vmap(torch.func.grad(tr._loss), in_dims=(None, 0, 0))(
        params, tok[:, None, :-1], tok[:, None, 1:])
    flat = torch.cat([g.reshape(tok.shape[0], -1).double() for g in grads], dim=1)
    n, t = flat.shape[0], sc.training.seq_len
    mean = flat.mean(0)
    trace_per_seq = float(flat.var(dim=0, unbiased=True).sum())  # per-sequence covariance
    g2 = float(mean.pow(2).sum()) - trace_per_seq / n  # unbiased |G|^2
    assert est["trace_sigma"] == pytest.approx(trace_per_seq * t, rel=1e-6)
    assert est["grad_sq"] == pytest.approx(g2, rel=1e-6)
    assert est["b_simple_tokens"] > 0


def test_the_natural_language_corpus_is_installed_text():
    data = kjv_bytes()
    assert len(data) > 4_000_000
    text = bytes(data[:200]).decode("ascii")
    assert text.startswith("In the beginning God created the heaven and the earth.")
    letters = np.isin(data, np.frombuffer(b"abcdefghijklmnopqrstuvwxyz ", np.uint8)).mean()
    assert letters > 0.8  # prose, not markup


def test_converge_cli_writes_curves_and_refuses_bad_input(tmp_path):
    out = tmp_path / "c.json"
    cmd = [sys.executable, "-m", "realrun.cli", "converge", str(BASE), "-a", "fl_fsdp",
           "--seeds", "0,1", "--eval-every", "3", "--json", str(out),
           *[f"--set={k}={v}" for k, v in SMALL.items()]]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr
    curves = json.loads(out.read_text())["curves"]
    assert [c["seed"] for c in curves] == [0, 1]
    assert curves[0]["eval_steps"] == [0, 3, 6]
    assert curves[0]["eval_loss"] != curves[1]["eval_loss"]  # another initialisation
    bad = subprocess.run([*cmd[:5], "--eval-every", "-1"], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert bad.returncode == 2
    assert bad.stderr.strip() == "error: --eval-every: must be >= 0, got -1"


def test_ring_reduction_in_bf16_is_a_chain_of_rounded_partial_sums():
    """ring_grads against a hand-written reduction: every rank's gradient (autograd, one rank at
    a time), FSDP1's pre-division (16 ranks: f = 4), a left-to-right sum rounded to bf16 at each
    hop, the post-division (16 / 4); and an fp32 ring equals the exact mean gradient."""
    sc = scenario(**{"cluster.nodes": 4})
    corpus = load_corpus(sc, BASE)
    tr = GroupedTrainer(sc, sc.algorithm("fsdp"), corpus, seed=0, eval_every=6,
                        ring_dtype="bf16")
    tok = tr.batch(0)
    grads, loss = tr.ring_grads(tok)
    n = tr.group_size
    assert n == 16
    per_rank = []
    for r in range(n):
        params = [p[0].detach().clone().requires_grad_() for p in tr.params]
        lr = tr._loss(tuple(params), tok[0, r:r + 1, :-1], tok[0, r:r + 1, 1:])
        per_rank.append(torch.autograd.grad(lr, params))
    for j, g in enumerate(grads):
        acc = (per_rank[0][j] / 4).to(torch.bfloat16)
        for r in range(1, n):
            acc = acc + (per_rank[r][j] / 4).to(torch.bfloat16)
        want = acc.float() / 4
        torch.testing.assert_close(g[0], want, rtol=1e-2, atol=1e-6)
    exact, _ = tr._grad(tuple(tr.params), tok[..., :-1], tok[..., 1:])
    fp32 = GroupedTrainer(sc, sc.algorithm("fsdp"), corpus, seed=0, eval_every=6,
                          ring_dtype="fp32").ring_grads(tok)[0]
    err32 = max(float((a - b).abs().max()) for a, b in zip(fp32, exact, strict=True))
    err16 = max(float((a - b).abs().max()) for a, b in zip(grads, exact, strict=True))
    assert err32 < 1e-7 < err16
    assert float(loss[0]) == pytest.approx(float(tr._grad(tuple(tr.params), tok[..., :-1],
                                                          tok[..., 1:])[1][0]), rel=1e-6)


def test_nesterov_outer_step_is_diloco_s_on_the_mean_delta():
    """One round at K = 2 (steps 2): the groups' local steps are those of plain FedAvg, then
    the global model is theta_0 - lr (1 + mu) (theta_0 - mean) (the momentum buffer is the first
    delta; torch SGD(nesterov=True)'s update); lr 1, mu 0 is plain averaging."""
    over = {"training.steps": 2, "algorithms.fl_fsdp.aggregate_every": 2}
    plain = scenario(**over)
    ref = GroupedTrainer(plain, plain.algorithm("fl_fsdp"), load_corpus(plain, BASE), seed=0,
                         eval_every=2)
    theta0 = [p[0].detach().clone() for p in ref.params]
    ref.run()
    mean = [p[0].detach().clone() for p in ref.params]
    nest = scenario(**over, algorithms__fl_fsdp__outer_optimizer="nesterov",
                    algorithms__fl_fsdp__outer_lr=0.7, algorithms__fl_fsdp__outer_momentum=0.9)
    tr = GroupedTrainer(nest, nest.algorithm("fl_fsdp"), load_corpus(nest, BASE), seed=0,
                        eval_every=2)
    tr.run()
    for p, t0, m in zip(tr.params, theta0, mean, strict=True):
        torch.testing.assert_close(p[0], t0 - 0.7 * 1.9 * (t0 - m), rtol=1e-5, atol=1e-6)
        assert torch.equal(p[0], p[-1])
    same = scenario(**over, algorithms__fl_fsdp__outer_optimizer="nesterov",
                    algorithms__fl_fsdp__outer_lr=1.0, algorithms__fl_fsdp__outer_momentum=0.0)
    tr1 = GroupedTrainer(same, same.algorithm("fl_fsdp"), load_corpus(same, BASE), seed=0,
                         eval_every=2)
    tr1.run()
    for p, m in zip(tr1.params, mean, strict=True):
        torch.testing.assert_close(p[0], m, rtol=1e-5, atol=1e-6)


def test_grad_clip_clips_each_group_as_its_own_run_would():
    from realrun.converge import clip_per_group

    g = (torch.tensor([[3.0, 0.0], [0.3, 0.0]]), torch.tensor([[[4.0]], [[0.4]]]))
    a, b = clip_per_group(g, 1.0)
    # group 0's norm is 5: scaled to 1; group 1's is 0.5: untouched
    torch.testing.assert_close(a, torch.tensor([[0.6, 0.0], [0.3, 0.0]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(b, torch.tensor([[[0.8]], [[0.4]]]), atol=1e-6, rtol=0)
    # FSDP with a small max norm learns differently from FSDP without it; FL with one group
    # and clipping is FSDP with clipping
    clipped = scenario(training__grad_clip=0.01, algorithms__fl_fsdp__group_nodes=4)
    fsdp, fl = run(clipped, "fsdp"), run(clipped, "fl_fsdp")
    assert fl.train_loss == fsdp.train_loss
    assert fsdp.train_loss != run(scenario(), "fsdp").train_loss


def test_optimizer_kernels_pick_torch_s_adamw_implementation():
    from realrun.optimizer import adamw_kernels

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert adamw_kernels(scenario().training, cuda) == {"fused": True}
    assert adamw_kernels(scenario().training, cpu) == {"foreach": True}
    assert adamw_kernels(scenario(training__optimizer_kernels="foreach").training,
                         cuda) == {"foreach": True}
    assert adamw_kernels(scenario(training__optimizer_kernels="per_param").training,
                         cuda) == {"foreach": False}
    # the per-parameter loop computes the same update as the multi-tensor one
    loop = run(scenario(training__optimizer_kernels="per_param"), "fl_fsdp")
    np.testing.assert_allclose(loop.train_loss, run(scenario(), "fl_fsdp").train_loss,
                               rtol=1e-5)
