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


def test_a_fitted_range_is_read_as_checked_and_ordered():
    """A fitted range given as numeric strings is read as numbers (they were compared with
    the scenario's as strings: TypeError, exit 3); a zero, negative or reversed range is
    refused in one line (a zero divided: ZeroDivisionError, exit 3)."""
    from simfed.spec import SpecError

    prof = yaml.safe_load(PROFILE.read_text())
    prof["fitted_range"]["aggregate_every"] = ["1", "32"]
    prof["fitted_range"]["groups"] = ["1", 128]
    assert run(prof)["convergence"]["extrapolation"] == run(
        yaml.safe_load(PROFILE.read_text()))["convergence"]["extrapolation"]
    for bad in ([0, 32], [-1, 32], [32, 1]):
        prof = yaml.safe_load(PROFILE.read_text())
        prof["fitted_range"]["aggregate_every"] = bad
        with pytest.raises(SpecError, match=r"fitted_range\.aggregate_every.*0 < low <= high"):
            run(prof)
