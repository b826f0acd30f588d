"""The emulated cluster: one network namespace per node, joined by tc-rate-limited veth links.

Multi-node traffic crosses a real, slower network on one machine (root only).

Layout for a testbed with prefix P and N nodes (nothing is created in the host's own namespace):

    namespace P-sw:   bridge P-br, ports P-p0 .. P-p{N-1}      (the switch)
    namespace P-n{i}: lo, veth P-e{i} = 10.213.S.{i+1}/24      (node i; S = subnet index)

Node i's link is the veth pair P-e{i} <-> P-p{i}. A tbf qdisc at `rate_Gbps` sits on both ends'
egress, so each node sends and receives at the link rate (full duplex, like a NIC). Ranks of one
node talk over loopback inside their namespace (traffic to the node's own address stays local);
ranks of different nodes cross two rate-limited links. Every name starts with the prefix, so
`down` finds and removes leftovers after a crash; deleting a namespace removes its veths and
qdiscs with it.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click

from simfed.spec import Scenario, SpecError, load_scenario
from simfed.spec.overrides import parse_sets

DEFAULT_PREFIX = "sfb"
SUBNET_FMT = "10.213.{subnet}"  # private; exists only inside the testbed's namespaces
MAX_NODES = 64
MAX_RATE_GBPS = 40.0
STATE_DIR = Path(os.environ.get("SIMFED_TESTBED_STATE_DIR", "/run/simfed-testbed"))
_PREFIX_RE = re.compile(r"[a-z][a-z0-9]{0,7}")
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class TestbedError(RuntimeError):
    """A testbed that cannot be built, used or removed; the message is one line."""

    __test__ = False  # not a pytest test class


# ---------------------------------------------------------------------------------------------
# privileges and shell helpers


def privilege_problem() -> str | None:
    """Why this process cannot build a testbed (one line), or None when it can (cheap checks)."""
    if not sys.platform.startswith("linux"):
        return f"realrun testbed needs Linux network namespaces; this is {sys.platform}"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"realrun testbed needs the {' and '.join(missing)} command(s) (iproute2)"
    if os.geteuid() != 0:
        return (f"realrun testbed needs root to create network namespaces (euid is "
                f"{os.geteuid()}); run it as root, e.g. with sudo")
    return None


def namespaces_unavailable(prefix: str = "sfbprobe") -> str | None:
    """Like `privilege_problem`, but also tries to create and delete a namespace (for tests)."""
    problem = privilege_problem()
    if problem:
        return problem
    ns = f"{prefix}-sw"
    proc = subprocess.run(["ip", "netns", "add", ns], capture_output=True, text=True)
    if proc.returncode != 0:
        return f"cannot create a network namespace: {_first_line(proc.stderr)}"
    subprocess.run(["ip", "netns", "del", ns], capture_output=True, text=True)
    return None


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[0] if lines else "(no message)"


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(args), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise TestbedError(f"`{' '.join(args)}` failed: {_first_line(proc.stderr)}")
    return proc


def list_namespaces() -> list[str]:
    proc = _sh("ip", "netns", "list", check=False)
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def _is_ours(ns: str, prefix: str) -> bool:
    return ns == f"{prefix}-sw" or re.fullmatch(rf"{re.escape(prefix)}-n\d+", ns) is not None


def testbed_prefixes() -> list[str]:
    """Prefixes of every testbed (or leftover) found on this machine."""
    found = {m.group(1) for ns in list_namespaces()
             if (m := re.fullmatch(r"([a-z][a-z0-9]{0,7})-(?:sw|n\d+)", ns))}
    if STATE_DIR.is_dir():
        found |= {p.stem for p in STATE_DIR.glob("*.json") if _PREFIX_RE.fullmatch(p.stem)}
    return sorted(found)


@contextlib.contextmanager
def _signals_blocked() -> Iterator[None]:
    """Hold Ctrl-C / SIGTERM / SIGHUP while a clean-up runs, so it always finishes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def cleanup(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Remove every namespace of testbed `prefix` (ending the processes inside it first) and its
    state file. Idempotent; returns what it removed. Everything else on the machine is left."""
    _check_prefix(prefix)
    removed: list[str] = []
    with _signals_blocked():
        ours = [ns for ns in list_namespaces() if _is_ours(ns, prefix)]
        pids: set[int] = set()
        for ns in ours:  # only processes inside our private namespaces: ones we started
            out = _sh("ip", "netns", "pids", ns, check=False).stdout
            pids |= {int(p) for p in out.split() if p.isdigit()}
        _kill_pids(pids)
        for ns in ours:
            if _sh("ip", "netns", "del", ns, check=False).returncode == 0:
                removed.append(ns)
        state = state_path(prefix)
        if state.exists():
            state.unlink()
            removed.append(str(state))
    left = [ns for ns in list_namespaces() if _is_ours(ns, prefix)]
    if left:
        raise TestbedError(f"could not remove namespace(s) {', '.join(left)}")
    return removed


def _kill_pids(pids: set[int], grace_s: float = 3.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = set()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
                alive.add(pid)
        deadline = time.monotonic() + grace_s
        while alive and time.monotonic() < deadline:
            alive = {pid for pid in alive if Path(f"/proc/{pid}").exists()
                     and not _is_zombie(pid)}
            time.sleep(0.05)
        pids = alive
        if not pids:
            return


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _check_prefix(prefix: str) -> None:
    if not _PREFIX_RE.fullmatch(prefix):
        raise TestbedError(
            f"prefix {prefix!r}: use 1-8 lowercase letters or digits, starting with a letter"
        )


def state_path(prefix: str) -> Path:
    return STATE_DIR / f"{prefix}.json"


def _read_state(prefix: str) -> dict[str, Any] | None:
    try:
        state = json.loads(state_path(prefix).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def _owner_pid(prefix: str) -> int | None:
    """The live process that holds testbed `prefix` open (a `with Testbed`), if any."""
    state = _read_state(prefix) or {}
    pid = state.get("pid") if state.get("held") else None
    if isinstance(pid, int) and Path(f"/proc/{pid}").exists() and not _is_zombie(pid):
        return pid
    return None


# ---------------------------------------------------------------------------------------------
# the testbed


@dataclass(frozen=True, kw_only=True)
class TestbedSpec:
    """What to build: nodes x ranks per node, the per-node link rate, the host cores they share."""

    __test__ = False

    nodes: int
    rate_Gbps: float
    ranks_per_node: int = 1
    cpu_cores: int = 0  # cores per node (0 = no pinning: every rank may use every core)
    latency_us: float = 0.0  # added one-way per link with netem; 0 = the bridge's own latency
    prefix: str = DEFAULT_PREFIX
    subnet: int = 0  # third octet of 10.213.S.0/24
    scenario: str = ""

    def __post_init__(self) -> None:
        _check_prefix(self.prefix)
        if not isinstance(self.nodes, int) or not 1 <= self.nodes <= MAX_NODES:
            raise TestbedError(f"nodes: must be 1..{MAX_NODES}, got {self.nodes!r}")
        if not isinstance(self.ranks_per_node, int) or self.ranks_per_node < 1:
            raise TestbedError(f"ranks_per_node: must be >= 1, got {self.ranks_per_node!r}")
        if not 0 < self.rate_Gbps <= MAX_RATE_GBPS:
            raise TestbedError(
                f"rate_Gbps: must be in (0, {MAX_RATE_GBPS:g}] (a veth on this host), "
                f"got {self.rate_Gbps:g}"
            )
        if self.cpu_cores < 0:
            raise TestbedError(f"cpu_cores: must be >= 0, got {self.cpu_cores}")
        if self.latency_us < 0:
            raise TestbedError(f"latency_us: must be >= 0, got {self.latency_us:g}")
        if not 0 <= self.subnet <= 255:
            raise TestbedError(f"subnet: must be 0..255, got {self.subnet}")

    @classmethod
    def from_scenario(cls, scenario: Scenario, *, prefix: str = DEFAULT_PREFIX,
                      emulate_latency: bool = False, source: str = "") -> TestbedSpec:
        """nodes, node.gpus ranks per node, node.nics.bw_Gbps x count as each node's link rate,
        node.cpu_cores; node.nics.latency_us only with `emulate_latency` (needs netem)."""
        c = scenario.cluster
        return cls(
            nodes=c.nodes, ranks_per_node=c.node.gpus,
            rate_Gbps=c.node.nics.bw_Gbps * c.node.nics.count, cpu_cores=c.node.cpu_cores,
            latency_us=c.node.nics.latency_us if emulate_latency else 0.0, prefix=prefix,
            scenario=source,
        )

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def switch_ns(self) -> str:
        return f"{self.prefix}-sw"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br"

    def node_ns(self, node: int) -> str:
        return f"{self.prefix}-n{node}"

    def node_ifname(self, node: int) -> str:
        """The veth inside node `node`'s namespace (what GLOO_SOCKET_IFNAME names)."""
        return f"{self.prefix}-e{node}"

    def port_ifname(self, node: int) -> str:
        return f"{self.prefix}-p{node}"

    def node_ip(self, node: int) -> str:
        return f"{SUBNET_FMT.format(subnet=self.subnet)}.{node + 1}"

    def cpu_set(self, node: int) -> tuple[int, ...]:
        """Host cores node `node`'s ranks are pinned to: `cpu_cores` per node, handed out in turn
        over the cores this process may use (nodes share cores when there are too few)."""
        avail = sorted(os.sched_getaffinity(0))
        if self.cpu_cores == 0:
            return tuple(avail)
        count = min(self.cpu_cores, len(avail))
        return tuple(sorted({avail[(node * self.cpu_cores + j) % len(avail)]
                             for j in range(count)}))

    @property
    def host_cores(self) -> int:
        """Distinct host cores all ranks together may run on."""
        return len({c for i in range(self.nodes) for c in self.cpu_set(i)})

    def tbf_args(self) -> list[str]:
        """tbf: the rate, a burst of ~1 ms of traffic (>= 32 KiB, so a full-size segment always
        fits) and a queue of ~20 ms (>= 256 KiB) before drops make TCP back off."""
        rate_Bps = self.rate_Gbps * 1e9 / 8
        burst_nbytes = max(int(rate_Bps * 1e-3), 32 * 1024)
        limit_nbytes = max(int(rate_Bps * 20e-3), 256 * 1024)
        return ["rate", f"{int(self.rate_Gbps * 1e9)}bit", "burst", str(burst_nbytes),
                "limit", str(limit_nbytes)]


@dataclass
class NodeRun:
    node: int
    returncode: int | None  # None: still running at the timeout (or after another node failed)
    log_path: str
    output: str


@dataclass
class LaunchResult:
    """Exit codes and output of a multi-node torchrun job, one entry per node."""

    nodes: list[NodeRun] = field(default_factory=list)
    elapsed_s: float = 0.0
    timed_out: bool = False
    command: list[str] = field(default_factory=list)

    @property
    def returncodes(self) -> list[int | None]:
        return [n.returncode for n in self.nodes]

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(rc == 0 for rc in self.returncodes)

    def summary(self) -> str:
        """One line: what failed, with exit codes and the first error line of the output."""
        if self.ok:
            return f"ok: {len(self.nodes)} nodes in {self.elapsed_s:.1f} s"
        bad = [n for n in self.nodes if n.returncode != 0]
        hint = ""
        for n in bad:
            errs = [ln for ln in n.output.splitlines() if "Error" in ln or "error" in ln]
            if errs:
                hint = f"; node {n.node}: {errs[-1].strip()[:200]}"
                break
        what = f"timed out after {self.elapsed_s:.0f} s" if self.timed_out else "failed"
        codes = ", ".join(f"node {n.node}: {n.returncode}" for n in self.nodes)
        return f"job {what} (exit codes {codes}){hint}"


_ACTIVE: set[Testbed] = set()
_ATEXIT_REGISTERED = False


def _cleanup_active() -> None:
    for tb in list(_ACTIVE):
        with contextlib.suppress(Exception):
            tb.down()


def _raise_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


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
        _check_prefix(prefix)
        problem = privilege_problem()
        if problem:
            raise TestbedError(problem)
        path = state_path(prefix)
        if not path.exists():
            raise TestbedError(f"no testbed {prefix!r} is up (no {path}); run "
                               f"`realrun testbed up SCENARIO` first")
        owner = _owner_pid(prefix)
        if owner is not None and owner != os.getpid():
            raise TestbedError(f"testbed {prefix!r} is in use by running process {owner}; "
                               f"use another --prefix")
        spec = TestbedSpec(**json.loads(path.read_text())["spec"])
        missing = [ns for ns in [spec.switch_ns] + [spec.node_ns(i) for i in range(spec.nodes)]
                   if ns not in list_namespaces()]
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
        problem = privilege_problem()
        if problem:
            raise TestbedError(problem)
        s = self.spec
        owner = _owner_pid(s.prefix)
        if owner is not None and owner != os.getpid():
            raise TestbedError(
                f"testbed {s.prefix!r} is in use by running process {owner}; use another "
                f"--prefix, or stop that process"
            )
        cleanup(s.prefix)  # leftovers of an earlier crash, or a testbed `up` left
        try:
            self._build()
            self._write_state(held=hold)
        except BaseException:
            cleanup(s.prefix)
            raise
        self._is_up = True
        return self

    def _build(self) -> None:
        s = self.spec
        if s.latency_us > 0 and not _netem_available(s.prefix):
            raise TestbedError(
                f"latency_us={s.latency_us:g} needs the netem qdisc, which this kernel lacks; "
                f"use latency 0 (the bridge adds its own ~10-50 us)"
            )
        sw = s.switch_ns
        proc = _sh("ip", "netns", "add", sw, check=False)
        if proc.returncode != 0:
            raise TestbedError(f"cannot create network namespaces (needs root with CAP_SYS_ADMIN "
                               f"and CAP_NET_ADMIN): {_first_line(proc.stderr)}")
        _sh("ip", "-n", sw, "link", "add", s.bridge, "type", "bridge")
        _sh("ip", "-n", sw, "link", "set", s.bridge, "up")
        for i in range(s.nodes):
            ns, eth, port = s.node_ns(i), s.node_ifname(i), s.port_ifname(i)
            _sh("ip", "netns", "add", ns)
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            _sh("ip", "link", "add", eth, "netns", ns, "type", "veth",
                "peer", "name", port, "netns", sw)
            _sh("ip", "-n", sw, "link", "set", port, "master", s.bridge)
            _sh("ip", "-n", sw, "link", "set", port, "up")
            _sh("ip", "-n", ns, "addr", "add", f"{s.node_ip(i)}/24", "dev", eth)
            _sh("ip", "-n", ns, "link", "set", eth, "up")
            for where, dev in ((ns, eth), (sw, port)):
                _sh("tc", "-n", where, "qdisc", "replace", "dev", dev, "root", "handle", "1:",
                    "tbf", *s.tbf_args())
                if s.latency_us > 0:
                    _sh("tc", "-n", where, "qdisc", "add", "dev", dev, "parent", "1:1",
                        "handle", "10:", "netem", "delay", f"{s.latency_us:g}us")

    def _write_state(self, held: bool) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        state = {"spec": asdict(self.spec), "created": time.time(), "pid": os.getpid(),
                 "held": held}
        state_path(self.spec.prefix).write_text(json.dumps(state, indent=1) + "\n")

    def down(self) -> list[str]:
        removed = cleanup(self.spec.prefix)
        self._is_up = False
        _ACTIVE.discard(self)
        return removed

    def __enter__(self) -> Testbed:
        global _ATEXIT_REGISTERED
        if not _ATEXIT_REGISTERED:
            atexit.register(_cleanup_active)
            _ATEXIT_REGISTERED = True
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                self._prev_handlers[sig] = signal.getsignal(sig)
                signal.signal(sig, _raise_on_signal)
        _ACTIVE.add(self)
        try:
            return self.up(hold=True)
        except BaseException:
            self._restore_handlers()
            _ACTIVE.discard(self)
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self.down()
        finally:
            self._restore_handlers()

    def _restore_handlers(self) -> None:
        for sig, handler in self._prev_handlers.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._prev_handlers.clear()

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
        port = master_port or _pick_port()
        logs = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix=f"{s.prefix}-launch-"))
        logs.mkdir(parents=True, exist_ok=True)
        procs: list[subprocess.Popen[bytes]] = []
        handles = []
        result = LaunchResult()
        start = time.monotonic()
        try:
            for i in range(s.nodes):
                argv = [*_torchrun(), "--nnodes", str(s.nodes), "--nproc-per-node", str(nproc),
                        "--node-rank", str(i), "--master-addr", s.node_ip(0),
                        "--master-port", str(port), "--max-restarts", "0",
                        "-m", module, *args]
                cmd = self.exec_argv(i, argv)
                if i == 0:
                    result.command = cmd
                fh = open(logs / f"node{i}.log", "wb")  # noqa: SIM115 - closed below
                handles.append(fh)
                procs.append(subprocess.Popen(
                    cmd, stdout=fh, stderr=subprocess.STDOUT, env=self.node_env(i, env),
                    cwd=cwd, start_new_session=True, preexec_fn=_die_with_parent,
                ))
            deadline = start + timeout_s
            while any(p.poll() is None for p in procs):
                now = time.monotonic()
                if now > deadline:
                    result.timed_out = True
                    break
                if any(p.returncode not in (None, 0) for p in procs):
                    deadline = min(deadline, now + fail_grace_s)
                time.sleep(0.05)
        finally:
            killed = set()
            for i, p in enumerate(procs):
                if p.poll() is None:
                    killed.add(i)
                    kill_group(p)
            for fh in handles:
                fh.close()
        result.elapsed_s = time.monotonic() - start
        for i, p in enumerate(procs):
            path = logs / f"node{i}.log"
            text = path.read_text(errors="replace")
            rc = None if i in killed else p.returncode
            result.nodes.append(NodeRun(node=i, returncode=rc, log_path=str(path), output=text))
        return result


