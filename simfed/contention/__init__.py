"""Host contention: what the host a run's ranks live on adds to the engine's GPUs and links.

A pluggable component behind the interface in `base` (the engine calls it; a no-op default sits
behind it). One model today: `SharedCores`, ranks that share host CPU cores on the emulated
testbed (`runtime.shared_cores`). `for_run` picks the model for one algorithm's run; a scenario
without the section (or with every mechanism at 0 or switched off) gets the no-op default and
pays nothing for it.
"""

from __future__ import annotations

from typing import Any

from .base import NO_CONTENTION, Arrivals, HostContention
from .shared_cores import SharedCores, busy_share

__all__ = ["NO_CONTENTION", "Arrivals", "HostContention", "SharedCores", "busy_share",
           "for_run"]


def for_run(spec: Any, hw: Any, plan: Any, part: Any) -> HostContention:
    """The host-contention model of one run: `spec` is `runtime.shared_cores`, `part` the run's
    actors (`simfed.engine.actors.Partition`)."""
    model = SharedCores(spec, hw, plan, part)
    return model if model.active else NO_CONTENTION
