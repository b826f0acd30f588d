"""Step timelines of the 2 nodes x 2 GPUs toy scenario against hand-computed times.

Toy numbers (tests/fixtures/tiny2x2.yaml): 1 TFLOP/s GPUs at 100% efficiency, NVLink 100 GB/s
per GPU, 2 rails of 10 Gb/s (1.25 GB/s) per node, no latencies, no host costs. The host runs
ahead of the GPU (no synchronisation points), as PyTorch's CPU thread does.
"""

import itertools

import pytest

from simfed.compute import ComputeModel
from simfed.engine import simulate_algorithm
from simfed.hardware import Hardware
from simfed.spec import load_scenario

from ..conftest import ROOT

TINY = ROOT / "tests" / "fixtures" / "tiny2x2.yaml"
NV = 100e9  # NVLink bytes/s per GPU
RAIL = 1.25e9  # bytes/s per rail


def _setup(**over):
    scn = load_scenario(TINY, over)
    hw = Hardware.from_spec(scn.cluster, scn.runtime)
    cm = ComputeModel(hw=hw, rt=scn.runtime.compute,
                      tokens_per_gpu=scn.training.micro_batch * scn.training.seq_len)
    units = scn.model.units(scn.training.seq_len)
    F = [cm.forward_s(u) for u in units]
    B = [cm.backward_s(u) for u in units]
    S = [u.nbytes for u in units]
    return scn, F, B, S


def test_fsdp_timeline_by_hand():
    scn, F, B, S = _setup()
    run = simulate_algorithm(scn, scn.algorithm("fsdp"), trace=True, trace_steps=1)
    # world ring of 4 ranks on 2 nodes: all-gather / reduce-scatter of a unit of S bytes moves
    # E = 3/4 S per rank; a node's egress E is spread over 2 rails -> (3/8 S) / RAIL
    ag = [0.375 * s / RAIL for s in S]
    rs = ag
    # forward: the host runs ahead, so all-gathers of root, u1, u2 run back to back
    f1_start = ag[0] + ag[1]
    f1_end = f1_start + F[1]
    f2_end = max(f1_end, ag[0] + ag[1] + ag[2]) + F[2]
    head_end = f2_end + F[0]
    # the backward all-gather of u2 was issued early: it follows the forward ones at once
    agb2_end = ag[0] + ag[1] + ag[2] + ag[2]
    b0_end = head_end + B[0]
    b2_end = max(b0_end, agb2_end) + B[2]
    rs2_end = b2_end + rs[2]
    # no backward prefetch: u1's all-gather waits for u2's reduce-scatter (same communicator)
    agb1_end = rs2_end + ag[1]
    b1_end = max(b2_end, agb1_end) + B[1]
    rs1_end = b1_end + rs[1]
    rs0_end = rs1_end + rs[0]  # root gradient after the embedding backward (free)
    opt = scn.model.total_params / 4 * (2 * 2 + 2 + 4 * 2) / 100e9  # AdamW bytes / HBM
    step = rs0_end + opt
    spans = {}
    for s in run.spans:  # first occurrence: the forward all-gather before the backward one
        spans.setdefault((s.name, s.step), s)
    assert spans[("forward u1", 0)].start_s == pytest.approx(f1_start)
    assert spans[("forward root (head, loss)", 0)].end_s == pytest.approx(head_end)
    assert spans[("backward u2", 0)].end_s == pytest.approx(b2_end)
    assert spans[("all_gather u1", 0)].end_s == pytest.approx(ag[0] + ag[1])
    assert spans[("reduce_scatter u0", 0)].end_s == pytest.approx(rs0_end)
    assert run.result["step_times_s"][0] == pytest.approx(step)
    assert sum(run.result["phases_s"].values()) == pytest.approx(run.result["step_time_s"])