@contextlib.contextmanager
def testbed_for(scenario: Scenario | None, *, prefix: str = DEFAULT_PREFIX,
                rate_Gbps: float | None = None, source: str = "",
                echo: Any = None) -> Iterator[Testbed]:
    """The testbed `realrun testbed up` left under `prefix` (it must match the scenario's
    nodes x ranks), else a temporary one built from the scenario and removed afterwards."""
    state = _read_state(prefix)
    if state is not None and not state.get("held"):  # left up by `realrun testbed up`
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
        spec = TestbedSpec(**{**asdict(spec), "rate_Gbps": rate_Gbps})
    with Testbed(spec) as tb:
        if echo:
            echo(describe(spec))
        yield tb


def _torchrun() -> list[str]:
    exe = Path(sys.executable).with_name("torchrun")
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-m", "torch.distributed.run"]


def _pick_port() -> int:
    """A port for node 0's rendezvous store. The node namespaces are private, so only our own
    earlier jobs could hold it; a random one in a high range avoids their TIME_WAIT sockets."""
    return 20000 + int.from_bytes(os.urandom(2), "little") % 20000


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the launcher dies (even by SIGKILL)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def kill_group(proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _netem_available(prefix: str) -> bool:
    ns = f"{prefix}-sw"
    created = ns not in list_namespaces()
    if created:
        _sh("ip", "netns", "add", ns)
    try:
        ok = _sh("tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1us",
                 check=False).returncode == 0
        _sh("tc", "-n", ns, "qdisc", "del", "dev", "lo", "root", check=False)
        return ok
    finally:
        if created:
            _sh("ip", "netns", "del", ns, check=False)


# ---------------------------------------------------------------------------------------------
# status


def _qdisc_rates(ns: str, dev: str) -> list[str]:
    out = _sh("tc", "-n", ns, "qdisc", "show", "dev", dev, check=False).stdout
    return [" ".join(line.split()[:2] + line.split()[line.split().index("rate"):][:2])
            if "rate" in line.split() else " ".join(line.split()[:2])
            for line in out.splitlines() if line.strip()]


def testbed_status(prefix: str = DEFAULT_PREFIX) -> dict[str, Any]:
    """Namespaces, addresses and qdiscs of testbed `prefix` as the kernel reports them."""
    _check_prefix(prefix)
    ours = sorted((ns for ns in list_namespaces() if _is_ours(ns, prefix)),
                  key=lambda n: (n.endswith("-sw"), int(n.rsplit("n", 1)[-1])
                                 if not n.endswith("-sw") else 0))
    path = state_path(prefix)
    state = json.loads(path.read_text()) if path.exists() else None
    nodes = []
    for ns in ours:
        if ns.endswith("-sw"):
            continue
        i = int(ns.rsplit("-n", 1)[1])
        dev = f"{prefix}-e{i}"
        addr = _sh("ip", "-n", ns, "-o", "-4", "addr", "show", "dev", dev, check=False).stdout
        ips = re.findall(r"inet (\S+)", addr)
        nodes.append({"namespace": ns, "ifname": dev, "addr": ips[0] if ips else "",
                      "egress": _qdisc_rates(ns, dev),
                      "ingress": _qdisc_rates(f"{prefix}-sw", f"{prefix}-p{i}")})
    return {"prefix": prefix, "namespaces": ours, "nodes": nodes,
            "spec": state["spec"] if state else None, "complete": bool(state) and
            len(nodes) == state["spec"]["nodes"] and f"{prefix}-sw" in ours}


# ---------------------------------------------------------------------------------------------
# command line: realrun testbed up | down | status | run


def _load(scenario: str, sets: Sequence[str]) -> Scenario:
    try:
        return load_scenario(scenario, parse_sets(sets))
    except SpecError as exc:
        raise TestbedError(str(exc)) from None


def _fail(exc: Exception) -> None:
    click.echo(f"error: {exc}", err=True)
    raise SystemExit(2)


def describe(spec: TestbedSpec) -> str:
    cores = f"{spec.cpu_cores} cores/node" if spec.cpu_cores else "all cores"
    return (f"testbed {spec.prefix}: {spec.nodes} nodes x {spec.ranks_per_node} ranks, "
            f"link {spec.rate_Gbps:g} Gb/s per node, {cores} "
            f"({spec.host_cores} host cores shared), node 0 at {spec.node_ip(0)}")


_prefix_option = click.option("--prefix", default=DEFAULT_PREFIX, show_default=True,
                              help="name prefix of the namespaces and links")
_set_option = click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                           help="override a scenario value, e.g. cluster.nodes=4")
_rate_option = click.option("--rate-Gbps", "rate_Gbps", type=float, default=None,
                            help="link rate per node (default: nics.bw_Gbps x count)")


