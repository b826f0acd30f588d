"""Model arithmetic against published parameter counts."""

import math

import pytest

from simfed.spec import ModelSpec, SpecError
from simfed.spec.loader import load_scenario_data

from ..conftest import SCENARIOS


def llama8b(**kw) -> ModelSpec:
    data = load_scenario_data(SCENARIOS / "models" / "llama3.1-8b.yaml")
    data.update(kw)
    return ModelSpec(**data)


def test_llama31_8b_published_counts():
    assert llama8b(tied_embeddings=False).total_params == 8_030_261_248
    assert llama8b(tied_embeddings=True).total_params == 7_504_924_672
    assert llama8b().layer_params == 218_112_000
    assert llama8b().embedding_params == 525_336_576


def test_units_cover_the_model():
    m = llama8b()
    units = m.units(2048)
    assert len(units) == 33 and units[0].name == "root"
    assert sum(u.params for u in units) == m.total_params
    assert units[1].nbytes == 218_112_000 * 2  # 436 MB in bf16


def test_flops_per_token_is_6n_plus_attention():
    m = llama8b()
    seq = 2048
    # forward+backward = 6 x matmul params (the embedding lookup is free; the tied head is a
    # matmul) + attention core: 4*seq*d per layer forward, halved for causal, x (1 + 2.5) for bwd
    matmul_params = m.layers * (m.attention_params + m.mlp_params) + m.embedding_params
    attn = m.layers * 4 * seq * m.hidden / 2 * 3.5
    assert m.train_flops_per_token(seq) == pytest.approx(6 * matmul_params + attn)
    # the paper's back-of-envelope: ~6 x 7.5e9 x 4096 tokens = 1.84e14 FLOP (+5-7% attention)
    per_gpu = m.train_flops_per_token(seq) * 4096
    assert 1.84e14 < per_gpu < 1.84e14 * 1.08


def test_bad_head_split_names_the_numbers():
    with pytest.raises(SpecError, match=r"4096 is not divisible by model\.heads 30"):
        llama8b(heads=30)


def test_expected_order_statistics_of_normal_draws():
    """Tippett's tabulated d2 (expected range of n standard normal draws) and E[max]."""
    from simfed.spec.stats import expected_max_normal, expected_range_normal

    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-6)
    for n, d2 in {2: 1.128, 4: 2.059, 8: 2.847, 10: 3.078, 25: 3.931}.items():
        assert expected_range_normal(n) == pytest.approx(d2, abs=6e-4)
