"""NCCL's ring channel count across nodes (`simfed.collectives.nccl.ring_channels`) and the
shipped scenarios' `runtime.comm.nccl_channels` / `sm_share`, which must agree with it."""

from pathlib import Path

import pytest

from simfed.collectives.nccl import gpu_arch, ring_channels
from simfed.spec import load_scenario

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


def _shipped():
    files = sorted((ROOT / "scenarios").glob("*.yaml"))
    files += sorted((ROOT / "validation" / "published").glob("*.yaml"))
    out = []
    for f in files:
        if f.name in ("cases.yaml",) or f.name.startswith(("speedups", "shared-fabric")):
            continue
        try:
            scn = load_scenario(f)
        except Exception:  # not a scenario (a case list, a claim file)
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