def _spec_from(scenario: str, sets: Sequence[str], prefix: str, rate_Gbps: float | None,
               latency: bool) -> TestbedSpec:
    scn = _load(scenario, sets)
    spec = TestbedSpec.from_scenario(scn, prefix=prefix, emulate_latency=latency,
                                     source=scenario)
    if rate_Gbps is not None:
        spec = TestbedSpec(**{**asdict(spec), "rate_Gbps": rate_Gbps})
    return spec


@click.group("testbed")
def testbed_group() -> None:
    """An emulated multi-node cluster on this machine (network namespaces + tc), as root."""


@testbed_group.command("up")
@click.argument("scenario", type=click.Path(dir_okay=False))
@_prefix_option
@_set_option
@_rate_option
@click.option("--latency/--no-latency", default=False,
              help="also add nics.latency_us with netem (if the kernel has it)")
def up_command(scenario: str, prefix: str, sets: tuple[str, ...], rate_Gbps: float | None,
               latency: bool) -> None:
    """Build the testbed a SCENARIO's cluster section describes, and leave it up."""
    try:
        spec = _spec_from(scenario, sets, prefix, rate_Gbps, latency)
        Testbed(spec).up()
    except (TestbedError, SpecError) as exc:
        _fail(exc)
    click.echo(describe(spec))
    click.echo(f"remove it with: realrun testbed down --prefix {prefix}")


