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
