"""What simfed's recompute model (simfed.compute, `training.checkpoint_early_stop`) assumes of
PyTorch's non-reentrant activation checkpointing, checked against the installed torch on
realrun's own decoder block: recomputation stops once every tensor saved for backward exists
again, so the MLP's down projection is not re-run; without early stop the whole forward is."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from realrun.model import Llama
from simfed.spec import load_scenario

from ..conftest import SCENARIOS


class _Matmuls(TorchDispatchMode):
    """Records the (rows, inner, cols) of every aten.mm."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.mm.default:
            a, b = args[0], args[1]
            self.shapes.append((a.shape[0], a.shape[1], b.shape[1]))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("early_stop", [True, False])
def test_non_reentrant_recompute_skips_the_down_projection(early_stop):
    scn = load_scenario(SCENARIOS / "cpu4.yaml")
    torch.manual_seed(0)
    model = Llama(scn.model, 16, torch.device("cpu"))
    block = model.layers[0]
    d, f = scn.model.hidden, scn.model.ffn_hidden
    x = torch.randn(1, 16, d, requires_grad=True)
    cos, sin = model.rope_cos, model.rope_sin
    forward = _Matmuls()
    with forward:
        block(x, cos, sin)
    with set_checkpoint_early_stop(early_stop):
        y = checkpoint(block, x, cos, sin, use_reentrant=False)
    backward = _Matmuls()
    with backward:
        y.sum().backward()
    down = (16, f, d)  # (tokens x ffn) @ (ffn x hidden)
    assert forward.shapes.count(down) == 1
    # the backward's own GEMMs are two per projection (input and weight gradient); the
    # recompute adds the forward's, less the down projection when it stops early
    recomputed = len(backward.shapes) - 2 * len(forward.shapes)
    assert recomputed == len(forward.shapes) - (1 if early_stop else 0)
    # that shape in the backward: the gate and up projections' input gradients, (tokens x
    # ffn) @ (ffn x hidden), and the recomputed down projection unless it stopped early
    assert backward.shapes.count(down) == 2 + (0 if early_stop else 1)


def test_op_policy_recomputes_wk_wo_and_up_as_simfed_charges():
    """torchtitan's selective op policy on realrun's block (`op_policy_context`): the backward
    re-runs every second matmul of the forward (k, o and up projections: simfed.compute
    `op_recompute_s`), not the others, and keeps the attention kernel's output."""
    from realrun.model import op_policy_context

    scn = load_scenario(SCENARIOS / "cpu4.yaml")
    torch.manual_seed(0)
    model = Llama(scn.model, 16, torch.device("cpu"))
    block = model.layers[0]
    d, f, kv = scn.model.hidden, scn.model.ffn_hidden, scn.model.kv_dim
    x = torch.randn(1, 16, d, requires_grad=True)
    cos, sin = model.rope_cos, model.rope_sin
    forward = _Matmuls()
    with forward:
        block(x, cos, sin)
    y = checkpoint(block, x, cos, sin, use_reentrant=False, context_fn=op_policy_context)
    backward = _Matmuls()
    with backward:
        y.sum().backward()
    assert len(forward.shapes) == 7  # q, k, v, o, gate, up, down
    recomputed = len(backward.shapes) - 2 * len(forward.shapes)
    assert recomputed == 3
    # the forward shapes of k (tokens x hidden @ hidden x kv), o and up, once more each
    for shape in ((16, d, kv), (16, d, d), (16, d, f)):
        assert backward.shapes.count(shape) >= 1
    k_shape = (16, d, kv)  # k and v share it: two in the forward, one re-run
    assert forward.shapes.count(k_shape) == 2
    assert backward.shapes.count(k_shape) == 1