@testbed_group.command("down")
@_prefix_option
@click.option("--all", "all_", is_flag=True, help="remove every testbed found")
def down_command(prefix: str, all_: bool) -> None:
    """Remove a testbed (namespaces, links, qdiscs, its processes); safe to repeat."""
    problem = privilege_problem()
    if problem:
        _fail(TestbedError(problem))
    try:
        prefixes = testbed_prefixes() if all_ else [prefix]
        removed = [r for p in prefixes for r in cleanup(p)]
    except TestbedError as exc:
        _fail(exc)
    click.echo(f"removed {len(removed)}: {', '.join(removed)}" if removed else "nothing to remove")


@testbed_group.command("status")
@_prefix_option
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def status_command(prefix: str, as_json: bool) -> None:
    """Show the testbeds on this machine as the kernel reports them."""
    problem = privilege_problem()
    if problem:
        _fail(TestbedError(problem))
    try:
        prefixes = sorted(set(testbed_prefixes()) | {prefix})
        states = [st for p in prefixes if (st := testbed_status(p))["namespaces"] or st["spec"]]
    except TestbedError as exc:
        _fail(exc)
    if as_json:
        click.echo(json.dumps(states, indent=1))
        return
    if not states:
        click.echo("no testbed is up")
    for st in states:
        head = describe(TestbedSpec(**st["spec"])) if st["spec"] else f"testbed {st['prefix']}"
        click.echo(head + ("" if st["complete"] else "  [INCOMPLETE: run `down`]"))
        for n in st["nodes"]:
            click.echo(f"  {n['namespace']:<10} {n['ifname']:<8} {n['addr']:<16} "
                       f"out: {'; '.join(n['egress'])}  in: {'; '.join(n['ingress'])}")


