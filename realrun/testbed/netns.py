"""Kernel plumbing of a testbed: network namespaces, veth pairs, a bridge and tc qdiscs, built
with `ip` and `tc` (root only), read back, and removed with the processes inside them."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .spec import TestbedError, TestbedSpec


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
        return f"cannot create a network namespace: {first_line(proc.stderr)}"
    subprocess.run(["ip", "netns", "del", ns], capture_output=True, text=True)
    return None


def first_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[0] if lines else "(no message)"


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(args), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise TestbedError(f"`{' '.join(args)}` failed: {first_line(proc.stderr)}")
    return proc


def list_namespaces() -> list[str]:
    proc = sh("ip", "netns", "list", check=False)
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def is_ours(ns: str, prefix: str) -> bool:
    return ns == f"{prefix}-sw" or re.fullmatch(rf"{re.escape(prefix)}-n\d+", ns) is not None


def namespace_prefixes() -> set[str]:
    """Prefixes of every testbed namespace found on this machine."""
    return {m.group(1) for ns in list_namespaces()
            if (m := re.fullmatch(r"([a-z][a-z0-9]{0,7})-(?:sw|n\d+)", ns))}


def build(s: TestbedSpec) -> None:
    """The switch namespace with its bridge, and per node a namespace, a veth pair into the
    bridge, an address and the tbf (and netem) qdiscs on both ends."""
    if s.latency_us > 0 and not netem_available(s.prefix):
        raise TestbedError(
            f"latency_us={s.latency_us:g} needs the netem qdisc, which this kernel lacks; "
            f"use latency 0 (the bridge adds its own ~10-50 us)"
        )
    sw = s.switch_ns
    proc = sh("ip", "netns", "add", sw, check=False)
    if proc.returncode != 0:
        raise TestbedError(f"cannot create network namespaces (needs root with CAP_SYS_ADMIN "
                           f"and CAP_NET_ADMIN): {first_line(proc.stderr)}")
    sh("ip", "-n", sw, "link", "add", s.bridge, "type", "bridge")
    sh("ip", "-n", sw, "link", "set", s.bridge, "up")
    for i in range(s.nodes):
        ns, eth, port = s.node_ns(i), s.node_ifname(i), s.port_ifname(i)
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "link", "add", eth, "netns", ns, "type", "veth",
           "peer", "name", port, "netns", sw)
        sh("ip", "-n", sw, "link", "set", port, "master", s.bridge)
        sh("ip", "-n", sw, "link", "set", port, "up")
        sh("ip", "-n", ns, "addr", "add", f"{s.node_ip(i)}/24", "dev", eth)
        sh("ip", "-n", ns, "link", "set", eth, "up")
        for where, dev in ((ns, eth), (sw, port)):
            sh("tc", "-n", where, "qdisc", "replace", "dev", dev, "root", "handle", "1:",
               "tbf", *s.tbf_args())
            if s.latency_us > 0:
                sh("tc", "-n", where, "qdisc", "add", "dev", dev, "parent", "1:1",
                   "handle", "10:", "netem", "delay", f"{s.latency_us:g}us")


def remove_namespaces(prefix: str) -> list[str]:
    """End the processes inside testbed `prefix`'s namespaces (ones we started: the namespaces
    are private), then delete the namespaces (their veths and qdiscs go with them)."""
    ours = [ns for ns in list_namespaces() if is_ours(ns, prefix)]
    pids: set[int] = set()
    for ns in ours:
        out = sh("ip", "netns", "pids", ns, check=False).stdout
        pids |= {int(p) for p in out.split() if p.isdigit()}
    kill_pids(pids)
    return [ns for ns in ours if sh("ip", "netns", "del", ns, check=False).returncode == 0]


def kill_pids(pids: set[int], grace_s: float = 3.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = set()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
                alive.add(pid)
        deadline = time.monotonic() + grace_s
        while alive and time.monotonic() < deadline:
            alive = {pid for pid in alive if is_alive(pid)}
            time.sleep(0.05)
        pids = alive
        if not pids:
            return


def is_alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    if not Path(f"/proc/{pid}").exists():
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def netem_available(prefix: str) -> bool:
    ns = f"{prefix}-sw"
    created = ns not in list_namespaces()
    if created:
        sh("ip", "netns", "add", ns)
    try:
        ok = sh("tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1us",
                check=False).returncode == 0
        sh("tc", "-n", ns, "qdisc", "del", "dev", "lo", "root", check=False)
        return ok
    finally:
        if created:
            sh("ip", "netns", "del", ns, check=False)


def _qdisc_rates(ns: str, dev: str) -> list[str]:
    out = sh("tc", "-n", ns, "qdisc", "show", "dev", dev, check=False).stdout
    return [" ".join(line.split()[:2] + line.split()[line.split().index("rate"):][:2])
            if "rate" in line.split() else " ".join(line.split()[:2])
            for line in out.splitlines() if line.strip()]


def read_back(prefix: str) -> tuple[list[str], list[dict[str, Any]]]:
    """Testbed `prefix`'s namespaces, and per node its address and qdiscs, as the kernel has
    them."""
    ours = sorted((ns for ns in list_namespaces() if is_ours(ns, prefix)),
                  key=lambda n: (n.endswith("-sw"), int(n.rsplit("n", 1)[-1])
                                 if not n.endswith("-sw") else 0))
    nodes = []
    for ns in ours:
        if ns.endswith("-sw"):
            continue
        i = int(ns.rsplit("-n", 1)[1])
        dev = f"{prefix}-e{i}"
        addr = sh("ip", "-n", ns, "-o", "-4", "addr", "show", "dev", dev, check=False).stdout
        ips = re.findall(r"inet (\S+)", addr)
        nodes.append({"namespace": ns, "ifname": dev, "addr": ips[0] if ips else "",
                      "egress": _qdisc_rates(ns, dev),
                      "ingress": _qdisc_rates(f"{prefix}-sw", f"{prefix}-p{i}")})
    return ours, nodes
