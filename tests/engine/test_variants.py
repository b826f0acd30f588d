"""FL variants in the timing model: time-budgeted rounds (FedNova weights), partial participation
with a deadline, and DiLoCo's outer Nesterov step; their bad input is one line naming the field."""

import numpy as np
import pytest

from simfed.engine import simulate_algorithm
from simfed.engine.variants import (
    budget_rounds,
    deadline_rounds,
    outer_step_s,
    round_bounds,
    sync_rounds,
)
from simfed.spec import SpecError, load_scenario

from ..conftest import SCENARIOS

PAPER = SCENARIOS / "512gpu.yaml"
SMALL = {"cluster.nodes": 16, "training.steps": 16}
SLOW = {"stragglers": {"slow_nodes": [{"node": 3, "factor": 1.5}]}}


def _run(over: dict, name: str = "fl_fsdp") -> dict:
    scn = load_scenario(PAPER, {**SMALL, **over})
    return simulate_algorithm(scn, scn.algorithm(name)).result


def test_round_arithmetic_by_hand():
    # 2 groups, 4 steps, FedAvg after steps 1 and 3; aggregation 0.5 s
    local = np.array([[1.0, 1.0, 1.0, 3.0],
                      [2.0, 2.0, 1.0, 1.0]])
    bounds = round_bounds(4, {1, 3})
    assert bounds == [(0, 1), (2, 3)]
    times, counted = sync_rounds(local, bounds, 0.5)
    assert times == [4.5, 4.5] and [c.tolist() for c in counted] == [[2, 2], [2, 2]]
    # deadline 3 s: round 1 group 1 (4 s) is left out and the round closes at 3 s; round 2
    # group 0 (4 s) is left out
    times, counted = deadline_rounds(local, bounds, 0.5, 3.0)
    assert times == [3.5, 3.5] and [c.tolist() for c in counted] == [[2, 0], [0, 2]]
    # budget 2.5 s, slots of (groups, rounds, slots): group 0 fits 2 steps, group 1 fits 1
    slots = np.array([[[1.0, 1.0, 1.0]], [[2.0, 2.0, 2.0]]])
    times, counted = budget_rounds(slots, 0.5, 2.5)
    assert times == [2.5] and counted[0].tolist() == [2, 1]


def test_a_deadline_every_group_meets_is_synchronous_fedavg():
    """With a deadline no group misses, the round model reproduces the engine's own FedAvg run
    from the engine's step times: the oracle for the composition."""
    jitter = {"stragglers": {"jitter": {"sigma": 0.1, "level": "node"}}}
    sync = _run(jitter, "fl_hsdp")
    late = _run({**jitter, "algorithms.fl_hsdp.round_deadline_s": 1e6}, "fl_hsdp")
    assert late["fl_rounds"]["participation"] == 1.0
    assert late["total_time_s"] == pytest.approx(sync["total_time_s"], rel=0.01)


def test_deadline_leaves_the_slow_group_out():
    sync = _run(SLOW)
    free = _run({})  # no straggler: what the others run at
    k = sync["aggregate_every"]
    deadline = free["total_time_s"] / sync["aggregations"] * 1.05  # the fast groups' round
    cut = _run({**SLOW, "algorithms.fl_fsdp.round_deadline_s": deadline})
    rounds = cut["fl_rounds"]
    groups = cut["plan"]["groups"]
    assert rounds["participation"] == pytest.approx((groups - 1) / groups)
    assert rounds["local_steps_per_round"] == pytest.approx(k * (groups - 1) / groups)
    # faster than waiting for the straggler, slower than no straggler (its steps are lost)
    assert free["tokens_per_s"] > cut["tokens_per_s"] > sync["tokens_per_s"]


def test_budget_lets_fast_groups_take_more_steps():
    sync = _run(SLOW)
    free = _run({})
    budget = free["total_time_s"] / free["aggregations"]  # one synchronous round, no straggler
    res = _run({**SLOW, "algorithms.fl_fsdp.round_budget_s": budget})
    rounds = res["fl_rounds"]
    # the slow node's group takes fewer steps than the others (1.5x slower compute)
    assert rounds["min_local_steps"] < rounds["max_local_steps"]
    assert rounds["round_time_s"] <= budget + rounds["aggregation_s"] + 1e-9
    assert res["tokens_per_s"] > sync["tokens_per_s"] * 1.05


