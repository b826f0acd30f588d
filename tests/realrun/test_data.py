"""The corpus and the sampler: the synthetic source really has its stated entropy floor, every
sequence is a pure function of the seed, and every rank's share is the same for every algorithm."""

from __future__ import annotations

import math

import numpy as np
import pytest

from realrun.data import (
    EVAL_STREAM,
    TRAIN_STREAM,
    Sampler,
    SyntheticCorpus,
    TokenCorpus,
    entropy_bits,
    load_corpus,
    successor_probs,
)
from simfed.spec import SpecError, load_scenario

from ..conftest import SCENARIOS


@pytest.mark.parametrize("bits", [0.5, 2.0, 3.3, 8.0])
def test_successor_probs_have_exactly_the_target_entropy(bits):
    p = successor_probs(bits, 256)
    assert p.sum() == pytest.approx(1.0)
    assert np.all(np.diff(p) <= 0)  # most likely successor first
    assert entropy_bits(p) == pytest.approx(bits, abs=1e-9)


def test_entropy_above_log2_vocab_is_an_error():
    with pytest.raises(SpecError, match=r"synthetic_entropy_bits: 9.0 exceeds log2\(vocab 256\)"):
        successor_probs(9.0, 256)


def test_synthetic_source_follows_its_markov_chain_and_floor():
    c = SyntheticCorpus(vocab=256, seq_len=64, entropy_target_bits=2.0, seed=7)
    seqs = np.stack([c.sequence(TRAIN_STREAM, i) for i in range(300)])  # (300, 65)
    assert seqs.shape == (300, 65) and seqs.min() >= 0 and seqs.max() < 256
    # every transition is one of the token's successors; its rank gives its probability
    nll_bits = []
    for prev, nxt in zip(seqs[:, :-1].ravel(), seqs[:, 1:].ravel(), strict=True):
        (rank,) = np.nonzero(c.successors[prev] == nxt)[0]
        nll_bits.append(-math.log2(c.probs[rank]))
    # the empirical cross-entropy under the true model estimates the floor: 2 bits
    assert np.mean(nll_bits) == pytest.approx(2.0, abs=0.05)


def test_sequences_are_pure_functions_of_seed_stream_and_index():
    a = SyntheticCorpus(vocab=64, seq_len=16, entropy_target_bits=2.0, seed=1)
    b = SyntheticCorpus(vocab=64, seq_len=16, entropy_target_bits=2.0, seed=1)
    other = SyntheticCorpus(vocab=64, seq_len=16, entropy_target_bits=2.0, seed=2)
    assert np.array_equal(a.sequence(TRAIN_STREAM, 5), b.sequence(TRAIN_STREAM, 5))
    assert not np.array_equal(a.sequence(TRAIN_STREAM, 5), a.sequence(EVAL_STREAM, 5))
    assert not np.array_equal(a.sequence(TRAIN_STREAM, 5), other.sequence(TRAIN_STREAM, 5))


def test_sampler_gives_each_rank_disjoint_consecutive_blocks():
    s = Sampler(world=4, micro_batch=2, dataset_sequences=1000)
    step0 = [s.train_indices(0, r) for r in range(4)]
    assert step0 == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert s.train_indices(1, 0) == [8, 9]
    assert Sampler(world=4, micro_batch=2, dataset_sequences=10).train_indices(1, 1) == [0, 1]


@pytest.mark.parametrize("group_size,total", [(4, 64), (2, 64), (3, 10), (1, 5)])
def test_eval_split_covers_the_set_once_with_equal_batch_counts(group_size, total):
    s = Sampler(world=4, micro_batch=4, dataset_sequences=100)
    per_position = [s.eval_indices(p, group_size, total) for p in range(group_size)]
    assert len({len(b) for b in per_position}) == 1  # same number of forward passes
    flat = [i for b in per_position for batch in b for i in batch if i >= 0]
    assert sorted(flat) == list(range(total))
    assert all(len(batch) == 4 for b in per_position for batch in b)


def test_token_corpus_holds_out_the_last_blocks_and_checks_ids():
    tokens = np.arange(100) % 50
    c = TokenCorpus(tokens, vocab=50, seq_len=9, eval_sequences=2, source="t")
    assert c.train_blocks == 8
    assert np.array_equal(c.sequence(EVAL_STREAM, 0), tokens[80:90])
    assert np.array_equal(c.sequence(TRAIN_STREAM, 9), tokens[10:20])  # wraps around
    with pytest.raises(SpecError, match=r"token id 49 >= model\.vocab 40"):
        TokenCorpus(tokens, vocab=40, seq_len=9, eval_sequences=2, source="t")
    with pytest.raises(SpecError, match="not enough for 10 evaluation blocks"):
        TokenCorpus(tokens, vocab=50, seq_len=9, eval_sequences=10, source="t")


def test_text_source_is_byte_level(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("ciao mondo! " * 200, encoding="utf-8")
    sc = load_scenario(SCENARIOS / "cpu4.yaml", {"data.source": "text", "data.path": str(text),
                                                 "training.eval_sequences": 4})
    c = load_corpus(sc)
    assert isinstance(c, TokenCorpus) and c.entropy_floor_bits is None
    assert bytes(c.sequence(TRAIN_STREAM, 0)[:4].astype(np.uint8)) == b"ciao"
    with pytest.raises(SpecError, match=r"data\.path: file not found"):
        load_corpus(load_scenario(SCENARIOS / "cpu4.yaml",
                                  {"data.source": "tokens", "data.path": "nope.npy"}))