def test_backward_prefetch_overlaps_the_next_all_gather():
    scn, _F, B, S = _setup()
    none = simulate_algorithm(scn, scn.algorithm("fsdp")).result
    scn2, *_ = _setup(**{"algorithms.fsdp.backward_prefetch": "pre"})
    pre = simulate_algorithm(scn2, scn2.algorithm("fsdp")).result
    # without prefetch u1's backward waits for u2's reduce-scatter and then u1's all-gather;
    # with `pre` the all-gather ran during u2's backward and the reduce-scatter overlaps u1's
    # backward (it is shorter): the step saves both
    ag1 = 0.375 * S[1] / RAIL
    rs2 = 0.375 * S[2] / RAIL
    assert rs2 < B[1]
    assert none["step_time_s"] - pre["step_time_s"] == pytest.approx(rs2 + ag1, rel=1e-9)


def test_hsdp_timeline_by_hand():
    scn, _F, _B, S = _setup()
    run = simulate_algorithm(scn, scn.algorithm("hsdp"), trace=True, trace_steps=1)
    # shard group = the 2 GPUs of a node: E = S/2 over NVLink; replica all-reduce of the
    # gradient shard S/2 between the 2 nodes: E = 2 (1/2) (S/2) = S/2 over one rail each
    ag = [0.5 * s / NV for s in S]
    ar = [0.5 * s / RAIL for s in S]
    spans = {s.name: s for s in run.spans if s.step == 0}
    assert spans["all_gather u1"].dur_s == pytest.approx(ag[1])
    assert spans["all_reduce u2"].dur_s == pytest.approx(ar[2])
    # the all-reduce waits for its reduce-scatter, on its own stream
    assert spans["all_reduce u2"].start_s == pytest.approx(spans["reduce_scatter u2"].end_s)
    # ... while u1's all-gather and backward go ahead on the shard and compute streams
    assert spans["backward u1"].start_s < spans["all_reduce u2"].end_s
    # the optimizer waits for the last all-reduce (the root's, queued behind u2's and u1's)
    opt_start = spans["optimizer step"].start_s
    assert opt_start == pytest.approx(spans["all_reduce u0"].end_s)
    assert spans["all_reduce u0"].start_s == pytest.approx(
        max(spans["reduce_scatter u0"].end_s, spans["all_reduce u1"].end_s))


