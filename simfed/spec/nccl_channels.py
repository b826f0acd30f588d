"""NCCL's ring channel count across nodes, from a node's NICs, and the share of the GPU's SMs a
running collective holds: what `runtime.comm.nccl_channels: auto` and `sm_share: auto` resolve to
(NVIDIA/nccl src/graph/search.cc `ncclTopoCompute` and `ncclTopoDupChannels`, src/graph/connect.cc
`ncclTopoPostset`; the same from v2.18.3 to v2.21.5)."""

from __future__ import annotations

# each channel's speed is the first of these (GB/s) that fits the path to a NIC (search.cc
# speedArrayInter; Hopper's list, sm90SpeedArrayInter, for compute capability 9.0)
RING_SPEEDS_INTER = (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0,
                     3.0, 2.4, 1.2, 0.24, 0.12)
RING_SPEEDS_INTER_SM90 = (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0,
                          3.0, 2.4, 1.2, 0.24, 0.12)
MAX_CHANNELS = 32  # NCCL's MAXCHANNELS (src/include/device.h)
HOPPER = ("H100", "H200", "GH200", "H800")


def gpu_arch(gpu_name: str) -> str:
    """hopper or ampere, from the GPU's name (the architectures NCCL's tables tell apart)."""
    name = gpu_name.upper()
    return "hopper" if any(k in name for k in HOPPER) else "ampere"


def ring_channels(nics: int, nic_Gbps: float, gpus_per_node: int, sm90: bool) -> int:
    """The channels NCCL's rings across nodes get on a node with `nics` NICs of `nic_Gbps`: one
    ring channel per NIC (each channel's speed the first of RING_SPEEDS_INTER under the NIC's
    GB/s, so a NIC holds one), at most one per GPU; `ncclTopoDupChannels` doubles them when that
    speed is 25 GB/s or more, except on Hopper (compute capability > 8.0) below 50 GB/s with
    more than 4 channels; `ncclTopoPostset` doubles them again. So 8 NICs of 200 or 400 Gb/s
    give 16 channels, 4 NICs of 100 or 200 Gb/s 8."""
    if nics < 1 or nic_Gbps <= 0:
        raise ValueError(f"a ring across nodes needs a NIC: nics={nics}, nic_Gbps={nic_Gbps}")
    speeds = RING_SPEEDS_INTER_SM90 if sm90 else RING_SPEEDS_INTER
    speed = next((v for v in speeds if v <= nic_Gbps / 8.0), speeds[-1])
    n = min(nics, gpus_per_node)
    if speed >= 25.0 and not (sm90 and speed < 50.0 and n > 4):
        n = min(2 * n, MAX_CHANNELS)
    return min(2 * n, MAX_CHANNELS)


def channel_sm_share(channels: int, sms: int) -> float:
    """The share of the GPU's SMs a running collective holds: one CUDA block on one SM per
    channel (NCCL docs, NCCL_MIN_NCHANNELS), rounded to 0.001."""
    return round(channels / sms, 3)
