"""The interface the engine calls for host-side contention, and its no-op default.

The engine (`simfed.engine.sim`) knows GPUs, links and programs. What a particular host adds on
top (ranks sharing CPU cores on an emulated testbed: `simfed.contention.SharedCores`) reaches it
only through the calls of `HostContention`:

- `compute_factor(actor)`: a multiplier on the actor's compute op durations;
- `collective_host_s(op, intra, ring_bytes)`: host seconds added to each phase of a collective
  (work per byte that does not scale with the link rate);
- `extra_collective_s(pg, comp, solo_s)`: time a collective of one component loses after its
  bytes have moved;
- `arrivals(actor)`: a tracker (`Arrivals`) one GPU stream of the actor feeds with its compute
  and collectives, which says how long each collective waits for the group's latest member
  (None: never; the engine then skips it);
- `simulate(build)`: run `build(model).run()` as often as the model needs (the shared-cores
  model iterates to a fixed point of how busy each rank is: `SimulatedRun.busy_share`); once
  for the default.

The engine owns this interface; an implementation satisfies it structurally and never imports
the engine. `NoContention` returns the neutral value of each, so a scenario without host
contention runs the engine's plain path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar


class Arrivals(Protocol):
    """One GPU stream's arrival bookkeeping between collectives."""

    def computed(self, duration_s: float) -> None:
        """The stream ran a compute op of this duration."""

    def wait_s(self, pg: str, size: int, start: float) -> float:
        """The expected wait, from `start`, for the latest of the `size` members of the
        process group `pg` at the collective the stream reaches now."""

    def collective_done(self, pg: str, end: float, solo_s: float) -> None:
        """The stream's collective over `pg` (alone on the network: `solo_s`) ended at `end`."""


class SimulatedRun(Protocol):
    """What a host-contention model may ask of a run it made the engine simulate."""

    @property
    def actors(self) -> int:
        """The run's actors (classes of identical ranks), indexed from 0."""

    def run(self) -> None:
        """Simulate the run."""

    def busy_share(self, actor: int) -> float:
        """Share of the run the actor's rank is busy on its host core."""


Run = TypeVar("Run", bound=SimulatedRun)


class HostContention(Protocol):
    """What a host adds to the engine's GPUs and links (see the module docstring)."""

    active: bool

    def compute_factor(self, actor: int) -> float: ...

    def collective_host_s(self, op: str, intra: bool, ring_bytes: float) -> float: ...

    def extra_collective_s(self, pg: str, comp: int, solo_s: float) -> float: ...

    def arrivals(self, actor: int) -> Arrivals | None: ...

    def simulate(self, build: Callable[[HostContention], Run]) -> Run: ...


class NoContention:
    """No host contention: every rank has host cores of its own (the default)."""

    active = False

    def compute_factor(self, actor: int) -> float:
        return 1.0

    def collective_host_s(self, op: str, intra: bool, ring_bytes: float) -> float:
        return 0.0

    def extra_collective_s(self, pg: str, comp: int, solo_s: float) -> float:
        return 0.0

    def arrivals(self, actor: int) -> Arrivals | None:
        return None

    def simulate(self, build: Callable[[HostContention], Run]) -> Run:
        sim = build(self)
        sim.run()
        return sim


NO_CONTENTION: HostContention = NoContention()
