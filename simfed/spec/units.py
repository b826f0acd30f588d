"""Unit conversions: every quantity name carries its unit, and converts here, nowhere else."""

from __future__ import annotations

KB = 1e3
MB = 1e6
GB = 1e9
GiB = float(2**30)
MiB = float(2**20)


def gbps_to_Bps(bw_Gbps: float) -> float:
    """Network line rate in gigabits per second -> bytes per second."""
    return bw_Gbps * 1e9 / 8.0


def GBps_to_Bps(bw_GBps: float) -> float:
    """Gigabytes per second -> bytes per second."""
    return bw_GBps * GB


def us_to_s(time_us: float) -> float:
    return time_us * 1e-6


def ms_to_s(time_ms: float) -> float:
    return time_ms * 1e-3


def tflops_to_flops(tflops: float) -> float:
    return tflops * 1e12


def GiB_to_bytes(size_GiB: float) -> float:
    return size_GiB * GiB


DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


def dtype_nbytes(dtype: str) -> int:
    """Bytes per element of a dtype name used in scenarios ("bf16", "fp32", ...)."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPE_BYTES)}") from None