def test_outer_nesterov_adds_its_elementwise_pass_to_each_round():
    plain = _run({})
    outer = _run({"algorithms.fl_fsdp.outer_optimizer": "nesterov"})
    scn = load_scenario(PAPER, SMALL)
    hw = scn.cluster.node.gpu
    shard = -(-scn.model.total_params // plain["plan"]["shard"])
    expected = outer_step_s(shard, scn.model.dtype_nbytes, 2,
                            hw.hbm_bw_GBps * 1e9 * scn.runtime.compute.optimizer_hbm_efficiency)
    extra = outer["aggregation_per_event_s"] - plain["aggregation_per_event_s"]
    assert extra == pytest.approx(expected, rel=1e-6)
    assert expected > 0


@pytest.mark.parametrize(("key", "value", "message"), [
    ("algorithms.fl_fsdp.outer_lr", 0, "algorithms.fl_fsdp.outer_lr: must be > 0, got 0"),
    ("algorithms.fl_fsdp.outer_lr", -0.5, "algorithms.fl_fsdp.outer_lr: must be > 0"),
    ("algorithms.hsdp.round_deadline_s", 5, "algorithms.hsdp.round_deadline_s: only federated"),
])
def test_bad_variant_keys_name_the_field(key, value, message):
    with pytest.raises(SpecError, match=message):
        load_scenario(PAPER, {key: value})


@pytest.mark.parametrize(("key", "value", "message"), [
    ("round_budget_s", 0.2, r"round_budget_s: 0.2 s is shorter than one local step"),
    ("round_deadline_s", 2.0, r"round_deadline_s: 2 s is shorter than any group's 8 local "
                              r"steps .*no group can meet it"),
])
def test_impossible_budget_or_deadline_is_one_line(key, value, message):
    with pytest.raises(SpecError, match=message) as err:
        _run({f"algorithms.fl_fsdp.{key}": value})
    assert "\n" not in str(err.value)


def test_variants_and_order_stats_are_byte_identical_across_runs():
    from simfed.analysis.report import dumps
    from simfed.engine import simulate

    over = {**SMALL, "stragglers": {"jitter": {"sigma": 0.1, "level": "gpu"}},
            "algorithms.fl_fsdp.round_budget_s": 9.0,
            "algorithms.fl_hsdp.round_deadline_s": 13.0,
            "algorithms.fl_hsdp.outer_optimizer": "nesterov"}
    scn = load_scenario(PAPER, over)
    assert dumps(simulate(scn)[0]) == dumps(simulate(scn)[0])


@pytest.mark.parametrize("seed", range(40))
def test_round_rules_hold_for_any_step_times(seed):
    """Random (seeded) step times: a deadline nobody misses is synchronous FedAvg; a budget round
    never outlasts the budget (plus the aggregation) and a larger budget never takes fewer
    steps."""
    rng = np.random.default_rng(seed)
    groups, slots, budget = int(rng.integers(1, 6)), int(rng.integers(1, 7)), rng.uniform(0.5, 20)
    local = rng.uniform(0.5, 2.0, size=(groups, 2 * slots))
    bounds = round_bounds(2 * slots, {slots - 1, 2 * slots - 1})
    sync_t, sync_c = sync_rounds(local, bounds, 0.3)
    late_t, late_c = deadline_rounds(local, bounds, 0.3, float(local.sum()) + 1.0)
    assert late_t == pytest.approx(sync_t)
    assert [c.tolist() for c in late_c] == [c.tolist() for c in sync_c]
    table = local.reshape(groups, 2, slots)
    times, counted = budget_rounds(table, 0.3, budget)
    assert all(t <= budget + 0.3 + 1e-12 for t in times)
    _, more = budget_rounds(table, 0.3, budget * 1.5)
    assert all((m >= c).all() for m, c in zip(more, counted, strict=True))


def test_cli_bad_budget_exits_2_with_one_line():
    from click.testing import CliRunner

    from simfed.cli import main

    res = CliRunner().invoke(main, ["run", str(PAPER), "-q", "-a", "fl_fsdp",
                                    "--set", "training.steps=8",
                                    "--set", "algorithms.fl_fsdp.round_budget_s=0.2"])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "error: algorithms.fl_fsdp.round_budget_s: 0.2 s is shorter than one local step")
