"""Host contention: what the host a run's ranks live on adds to the engine's GPUs and links.

Implementations of the engine's host-contention interface (`simfed.engine.host`: the engine
calls it; a no-op default sits behind it); nothing here imports the engine. One model today:
`SharedCores`, ranks that share host CPU cores on the emulated testbed (`runtime.shared_cores`).
`for_run` picks the model for one algorithm's run; a scenario without the section (or with every
mechanism at 0 or switched off) gets None, the engine's no-op default, and pays nothing for it.
"""

from __future__ import annotations

from typing import Any

from .shared_cores import SharedCores, core_stack_s, nodes_per_core

__all__ = ["SharedCores", "core_stack_s", "for_run", "nodes_per_core"]


def for_run(spec: Any, hw: Any, plan: Any, part: Any) -> SharedCores | None:
    """The host-contention model of one run, or None for none: `spec` is
    `runtime.shared_cores`, `part` the run's actors (`simfed.engine.actors.Partition`)."""
    model = SharedCores(spec, hw, plan, part)
    return model if model.active else None
