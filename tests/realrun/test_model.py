"""The Llama model against its spec (parameter count = simfed's arithmetic, tied head, causal
masking, GQA shapes) and the LR schedule of the paper's code."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch

from realrun.model import Llama, apply_rope, next_token_loss, rope_tables
from realrun.optimizer import lr_factor
from simfed.spec import load_scenario

from ..conftest import SCENARIOS

SC = load_scenario(SCENARIOS / "cpu4.yaml")


@pytest.mark.parametrize("tied", [True, False])
def test_parameter_count_matches_the_spec(tied):
    spec = dataclasses.replace(SC.model, tied_embeddings=tied)
    model = Llama(spec, seq_len=16, device=torch.device("cpu"))
    assert sum(p.numel() for p in model.parameters()) == spec.total_params
    assert (model.head.weight is model.embed.weight) == tied


def test_forward_shapes_and_untrained_loss_near_log_vocab():
    torch.manual_seed(0)
    model = Llama(SC.model, seq_len=16, device=torch.device("cpu"))
    tokens = torch.randint(0, SC.model.vocab, (2, 17))
    logits = model(tokens[:, :-1])
    assert logits.shape == (2, 16, SC.model.vocab)
    loss = next_token_loss(logits, tokens[:, 1:])
    assert loss.item() == pytest.approx(math.log(SC.model.vocab), rel=0.02)


def test_attention_is_causal():
    torch.manual_seed(0)
    model = Llama(SC.model, seq_len=16, device=torch.device("cpu"))
    a = torch.randint(0, SC.model.vocab, (1, 16))
    b = a.clone()
    b[0, 10] = (a[0, 10] + 1) % SC.model.vocab
    la, lb = model(a), model(b)
    assert torch.equal(la[0, :10], lb[0, :10])
    assert not torch.allclose(la[0, 10:], lb[0, 10:])


def test_rope_is_a_rotation_and_identity_at_position_zero():
    cos, sin = rope_tables(8, 16, 10000.0, torch.device("cpu"))
    x = torch.randn(1, 2, 8, 16)
    y = apply_rope(x, cos, sin)
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), atol=1e-5)
    assert torch.allclose(y[:, :, 0], x[:, :, 0])


def test_lr_schedule_warms_up_from_zero_then_cosine_to_zero():
    t = dataclasses.replace(SC.training, steps=64, warmup_steps=6, lr_schedule="cosine")
    f = [lr_factor(s, t) for s in range(64)]
    assert f[0] == 0.0 and f[3] == pytest.approx(0.5) and f[6] == pytest.approx(1.0)
    assert all(a > b for a, b in itertools.pairwise(f[6:]))
    assert f[-1] == pytest.approx(0.5 * (1 + math.cos(math.pi * 57 / 58)))
    const = dataclasses.replace(t, lr_schedule="constant")
    assert [lr_factor(s, const) for s in (0, 6, 63)] == [0.0, 1.0, 1.0]


@pytest.mark.parametrize(("policy", "fraction", "blocks"), [
    ("full", 1.0, [0, 1]), ("selective", 0.5, [1]), ("none", 1.0, [])])
def test_activation_checkpointing_keeps_the_math_and_follows_simfeds_layer_choice(
        policy, fraction, blocks):
    """training.activation_checkpointing in realrun: the blocks simfed's recompute model
    charges (unit u = block + 1 when floor(u f) > floor((u - 1) f)) run under PyTorch's
    non-reentrant checkpoint; loss and gradients are those of the plain model."""
    train = dataclasses.replace(SC.training, activation_checkpointing=policy,
                                checkpoint_fraction=fraction)
    spec = dataclasses.replace(SC.model, layers=2)
    torch.manual_seed(0)
    plain = Llama(spec, seq_len=16, device=torch.device("cpu"))
    torch.manual_seed(0)
    ckpt = Llama(spec, seq_len=16, device=torch.device("cpu"))
    assert ckpt.set_checkpointing(train) == blocks
    tokens = torch.randint(0, spec.vocab, (2, 17))
    losses = []
    for model in (plain, ckpt):
        loss = next_token_loss(model(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    for (name, a), b in zip(plain.named_parameters(), ckpt.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-7), name
