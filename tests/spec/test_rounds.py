"""The FedAvg schedule, declared once (simfed.spec.rounds) for the engine and realrun."""

import pytest

from simfed.engine import aggregate_steps
from simfed.spec.rounds import aggregation_steps, ends_round


@pytest.mark.parametrize("steps, every, expected", [
    (10, 4, {3, 7, 9}),  # every K steps, and after the last one
    (8, 4, {3, 7}),
    (5, 1, {0, 1, 2, 3, 4}),
    (3, 8, {2}),  # K beyond the run: one round, at the end
    (6, 0, set()),  # not federated
])
def test_fedavg_after_every_k_steps_and_the_last(steps, every, expected):
    assert aggregation_steps(steps, every) == expected
    assert {s for s in range(steps) if ends_round(s, steps=steps, every=every)} == expected
    assert aggregate_steps(steps, every) == expected  # the engine's schedule is this one
