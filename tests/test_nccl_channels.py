"""NCCL's ring channel count across nodes (`simfed/spec/nccl_channels.py`), what
`runtime.comm.nccl_channels: auto` / `sm_share: auto` resolve to, and the shipped scenarios'
values, which must agree with it."""

from pathlib import Path

import pytest

from simfed.spec import SpecError, load_scenario
from simfed.spec.nccl_channels import gpu_arch, ring_channels

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("nics, gbps, gpus, sm90, want", [
    (8, 400, 8, True, 16),    # DGX H100: 48 GB/s a channel, Hopper keeps 8, doubled once
    (8, 200, 8, False, 16),   # DGX A100: 24 GB/s, under 25: not duplicated, doubled once
    (4, 100, 4, False, 8),    # Leonardo: 12 GB/s a channel
    (4, 200, 4, True, 8),     # MareNostrum 5
    (4, 100, 8, False, 8),    # 4 NICs for 8 GPUs
    (8, 400, 8, False, 32),   # Ampere at 48 GB/s: duplicated, then doubled (MAXCHANNELS)
    (2, 400, 8, True, 8),     # two channels only: Hopper's exception needs more than 4
])
def test_ring_channels(nics, gbps, gpus, sm90, want):
    assert ring_channels(nics, gbps, gpus, sm90) == want


def test_ring_channels_needs_a_nic():
    with pytest.raises(ValueError, match="nics=0"):
        ring_channels(0, 100, 4, False)


def test_auto_resolves_from_the_cluster_and_a_number_stays():
    auto = {"runtime.comm.nccl_channels": "auto", "runtime.comm.sm_share": "auto"}
    leo = load_scenario(ROOT / "scenarios" / "512gpu.yaml", auto).runtime.comm
    assert (leo.nccl_channels, leo.sm_share) == (8, 0.074)  # 4 x 100 Gb/s, 108 SMs
    dgx = load_scenario(ROOT / "scenarios" / "h100-1024.yaml", auto).runtime.comm
    assert (dgx.nccl_channels, dgx.sm_share) == (16, 0.121)  # 8 x 400 Gb/s, 132 SMs
    # the same nodes with 400 Gb/s NICs: 48 GB/s a channel, duplicated on Ampere: auto follows
    faster = load_scenario(ROOT / "scenarios" / "512gpu.yaml",
                           auto | {"cluster.node.nics.bw_Gbps": 400})
    assert faster.runtime.comm.nccl_channels == 16
    # a number given is kept, and sm_share auto follows it
    mine = load_scenario(ROOT / "scenarios" / "512gpu.yaml",
                         {"runtime.comm.nccl_channels": 12, "runtime.comm.sm_share": "auto"})
    assert (mine.runtime.comm.nccl_channels, mine.runtime.comm.sm_share) == (12, 0.111)


@pytest.mark.parametrize("override, words", [
    ({"runtime.comm.nccl_channels": 0}, "runtime.comm.nccl_channels: expected an integer >= 1 "
     "or one of auto, got 0"),
    ({"runtime.comm.sm_share": 1.5}, "runtime.comm.sm_share: expected a number from 0 to 1 "
     "or one of auto, got 1.5"),
    ({"runtime.comm.sm_share": "auto", "cluster.node.gpu.sms": 0},
     "runtime.comm.sm_share: auto is 8 channels over the GPU's SMs, and cluster.node.gpu.sms is 0"),
    ({"runtime.comm.sm_share": "auto", "cluster.node.gpu.sms": 8},
     "runtime.comm.sm_share: auto gives 8 channels over 8 SMs = 1; a collective's kernels"),
])
def test_bad_channel_settings_are_one_line(override, words):
    with pytest.raises(SpecError) as exc:
        load_scenario(ROOT / "scenarios" / "512gpu.yaml", override)
    msg = str(exc.value)
    assert "\n" not in msg and words in msg


def _shipped():
    files = sorted((ROOT / "scenarios").glob("*.yaml"))
    files += sorted((ROOT / "validation" / "published").glob("*.yaml"))
    out = []
    for f in files:
        try:
            scn = load_scenario(f)
        except SpecError:  # not a scenario (a case list, a claim file)
            continue
        if scn.cluster.node.nics.count >= 1 and scn.runtime.comm.model == "nccl":
            out.append((f, scn))
    return out


def test_shipped_scenarios_use_nccls_channel_count():
    checked = 0
    for f, scn in _shipped():
        node, comm = scn.cluster.node, scn.runtime.comm
        want = ring_channels(node.nics.count, node.nics.bw_Gbps, node.gpus,
                             gpu_arch(node.gpu.name) == "hopper")
        assert comm.nccl_channels == want, \
            f"{f.name}: nccl_channels {comm.nccl_channels}, NCCL's {want}"
        assert comm.sm_share == pytest.approx(want / node.gpu.sms, abs=0.0015), \
            f"{f.name}: sm_share {comm.sm_share}, {want} channels of {node.gpu.sms} SMs"
        checked += 1
    assert checked >= 40
