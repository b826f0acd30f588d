"""The emulated cluster as an object: `with Testbed(...) as tb:` builds it and removes it on
every exit path; `tb.launch` runs torchrun on every node (through realrun.torchrun)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from simfed.spec import Scenario, load_scenario

from ..torchrun import LaunchResult, pick_port, run_jobs, torchrun_argv
from . import netns, signals, state
from .spec import DEFAULT_PREFIX, TestbedError, TestbedSpec, check_prefix


def cleanup(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Remove every namespace of testbed `prefix` (ending the processes inside it first) and its
    state file. Idempotent; returns what it removed. Everything else on the machine is left."""
    check_prefix(prefix)
    with signals.signals_blocked():
        removed = netns.remove_namespaces(prefix)
        removed += state.remove_state(prefix)
    left = [ns for ns in netns.list_namespaces() if netns.is_ours(ns, prefix)]
    if left:
        raise TestbedError(f"could not remove namespace(s) {', '.join(left)}")
    return removed


def testbed_prefixes() -> list[str]:
    """Prefixes of every testbed (or leftover) found on this machine."""
    return sorted(netns.namespace_prefixes() | state.state_prefixes())


def testbed_status(prefix: str = DEFAULT_PREFIX) -> dict[str, Any]:
    """Namespaces, addresses and qdiscs of testbed `prefix` as the kernel reports them."""
    check_prefix(prefix)
    ours, nodes = netns.read_back(prefix)
    path = state.state_path(prefix)
    st = json.loads(path.read_text()) if path.exists() else None
    return {"prefix": prefix, "namespaces": ours, "nodes": nodes,
            "spec": st["spec"] if st else None, "complete": bool(st) and
            len(nodes) == st["spec"]["nodes"] and f"{prefix}-sw" in ours}


def describe(spec: TestbedSpec) -> str:
    cores = f"{spec.cpu_cores} cores/node" if spec.cpu_cores else "all cores"
    return (f"testbed {spec.prefix}: {spec.nodes} nodes x {spec.ranks_per_node} ranks, "
            f"link {spec.rate_Gbps:g} Gb/s per node, {cores} "
            f"({spec.host_cores} host cores shared), node 0 at {spec.node_ip(0)}")


