"""Real 4-process CPU runs (gloo) of scenarios/cpu4.yaml, shared between tests:
- `four`: the four algorithms in one `realrun run` launch, FedAvg rounds dumped;
- `repeat`: fsdp again (same seed) and fl_fsdp with one group of 2 nodes;
- `killed`: fsdp with debug checks on, rank 2 SIGKILLs itself at the start of step 2.
Oracles: FedAvg equals the mean of the groups' models; FSDP and HSDP give the same losses;
FL+FSDP with one group is FSDP; same seed gives the same bytes; perplexity falls below the
untrained value towards (never below) the entropy floor; traces match the plan's groups."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from realrun.errors import EXIT_PEER_LOST
from simfed.spec import PHASES, load_scenario, read_trace

from ..conftest import ROOT, SCENARIOS

pytestmark = pytest.mark.slow

CPU4 = SCENARIOS / "cpu4.yaml"
SC = load_scenario(CPU4)
NAMES = ("fsdp", "hsdp", "fl_fsdp", "fl_hsdp")
TIMEOUT_S = 20


def realrun(out: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "realrun.cli", "run", str(CPU4), "--nproc", "4",
           "--out", str(out), "--timeout-s", str(TIMEOUT_S), *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)


def summary(out: Path, name: str) -> dict:
    return json.loads((out / name / "summary.json").read_text())


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    out = tmp_path_factory.mktemp("four")
    res = realrun(out, "--algorithm", ",".join(NAMES), "--dump-fedavg")
    assert res.returncode == 0, res.stdout + res.stderr
    return out


@pytest.fixture(scope="module")
def repeat(tmp_path_factory):
    out = tmp_path_factory.mktemp("repeat")
    res = realrun(out, "--algorithm", "fsdp,fl_fsdp", "--set", "algorithms.fl_fsdp.group_nodes=2")
    assert res.returncode == 0, res.stdout + res.stderr
    return out


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    out = tmp_path_factory.mktemp("killed")
    res = realrun(out, "--algorithm", "fsdp", "--set", "runtime.host.debug_checks=detail",
                  "--kill-rank", "2", "--kill-at-step", "2", "--profile-steps", "0:1")
    return out, res, time.time()


# ---- the four algorithms --------------------------------------------------------------------
def test_four_algorithms_learn_below_untrained_and_above_the_floor(four):
    for name in NAMES:
        s = summary(four, name)
        assert (s["algorithm"], s["world_size"], s["steps"]) == (name, 4, SC.training.steps)
        assert len(s["train_loss"]) == SC.training.steps
        untrained = s["untrained_eval_perplexity"]
        assert untrained == pytest.approx(SC.model.vocab, rel=0.1)  # random init ~ uniform
        assert s["floor_perplexity"] == pytest.approx(4.0)  # 2 bits per token
        assert s["floor_perplexity"] < s["eval_perplexity"] < 0.6 * untrained, name
        assert s["train_perplexity"][-1] < 0.6 * s["train_perplexity"][0], name
        assert s["tokens_per_s"] == pytest.approx(s["tokens_per_step"] / s["step_time_s"])
        assert set(s["phases_s"]) == set(PHASES)
        assert sum(s["phases_s"].values()) <= s["step_time_s"] * 1.001
        assert (s["phases_s"]["aggregation"] > 0) == name.startswith("fl_")


def test_step_times_add_up_to_the_runs_wall_time(four):
    # the job's wall time per step (the ranks' common clock), not each step's slowest rank:
    # FL groups out of phase between FedAvg rounds would count twice
    for name in NAMES:
        s = summary(four, name)
        steps = [sp for r in range(4) for sp in read_trace(four / name / f"trace_rank{r}.jsonl")[1]
                 if sp.cat == "step"]
        last = max(sp.step for sp in steps)
        wall = (max(sp.end_s for sp in steps if sp.step == last)
                - min(sp.start_s for sp in steps if sp.step == 0))
        assert sum(s["step_times_s"]) == pytest.approx(wall, rel=1e-9), name
        assert len(s["slowest_rank_step_times_s"]) == len(s["step_times_s"]) == last + 1


def test_fsdp_and_hsdp_give_the_same_losses(four):
    fsdp, hsdp = summary(four, "fsdp"), summary(four, "hsdp")
    assert np.allclose(fsdp["train_loss"], hsdp["train_loss"], rtol=1e-5, atol=0)
    assert fsdp["eval_perplexity"] == pytest.approx(hsdp["eval_perplexity"], rel=1e-4)
    assert hsdp["replicas_identical"]


@pytest.mark.parametrize("name", ["fl_fsdp", "fl_hsdp"])
def test_fedavg_leaves_every_group_with_the_mean_model(four, name):
    plan = SC.algorithm(name).plan(SC.cluster)
    k = SC.algorithm(name).aggregate_every
    s = summary(four, name)
    assert s["fedavg"]["steps"] == list(range(k - 1, SC.training.steps, k))
    rounds = len(s["fedavg"]["steps"])
    moved = 0.0
    for n in range(rounds):
        dumps = {r: torch.load(four / name / "fedavg" / f"round{n}_rank{r}.pt")
                 for r in range(plan.world)}
        for fed_group in plan.process_groups["fed"]:  # same position in each group
            members = [dumps[r] for r in fed_group]
            assert {d["step"] for d in members} == {s["fedavg"]["steps"][n]}
            for i in range(len(members[0]["pre"])):
                pre = torch.stack([d["pre"][i] for d in members])
                mean = pre.mean(dim=0)
                for d in members:
                    assert torch.equal(d["post"][i], members[0]["post"][i])  # bitwise
                    torch.testing.assert_close(d["post"][i], mean, rtol=1e-6, atol=1e-7)
                moved = max(moved, (pre - mean).abs().max().item())
    assert moved > 1e-3  # the groups had really drifted apart between rounds
    assert s["groups_identical"] and len(s["final_model_sha256"]) == plan.groups
    assert len(set(s["eval_perplexity_per_group"])) == 1
    losses = np.array(s["train_loss_per_group"])
    assert not np.allclose(losses[0], losses[1])  # each group trained on its own data


def test_traces_tag_the_run_and_follow_the_plans_process_groups(four):
    expected_kinds = {"fsdp": {"shard"}, "hsdp": {"shard", "replicate"},
                      "fl_fsdp": {"shard", "fed"}, "fl_hsdp": {"replicate", "fed"}}
    param_nbytes = SC.model.total_params * 4  # fp32
    for name in NAMES:
        plan = SC.algorithm(name).plan(SC.cluster)
        s = summary(four, name)
        for rank in range(4):
            meta, spans = read_trace(four / name / f"trace_rank{rank}.jsonl")
            assert meta["source"] == "realrun" and meta["algorithm"] == name
            assert (meta["backend"], meta["device"], meta["world_size"]) == ("gloo", "cpu", 4)
            assert meta["threads"] == 1 and meta["cores"] >= 1 and meta["torch_version"]
            assert meta["plan"]["groups"] == plan.groups
            assert meta["plan"]["replicate"] == plan.replicate
            assert meta["plan"]["shard"] == plan.shard
            assert meta["debug_checks"] == "off" and meta["comm_overlaps_compute"] is False
            comm = [x for x in spans if x.cat == "comm" and 0 <= x.step < SC.training.steps]
            assert {x.group for x in comm} == expected_kinds[name], name
            for x in comm:
                assert tuple(x.attrs["ranks"]) == plan.group_of(x.group, rank)
                assert x.attrs["group_size"] == len(x.attrs["ranks"]) and x.dur_s >= 0
            # per step: reduce-scatter of every gradient once (padded to the shard count)
            rs = sum(x.nbytes for x in comm if x.name == "reduce_scatter") / SC.training.steps
            if plan.shard > 1:
                assert param_nbytes <= rs <= 1.05 * param_nbytes
            fed = [x for x in comm if x.group == "fed"]
            assert [x.step for x in fed] == (s["fedavg"]["steps"] if s["fedavg"] else [])
            assert all(x.name == "all_reduce" and x.attrs["phase"] == "aggregation"
                       and x.nbytes == s["fedavg"]["nbytes_per_rank"] for x in fed)
            if name == "fsdp":  # backward_prefetch none: next block's all-gather after the RS
                ops = [x.name for x in comm if x.step == 1 and x.attrs["phase"] == "backward"]
                # (the root unit stays gathered from forward to backward)
                assert ops == (["all_gather"]
                               + ["reduce_scatter", "all_gather"] * (SC.model.layers - 1)
                               + ["reduce_scatter"] * 2)
            steps = {x.step: x for x in spans if x.cat == "step"}
            assert sorted(steps) == list(range(SC.training.steps))
            for step, st in steps.items():  # phases tile the step, back to back
                phases = sorted((x for x in spans if x.cat == "phase" and x.step == step),
                                key=lambda x: x.start_s)
                edges = [st.start_s] + [x.end_s for x in phases]
                assert [x.start_s for x in phases] == pytest.approx(edges[:-1], abs=1e-9)
                assert edges[-1] == pytest.approx(st.end_s, abs=1e-9)
        chrome = json.loads((four / name / "trace.json").read_text())
        assert {e["pid"] for e in chrome["traceEvents"]} == {0, 1, 2, 3}


# ---- repeat ---------------------------------------------------------------------------------
def test_same_seed_gives_identical_models(four, repeat):
    a, b = summary(four, "fsdp"), summary(repeat, "fsdp")
    assert a["final_model_sha256"] == b["final_model_sha256"]
    assert a["train_loss"] == b["train_loss"]


def test_fl_fsdp_with_one_group_reproduces_fsdp(repeat):
    fsdp, fl = summary(repeat, "fsdp"), summary(repeat, "fl_fsdp")
    assert fl["plan"]["groups"] == 1 and fl["fedavg"] is None
    assert fl["train_loss"] == fsdp["train_loss"]
    assert fl["final_model_sha256"] == fsdp["final_model_sha256"]


@pytest.mark.parametrize("policy", ["full", "op"])
def test_activation_checkpointing_gives_the_same_losses_under_fsdp2(four, tmp_path, policy):
    """training.activation_checkpointing=full / op on the real gloo runs: every block re-run
    (op: torchtitan's selective op policy) in its backward under PyTorch's non-reentrant
    checkpoint (inside the block's FSDP2 hooks), the losses those of the plain runs, and the
    trace says which blocks were checkpointed and how."""
    res = realrun(tmp_path, "--algorithm", "fsdp,fl_hsdp",
                  "--set", f"training.activation_checkpointing={policy}")
    assert res.returncode == 0, res.stdout + res.stderr
    for name in ("fsdp", "fl_hsdp"):
        got, plain = summary(tmp_path, name), summary(four, name)
        assert got["train_loss"] == pytest.approx(plain["train_loss"], rel=1e-6)
        meta, _ = read_trace(tmp_path / name / "trace_rank0.jsonl")
        assert meta["activation_checkpointing"] == {
            "blocks": list(range(SC.model.layers)), "early_stop": True, "policy": policy}


def test_compiled_blocks_give_the_same_losses_under_fsdp2(four, tmp_path):
    """training.compile=true: each block's forward under torch.compile (Inductor's CPU code
    here), with torchtitan's op checkpointing inside it and FSDP2's hooks outside: the losses
    those of the plain eager runs (to fp32 reordering), and the trace says so."""
    res = realrun(tmp_path, "--algorithm", "fsdp", "--set", "training.compile=true",
                  "--set", "training.activation_checkpointing=op")
    assert res.returncode == 0, res.stdout + res.stderr
    got = json.loads((tmp_path / "summary.json").read_text())  # one algorithm: no subfolder
    assert got["train_loss"] == pytest.approx(summary(four, "fsdp")["train_loss"], rel=1e-5)
    meta, _ = read_trace(tmp_path / "trace_rank0.jsonl")
    assert meta["compile"] is True
    assert meta["activation_checkpointing"]["policy"] == "op"


# ---- a killed rank --------------------------------------------------------------------------
def test_killed_rank_ends_the_run_with_one_line_naming_it(killed):
    out, res, end_s = killed
    assert res.returncode == EXIT_PEER_LOST
    assert "Traceback" not in res.stderr + res.stdout
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("error: rank 2 died (SIGKILL) after completing 2 step(s)"), line
    # from the victim's last trace line to the end of `realrun run`: within the gloo timeout
    _, spans = read_trace(out / "trace_rank2.jsonl")
    clock = next(x for x in spans if x.name == "clock")
    died_s = clock.attrs["unix_time_s"] + max(x.end_s for x in spans)
    assert end_s - died_s < TIMEOUT_S


def test_traces_written_before_the_kill_are_intact(killed):
    out, _, _ = killed
    for rank in range(4):
        meta, spans = read_trace(out / f"trace_rank{rank}.jsonl")
        assert meta["torch_distributed_debug"] == "DETAIL"
        assert {x.step for x in spans if x.cat == "step"} == {0, 1}
        assert any(x.cat == "comm" and x.step == 1 for x in spans)
        assert json.loads((out / f"profile_rank{rank}.json").read_text())["traceEvents"]
    assert not (out / "summary.json").exists()


# The convergence emulator (realrun converge) against these real 4-process runs: the same
# per-step losses per federation group, and the same evaluation perplexity. Tolerance 1e-5 nats:
# the real run's gloo collectives sum gradients and FedAvg shards in another order than the
# emulator's batched mean (measured differences are below 1e-6 over 24 steps).
@pytest.mark.parametrize("name", NAMES)
def test_converge_emulator_reproduces_the_real_runs_losses(four, name):
    from realrun.converge import emulate
    from realrun.data import load_corpus

    real = summary(four, name)
    curve = emulate(SC, SC.algorithm(name), load_corpus(SC, CPU4))
    assert curve.groups == len(real["train_loss_per_group"])
    emu = np.array(curve.train_loss_per_group)  # (groups, steps)
    assert emu.shape == (curve.groups, SC.training.steps)
    np.testing.assert_allclose(emu, np.array(real["train_loss_per_group"]), rtol=0, atol=1e-5)
    assert np.exp(curve.eval_loss[-1]) == pytest.approx(real["eval_perplexity"], rel=1e-5)
    assert np.exp(curve.eval_loss[0]) == pytest.approx(real["untrained_eval_perplexity"],
                                                       rel=1e-5)


def test_grad_clip_under_fsdp2_clips_the_whole_model_s_norm(four, tmp_path):
    """training.grad_clip on the real gloo runs: clip_grad_norm_ over FSDP2's DTensor gradients
    takes each group's whole-model norm (HSDP's replicas and shards together give FSDP's
    losses), and a small max norm changes what is learned."""
    res = realrun(tmp_path, "--algorithm", "fsdp,hsdp", "--set", "training.grad_clip=0.05")
    assert res.returncode == 0, res.stdout + res.stderr
    fsdp, hsdp = summary(tmp_path, "fsdp"), summary(tmp_path, "hsdp")
    assert hsdp["train_loss"] == pytest.approx(fsdp["train_loss"], rel=1e-5)
    assert fsdp["train_loss"] != pytest.approx(summary(four, "fsdp")["train_loss"], rel=1e-4)
