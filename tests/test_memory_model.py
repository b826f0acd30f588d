"""Activation memory by checkpointing policy, attention kernel and loss kernel; fragmentation."""

from __future__ import annotations

import pytest

from simfed.memory import activation_bytes, memory_breakdown
from simfed.spec.model import ModelSpec
from simfed.spec.scenario import MemoryRuntime, TrainingSpec

M = ModelSpec(layers=10, hidden=1024, ffn_hidden=4096, heads=8, kv_heads=8, vocab=50000,
              mlp="gelu")


def _t(**kw) -> TrainingSpec:
    return TrainingSpec(seq_len=2048, micro_batch=2, steps=1, **kw)


def test_no_checkpointing_keeps_every_layer():
    tokens = 4096
    per_layer = (6 * 1024 + 2 * 1024 + 2 * 4096) * 2  # 32 h bytes for GELU, flash attention
    assert M.layer_activation_bytes_per_token() == per_layer
    assert activation_bytes(M, _t()) == tokens * (10 * per_layer + 50000 * 10)


def test_full_checkpointing_keeps_inputs_plus_one_layer():
    tokens = 4096
    per_layer = M.layer_activation_bytes_per_token()
    full = activation_bytes(M, _t(activation_checkpointing="full"))
    assert full == tokens * (10 * 1024 * 2 + per_layer + 50000 * 10)
    half = activation_bytes(M, _t(activation_checkpointing="selective", checkpoint_fraction=0.5))
    assert full < half < activation_bytes(M, _t())


def test_eager_attention_and_unfused_loss_cost_memory():
    assert activation_bytes(M, _t(attention="eager")) - activation_bytes(M, _t()) == \
        4096 * 10 * 8 * 2048 * 2
    assert activation_bytes(M, _t()) - activation_bytes(M, _t(cross_entropy="fused")) == \
        4096 * 50000 * 8


def test_fragmentation_scales_the_dynamic_part():
    t = _t()
    base = memory_breakdown(M, t, MemoryRuntime(), shard=8, peak_unsharded_units_bytes=1e9)
    frag = memory_breakdown(M, t, MemoryRuntime(fragmentation=0.1), shard=8,
                            peak_unsharded_units_bytes=1e9)
    dyn = base.activations_bytes + base.unsharded_bytes
    assert frag.peak_bytes - base.peak_bytes == pytest.approx(0.1 * dyn)


def test_fp32_master_shards_hold_the_sharded_params_and_grads_in_fp32():
    """Mixed precision keeps the sharded parameters in fp32 and casts the reduced gradient back
    to them: with fp32 optimizer states the shard is 4 + 4 + 8 bytes a parameter, not 2 + 2 + 8;
    with bf16 states (a bf16 model throughout) 2 + 2 + 4."""
    shard = 8
    n = -(-M.total_params // shard)
    fp32 = memory_breakdown(M, _t(optimizer_state_dtype="fp32"), MemoryRuntime(), shard=shard,
                            peak_unsharded_units_bytes=0)
    bf16 = memory_breakdown(M, _t(optimizer_state_dtype="bf16"), MemoryRuntime(), shard=shard,
                            peak_unsharded_units_bytes=0)
    assert (fp32.params_bytes, fp32.grads_bytes, fp32.optimizer_bytes) == (4 * n, 4 * n, 8 * n)
    assert (bf16.params_bytes, bf16.grads_bytes, bf16.optimizer_bytes) == (2 * n, 2 * n, 4 * n)