class Testbed:
    """An emulated cluster; `with Testbed(nodes=2, rate_Gbps=0.5, ranks_per_node=2) as tb:`
    builds it, and removes it on leaving the block, on an exception, Ctrl-C, SIGTERM or SIGHUP,
    and at interpreter exit. No I/O happens before `up()` / `__enter__`."""

    __test__ = False

    def __init__(self, spec: TestbedSpec | None = None, **kwargs: Any):
        if spec is not None and kwargs:
            raise TypeError("pass either a TestbedSpec or keyword arguments, not both")
        self.spec = spec if spec is not None else TestbedSpec(**kwargs)
        self._is_up = False
        self._prev_handlers: dict[int, Any] = {}

    @classmethod
    def from_scenario(cls, scenario: Scenario | str | Path, **kwargs: Any) -> Testbed:
        source = ""
        if not isinstance(scenario, Scenario):
            source = str(scenario)
            scenario = load_scenario(scenario)
        return cls(TestbedSpec.from_scenario(scenario, source=source, **kwargs))

    @classmethod
    def attach(cls, prefix: str = DEFAULT_PREFIX) -> Testbed:
        """The testbed `realrun testbed up` left running under `prefix`."""
        check_prefix(prefix)
        problem = netns.privilege_problem()
        if problem:
            raise TestbedError(problem)
        path = state.state_path(prefix)
        if not path.exists():
            raise TestbedError(f"no testbed {prefix!r} is up (no {path}); run "
                               f"`realrun testbed up SCENARIO` first")
        owner = state.owner_pid(prefix)
        if owner is not None and owner != os.getpid():
            raise TestbedError(f"testbed {prefix!r} is in use by running process {owner}; "
                               f"use another --prefix")
        spec = TestbedSpec(**json.loads(path.read_text())["spec"])
        have = netns.list_namespaces()
        missing = [ns for ns in [spec.switch_ns] + [spec.node_ns(i) for i in range(spec.nodes)]
                   if ns not in have]
        if missing:
            raise TestbedError(f"testbed {prefix!r} is incomplete (missing {', '.join(missing)});"
                               f" run `realrun testbed down --prefix {prefix}`")
        tb = cls(spec)
        tb._is_up = True
        return tb

    @property
    def is_up(self) -> bool:
        return self._is_up

    # ---- life cycle -----------------------------------------------------------------------
    def up(self, *, hold: bool = False) -> Testbed:
        """Build it. `hold`: this process owns it (others may not replace it while it lives);
        without, it stays up for later commands until `down` (what `realrun testbed up` does)."""
        problem = netns.privilege_problem()
        if problem:
            raise TestbedError(problem)
        s = self.spec
        owner = state.owner_pid(s.prefix)
        if owner is not None and owner != os.getpid():
            raise TestbedError(
                f"testbed {s.prefix!r} is in use by running process {owner}; use another "
                f"--prefix, or stop that process"
            )
        cleanup(s.prefix)  # leftovers of an earlier crash, or a testbed `up` left
        try:
            netns.build(s)
            state.write_state(s, held=hold)
        except BaseException:
            cleanup(s.prefix)
            raise
        self._is_up = True
        return self

    def down(self) -> list[str]:
        removed = cleanup(self.spec.prefix)
        self._is_up = False
        signals.forget(id(self))
        return removed

    def __enter__(self) -> Testbed:
        self._prev_handlers = signals.hold(id(self), self.down)
        try:
            return self.up(hold=True)
        except BaseException:
            signals.restore(self._prev_handlers)
            signals.forget(id(self))
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self.down()
        finally:
            signals.restore(self._prev_handlers)

    def __hash__(self) -> int:
        return id(self)

    # ---- inspection -----------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """What is really in place: namespaces, addresses, qdiscs (read back from the kernel)."""
        return testbed_status(self.spec.prefix)

    # ---- running jobs ---------------------------------------------------------------------
    def exec_argv(self, node: int, argv: Sequence[str]) -> list[str]:
        """`ip netns exec` node `node`, pinned to its cores: the command line for `argv`."""
        s = self.spec
        cmd = ["ip", "netns", "exec", s.node_ns(node)]
        if s.cpu_cores and shutil.which("taskset"):
            cmd += ["taskset", "-c", ",".join(map(str, s.cpu_set(node)))]
        return cmd + list(argv)

    def node_env(self, node: int, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        s = self.spec
        env = dict(os.environ)
        env.update({
            "OMP_NUM_THREADS": "1",
            "GLOO_SOCKET_IFNAME": s.node_ifname(node),
            "PYTHONUNBUFFERED": "1",
            "SIMFED_TESTBED": s.prefix,
            "SIMFED_TESTBED_NODE": str(node),
            "SIMFED_TESTBED_NODES": str(s.nodes),
            "SIMFED_TESTBED_RATE_GBPS": f"{s.rate_Gbps:g}",
            "SIMFED_TESTBED_CPUS": ",".join(map(str, s.cpu_set(node))),
            "SIMFED_TESTBED_HOST_CORES": str(s.host_cores),
        })
        env.update(extra or {})
        return env

    def launch(
        self,
        module: str,
        args: Sequence[str] = (),
        *,
        nproc_per_node: int | None = None,
        master_port: int | None = None,
        timeout_s: float = 600.0,
        env: Mapping[str, str] | None = None,
        log_dir: str | Path | None = None,
        cwd: str | Path | None = None,
        fail_grace_s: float = 15.0,
    ) -> LaunchResult:
        """Run `torchrun -m module args` on every node (node i = torchrun node rank i, ranks
        i*G .. i*G+G-1), rendezvous at node 0; wait for all, up to `timeout_s`. A node that fails
        gives the others `fail_grace_s` to finish before they are ended. Output goes to
        `log_dir/node{i}.log` (a temporary folder by default) and into the result."""
        if not self._is_up:
            raise TestbedError("the testbed is not up; use `with Testbed(...)` or .up() first")
        s = self.spec
        nproc = nproc_per_node or s.ranks_per_node
        port = master_port or pick_port()
        logs = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix=f"{s.prefix}-launch-"))
        logs.mkdir(parents=True, exist_ok=True)
        cmds = [self.exec_argv(i, torchrun_argv(
                    module, args, nproc_per_node=nproc, nnodes=s.nodes, node_rank=i,
                    master_addr=s.node_ip(0), master_port=port))
                for i in range(s.nodes)]
        return run_jobs(cmds, [self.node_env(i, env) for i in range(s.nodes)],
                        [logs / f"node{i}.log" for i in range(s.nodes)], timeout_s=timeout_s,
                        fail_grace_s=fail_grace_s, cwd=cwd)


@contextlib.contextmanager
def testbed_for(scenario: Scenario | None, *, prefix: str = DEFAULT_PREFIX,
                rate_Gbps: float | None = None, source: str = "",
                echo: Any = None) -> Iterator[Testbed]:
    """The testbed `realrun testbed up` left under `prefix` (it must match the scenario's
    nodes x ranks), else a temporary one built from the scenario and removed afterwards."""
    st = state.read_state(prefix)
    if st is not None and not st.get("held"):  # left up by `realrun testbed up`
        tb = Testbed.attach(prefix)
        s = tb.spec
        if scenario is not None and (s.nodes, s.ranks_per_node) != (
                scenario.cluster.nodes, scenario.cluster.node.gpus):
            raise TestbedError(
                f"testbed {prefix!r} is up with {s.nodes} nodes x {s.ranks_per_node} ranks, but "
                f"the scenario has {scenario.cluster.nodes} x {scenario.cluster.node.gpus}; run "
                f"`realrun testbed down --prefix {prefix}` or use another --prefix"
            )
        if rate_Gbps is not None and rate_Gbps != s.rate_Gbps:
            raise TestbedError(f"--rate-Gbps {rate_Gbps:g}: testbed {prefix!r} is already up at "
                               f"{s.rate_Gbps:g} Gb/s")
        if echo:
            echo(f"using {describe(s)}")
        yield tb
        return
    if scenario is None:
        raise TestbedError(f"no testbed {prefix!r} is up; give a SCENARIO to build one")
    spec = TestbedSpec.from_scenario(scenario, prefix=prefix, source=source)
    if rate_Gbps is not None:
        spec = spec.replace(rate_Gbps=rate_Gbps)
    with Testbed(spec) as tb:
        if echo:
            echo(describe(spec))
        yield tb