def test_fl_fsdp_aggregates_every_k_steps():
    scn, _F, _B, _S = _setup()
    run = simulate_algorithm(scn, scn.algorithm("fl_fsdp"), trace=True)
    r = run.result
    assert r["models"] == 2 and r["global_batch_sequences"] == 4  # 2 GPUs x 2 sequences
    assert r["aggregations"] == 2  # after steps 2 and 4 (K = 2)
    # FedAvg: all-reduce of each rank's shard (total/2 params, bf16) with the same GPU of the
    # other node: E = 2 (1/2) x shard bytes, over that GPU's rail
    shard_bytes = -(-scn.model.total_params // 2) * 2
    per_event = shard_bytes / RAIL
    aggs = [s for s in run.spans if s.name == "fedavg all_reduce"]
    assert [s.step for s in aggs] == [1, 3]
    assert aggs[0].dur_s == pytest.approx(per_event)
    assert r["aggregation_per_event_s"] == pytest.approx(per_event)
    assert r["phases_s"]["aggregation"] == pytest.approx(per_event * 2 / 4)
    # no inter-node traffic but FedAvg
    assert r["bytes_by_link"]["inter_node"] == pytest.approx(
        2 * 2 * shard_bytes * 2 / 4)  # 2 rings x 2 edges x E, 2 events over 4 steps


def test_fl_with_one_group_equals_fsdp():
    scn, *_ = _setup(**{"algorithms.fl_fsdp.group_nodes": 2})
    fl = simulate_algorithm(scn, scn.algorithm("fl_fsdp")).result
    fsdp = simulate_algorithm(scn, scn.algorithm("fsdp")).result
    assert fl["models"] == 1 and fl["aggregations"] == 0
    assert fl["step_times_s"] == fsdp["step_times_s"]
    assert fl["bytes_by_link"] == fsdp["bytes_by_link"]


def test_debug_checks_block_the_host():
    scn, *_ = _setup(**{"runtime.host.debug_checks": "detail", "runtime.host.gloo_hop_us": 1000,
                        "runtime.host.gloo_rank0_msg_us": 0})
    on = simulate_algorithm(scn, scn.algorithm("fsdp")).result
    off = simulate_algorithm(*[_setup()[0]] * 1, _setup()[0].algorithm("fsdp")).result
    # each 4-rank collective costs 3 + 2 = 5 hops of 1 ms on the host; 3 AG + 2 AG + 3 RS
    assert on["debug_checks_s"] == pytest.approx(8 * 5e-3)
    assert on["step_time_s"] > off["step_time_s"]


def test_rate_limiter_bounds_unsharded_buffers():
    """limit_all_gathers=False lets the host run every forward all-gather ahead of compute
    (all units unsharded at once); FSDP1's rate limiter keeps at most two in flight."""
    fast = {"model.layers": 6, "cluster.node.nics.bw_Gbps": 4000}  # gathers outrun compute
    scn, _, _, S = _setup(**fast)
    free = simulate_algorithm(scn, scn.algorithm("fsdp")).result
    scn2, *_ = _setup(**fast, **{"algorithms.fsdp.limit_all_gathers": True})
    limited = simulate_algorithm(scn2, scn2.algorithm("fsdp")).result
    largest = max(S)
    # without the limiter: the root + all 6 layers gathered before the first layer's forward
    # ends, and the last layer's backward all-gather too (+ one gradient buffer, counted as the
    # largest unit)
    assert free["memory_bytes"]["unsharded"] == pytest.approx(sum(S) + S[-1] + largest)
    # with it: root + at most two layers in flight
    assert limited["memory_bytes"]["unsharded"] <= S[0] + 2 * S[1] + largest
    assert limited["step_time_s"] >= free["step_time_s"] * (1 - 1e-9)


def test_resharding_the_root_adds_one_backward_all_gather():
    def run(**over):
        scn, *_ = _setup(**over)
        return simulate_algorithm(scn, scn.algorithm("fsdp"), trace=True, trace_steps=1)

    def gathers(r):
        return [s.name for s in r.spans if s.cat == "comm" and s.name.startswith("all_gather")]

    *_, S = _setup()
    extra = 0.375 * S[0] / RAIL  # the root's all-gather: 3/8 of its bytes over a rail
    reshard = {"algorithms.fsdp.reshard_root_after_forward": True}
    keep, again = run(), run(**reshard)
    assert len(gathers(again)) == len(gathers(keep)) + 1
    assert gathers(again).count("all_gather u0") == 2
    # on a GPU the host runs ahead: the extra all-gather hides behind forward compute
    assert again.result["step_time_s"] == pytest.approx(keep.result["step_time_s"], rel=1e-12)
    # where collectives block the rank (gloo on CPU) it adds its full time to the step
    cpu = {"runtime.comm.overlap_compute": False}
    delta = run(**cpu, **reshard).result["step_time_s"] - run(**cpu).result["step_time_s"]
    assert delta == pytest.approx(extra, rel=1e-9)


def test_cpu_backend_serialises_and_runs_reduce_scatter_as_all_reduce():
    _, F, B, S = _setup()
    scn, *_ = _setup(**{"runtime.comm.overlap_compute": False,
                        "runtime.comm.reduce_scatter_impl": "all_reduce"})
    r = simulate_algorithm(scn, scn.algorithm("fsdp"), trace=True, trace_steps=1)
    spans = [s for s in r.spans if s.cat in ("compute", "comm") and s.step == 0]
    # one stream: every op starts when the previous one ends
    for a, b in itertools.pairwise(spans):
        assert b.start_s == pytest.approx(a.end_s, abs=1e-15)
    ag = [0.375 * s / RAIL for s in S]
    ar = [2 * 0.375 * s / RAIL for s in S]  # all-reduce: twice the bytes of a reduce-scatter
    opt = scn.model.total_params / 4 * (2 * 2 + 2 + 4 * 2) / 100e9
    by_hand = (ag[0] + ag[1] + F[1] + ag[2] + F[2] + F[0]  # forward
               + B[0] + ag[2] + B[2] + ar[2] + ag[1] + B[1] + ar[1] + ar[0]  # backward
               + opt)
    assert r.result["step_times_s"][0] == pytest.approx(by_hand, rel=1e-9)
