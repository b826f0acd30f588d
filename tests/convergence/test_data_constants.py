"""convergence.data_constants are held to the ranges of the profile parameters they replace
(a profile holding such a value is refused; before, a constant up to 1e12 ran: an exponent of
1e12 overflowed inside the model and the run wrote its losses with exit 0)."""

from __future__ import annotations

import math
import re

import pytest
import yaml

from simfed.convergence.predict import DATA_CONSTANTS, constant_range
from simfed.convergence.profile import ScalingParams
from simfed.spec import SpecError

from ..conftest import SCENARIOS

PROFILE = SCENARIOS / "convergence" / "kjv-scaling.yaml"


def run(consts: dict[str, float]):
    from simfed.engine import simulate
    from simfed.spec import load_scenario

    over = {"training.steps": 8, "training.warmup_steps": 1, "training.lr": 3e-3,
            "cluster.nodes": 4, "data.source": "kjv", "convergence.model": "scaling",
            "convergence.target_loss": 3.5,
            "convergence.profile": yaml.safe_load(PROFILE.read_text()),
            "convergence.data_constants": consts}
    return simulate(load_scenario(SCENARIOS / "convergence-tiny.yaml", over))[0]


def test_each_constant_has_the_range_of_its_parameter():
    assert constant_range("loss_floor") == (0, 100)
    assert constant_range("floor_size_exponent") == (0, 3)
    lo, hi = constant_range("floor_coef")  # log_floor_coef in [-30, 10]
    assert math.log(lo) == pytest.approx(-30) and math.log(hi) == pytest.approx(10)
    lo, hi = constant_range("optimal_lr")  # log_lr_star: 1e-8 to 100
    assert lo == pytest.approx(1e-8) and hi == pytest.approx(100)
    for name, (param, _) in DATA_CONSTANTS.items():
        assert param in ScalingParams.model_fields, name


@pytest.mark.parametrize("name, value", [
    ("floor_size_exponent", 1e12), ("noise_loss_exponent", 21.0), ("unigram_loss", 1e12),
    ("floor_coef", 1e-300), ("noise_star_tokens", 1e-300), ("noise_star_tokens", 1e-6),
    ("optimal_lr", 1e-300), ("optimal_lr", 1e12),
])
def test_a_constant_outside_its_range_is_refused(name, value):
    with pytest.raises(SpecError, match=rf"^convergence\.data_constants\.{name}: "
                                        rf"{re.escape(f'{value:g}')} is outside .*the range of "
                                        r"the profile parameter"):
        run({name: value})


def test_constants_inside_their_ranges_run():
    consts = {"loss_floor": 1.7, "floor_coef": 0.05, "floor_size_exponent": 3.0,
              "noise_star_tokens": 1e6, "noise_loss_exponent": 0.0, "unigram_loss": 2.9,
              "optimal_lr": 100.0}
    out = run(consts)
    assert len(out["convergence"]["data_constants"]) == len(consts)
    assert all(math.isfinite(v) for a in out["algorithms"]
               for v in a["convergence"]["loss_curve"])
