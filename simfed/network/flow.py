"""Fluid bandwidth sharing: concurrent transfers that share a link share its bandwidth.

A transfer (one collective's bandwidth phase) has a demand vector: the bytes it moves over one
link of each link class it crosses. Alone it progresses at min_l(capacity_l / demand_l), so it
takes max_l(demand_l / capacity_l): the alpha-beta bandwidth term over the ring's bottleneck.
Concurrent transfers get weighted max-min fair shares (progressive filling: every unfrozen
transfer raises its byte rate on its own most-loaded link equally until a link saturates), which
is how competing rings share a NIC or a fabric link. Rates are recomputed only for the
transfers connected to the one that started or finished through shared links.

The medium owns time (SimPy's `latency.py` idiom): callers `yield net.transfer(demand)` and get
the event that fires when the bytes have arrived.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import simpy


class _Flow:
    __slots__ = ("demand", "done", "last_s", "norm", "rate", "remaining", "seq", "version")

    def __init__(self, seq: int, demand: dict[int, float], done: simpy.Event, now: float):
        self.seq = seq  # creation order: every iteration below follows it (determinism)
        self.demand = demand  # link class -> bytes over one link for the whole transfer
        self.norm = max(demand.values())
        self.remaining = 1.0  # fraction of the transfer left
        self.rate = 0.0  # fraction per second
        self.last_s = now
        self.done = done
        self.version = 0


class FlowNetwork:
    """Link classes with capacities (bytes/s per link) shared by concurrent transfers."""

    def __init__(self, env: simpy.Environment, capacities_Bps: Sequence[float]):
        self.env = env
        self.capacity = list(capacities_Bps)
        self._on_link: list[dict[int, _Flow]] = [{} for _ in self.capacity]
        self.active = 0
        self.peak_active = 0
        self.transfers = 0

    def transfer(self, demand: Mapping[int, float]) -> simpy.Event:
        """Start moving `demand[link class]` bytes over one link of each class; the returned
        event succeeds when the transfer completes."""
        done = self.env.event()
        dem = {k: v for k, v in demand.items() if v > 0}
        self.transfers += 1
        if not dem:
            done.succeed()
            return done
        flow = _Flow(self.transfers, dem, done, self.env.now)
        for link in dem:
            self._on_link[link][flow.seq] = flow
        self.active += 1
        self.peak_active = max(self.peak_active, self.active)
        self._reshare(self._component(flow))
        return done

    def solo_time_s(self, demand: Mapping[int, float]) -> float:
        """Time of a transfer alone on the network (the closed-form bandwidth term)."""
        return max((v / self.capacity[k] for k, v in demand.items() if v > 0), default=0.0)

    # ---- internals ----------------------------------------------------------------------
    def _component(self, flow: _Flow) -> dict[int, _Flow]:
        """Transfers connected to `flow` through shared links (only they change rate)."""
        seen = {flow.seq: flow}
        stack = [flow]
        while stack:
            f = stack.pop()
            for link in f.demand:
                for seq, g in self._on_link[link].items():
                    if seq not in seen:
                        seen[seq] = g
                        stack.append(g)
        return seen

    def _reshare(self, comp: dict[int, _Flow]) -> None:
        now = self.env.now
        flows = [comp[k] for k in sorted(comp)]
        for f in flows:  # bring progress up to date at the old rates
            f.remaining -= f.rate * (now - f.last_s)
            f.last_s = now
        if len(flows) == 1:  # alone: limited by its slowest link
            f = flows[0]
            f.rate = min(self.capacity[k] / d for k, d in f.demand.items())
            self._schedule(f)
            return
        # progressive filling on byte rate b_f = rate_f * norm_f
        unfrozen = list(flows)
        used: dict[int, float] = {}
        level: dict[int, float] = {}
        while unfrozen:
            best_link, best_lambda = -1, float("inf")
            links = sorted({link for f in unfrozen for link in f.demand})
            for link in links:
                coef = sum(f.demand[link] / f.norm for f in unfrozen if link in f.demand)
                room = self.capacity[link] - used.get(link, 0.0)
                lam = max(room, 0.0) / coef
                if lam < best_lambda:
                    best_link, best_lambda = link, lam
            frozen = [f for f in unfrozen if best_link in f.demand]
            unfrozen = [f for f in unfrozen if best_link not in f.demand]
            for f in frozen:
                level[f.seq] = best_lambda
                for link, d in f.demand.items():
                    used[link] = used.get(link, 0.0) + d / f.norm * best_lambda
        for f in flows:
            f.rate = level[f.seq] / f.norm
            self._schedule(f)

    def _schedule(self, f: _Flow) -> None:
        f.version += 1
        version = f.version
        delay = max(f.remaining, 0.0) / f.rate if f.rate > 0 else float("inf")
        if delay == float("inf"):
            raise RuntimeError("a transfer got no bandwidth (zero-capacity link)")
        ev = self.env.timeout(delay)
        ev.callbacks.append(lambda _ev, f=f, v=version: self._finish(f, v))

    def _finish(self, f: _Flow, version: int) -> None:
        if version != f.version:
            return  # rescheduled since
        neighbours = self._component(f)
        del neighbours[f.seq]
        for link in f.demand:
            del self._on_link[link][f.seq]
        self.active -= 1
        f.remaining = 0.0
        f.done.succeed()
        # the finished flow's links free up: re-share every connected component it touched
        while neighbours:
            comp = self._component(neighbours[min(neighbours)])
            for seq in comp:
                neighbours.pop(seq, None)
            self._reshare(comp)
