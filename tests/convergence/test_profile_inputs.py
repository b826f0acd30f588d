"""A noise_progress profile read from a scenario: `loss_init: null` is the schema's "not given"
(the untrained loss ln(vocab)), as an absent key is; it was read as float(None), an internal
error (exit 3)."""

from __future__ import annotations

import math

import pytest
import yaml

from ..conftest import SCENARIOS

PROFILE = SCENARIOS / "convergence" / "synthetic-tiny.yaml"


def run(profile):
    from simfed.engine import simulate
    from simfed.spec import load_scenario

    return simulate(load_scenario(SCENARIOS / "tiny-time-to-target.yaml", {
        "training.steps": 8, "cluster.nodes": 4, "convergence.profile": profile}))[0]


@pytest.mark.parametrize("how", ["null", "absent"])
def test_a_profile_without_its_untrained_loss_starts_at_ln_vocab(how):
    prof = yaml.safe_load(PROFILE.read_text())
    if how == "null":
        prof["loss_init"] = None
    else:
        del prof["loss_init"]
    conv = run(prof)["convergence"]
    assert conv["loss_init"] == pytest.approx(math.log(256))
    given = run(yaml.safe_load(PROFILE.read_text()))["convergence"]
    assert given["loss_init"] == pytest.approx(5.5653)
