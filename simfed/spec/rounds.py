"""The FedAvg schedule of the paper's code, shared by realrun (when training runs FedAvg) and
simfed (which steps the engine simulates with the aggregation): a federated run averages its
groups' models after every K = aggregate_every local steps and after the last step,
`(step + 1) % K == 0 or step + 1 == steps` (steps 0-based)."""

from __future__ import annotations


def ends_round(step: int, *, steps: int, every: int) -> bool:
    """Whether optimizer step `step` (0-based) of `steps` ends in a FedAvg (never when every < 1:
    no federation)."""
    return every >= 1 and ((step + 1) % every == 0 or step == steps - 1)


def aggregation_steps(steps: int, every: int) -> set[int]:
    """The steps (0-based) after which FedAvg runs."""
    if every < 1:
        return set()
    return {s for s in range(steps) if ends_round(s, steps=steps, every=every)}