@testbed_group.command("run", context_settings={"ignore_unknown_options": True})
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("-m", "--module", default="realrun.train", show_default=True,
              help="python module torchrun starts on every rank")
@click.option("--timeout-s", type=float, default=600.0, show_default=True)
@click.option("--log-dir", type=click.Path(file_okay=False), default=None)
@_prefix_option
@_set_option
@_rate_option
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run_command(scenario: str, module: str, timeout_s: float, log_dir: str | None, prefix: str,
                sets: tuple[str, ...], rate_Gbps: float | None, args: tuple[str, ...]) -> None:
    """Run `torchrun -m MODULE ARGS` across the testbed's nodes (on the one `up` left, or on a
    temporary one built from SCENARIO). Example:
    realrun testbed run scenarios/testbed.yaml -- scenarios/testbed.yaml --algorithm fsdp --out o"""
    try:
        scn = _load(scenario, sets)
        with testbed_for(scn, prefix=prefix, rate_Gbps=rate_Gbps, source=scenario,
                         echo=lambda m: click.echo(m, err=True)) as tb:
            result = tb.launch(module, args, timeout_s=timeout_s, log_dir=log_dir)
    except (TestbedError, SpecError) as exc:
        _fail(exc)
    for n in result.nodes:
        click.echo(f"--- node {n.node} (exit {n.returncode}), log {n.log_path}")
        click.echo(n.output.rstrip()[-4000:])
    if not result.ok:
        _fail(TestbedError(result.summary()))
