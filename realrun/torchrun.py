"""The one torchrun launcher: the command line, the processes and their end.

`realrun run` (one host, output streamed and diagnosed: realrun.launch), `realrun bench` on this
host and every node of the emulated testbed (realrun.testbed) start torchrun through here:
`torchrun_argv` builds the command (standalone rendezvous on one node, else node 0's address);
`start` runs it in its own session, so that the whole job (torchrun and its workers) can be
ended as one process group, and tied to this process (it gets SIGTERM when we die, even by
SIGKILL); `run_jobs` starts one command per node, waits up to a timeout (a node that fails
gives the others a grace period) and ends what is left.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any


def torchrun_argv(module: str, args: Sequence[str] = (), *, nproc_per_node: int,
                  nnodes: int = 1, node_rank: int = 0, master_addr: str | None = None,
                  master_port: int | None = None) -> list[str]:
    """`python -m torch.distributed.run ... -m module args`, no restarts. Without a master
    address: a standalone rendezvous on this host (it picks a free port); with one: node
    `node_rank` of `nnodes`, rendezvous at master_addr:master_port."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
           "--nproc-per-node", str(nproc_per_node), "--max-restarts", "0"]
    if master_addr is None:
        if nnodes != 1:
            raise ValueError(f"{nnodes} nodes need a master address")
        cmd.append("--standalone")
    else:
        cmd += ["--node-rank", str(node_rank), "--master-addr", master_addr,
                "--master-port", str(master_port or pick_port())]
    return [*cmd, "-m", module, *args]


def pick_port() -> int:
    """A port for node 0's rendezvous store. The testbed's node namespaces are private, so only
    our own earlier jobs could hold it; a random one in a high range avoids their TIME_WAIT
    sockets."""
    return 20000 + int.from_bytes(os.urandom(2), "little") % 20000


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the launcher dies (even by SIGKILL)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start(cmd: Sequence[str], *, stdout: IO[Any] | int, env: Mapping[str, str],
          cwd: str | Path | None = None, text: bool = False) -> subprocess.Popen[Any]:
    """Start `cmd` in its own session (kill_group ends it whole), stderr into stdout."""
    return subprocess.Popen(list(cmd), stdout=stdout, stderr=subprocess.STDOUT, env=dict(env),
                            cwd=cwd, text=text, start_new_session=True,
                            preexec_fn=_die_with_parent)


def kill_group(proc: subprocess.Popen[Any], grace_s: float = 5.0) -> None:
    """End a job started by `start`: SIGTERM to its process group, then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


@dataclass
class NodeRun:
    node: int
    returncode: int | None  # None: still running at the timeout (or after another node failed)
    log_path: str
    output: str


@dataclass
class LaunchResult:
    """Exit codes and output of a (multi-node) torchrun job, one entry per node."""

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


def run_jobs(cmds: Sequence[Sequence[str]], envs: Sequence[Mapping[str, str]],
             log_paths: Sequence[Path], *, timeout_s: float, fail_grace_s: float = 15.0,
             cwd: str | Path | None = None) -> LaunchResult:
    """Start every command (one per node), output to its log; wait for all up to `timeout_s`.
    A node that fails gives the others `fail_grace_s` to finish before they are ended; on a
    timeout or an exception (Ctrl-C) every job still running is ended."""
    procs: list[subprocess.Popen[Any]] = []
    handles = []
    result = LaunchResult(command=list(cmds[0]) if cmds else [])
    begin = time.monotonic()
    killed: set[int] = set()
    try:
        for cmd, env, path in zip(cmds, envs, log_paths, strict=True):
            fh = open(path, "wb")  # noqa: SIM115 - closed below
            handles.append(fh)
            procs.append(start(cmd, stdout=fh, env=env, cwd=cwd))
        deadline = begin + timeout_s
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            if now > deadline:
                result.timed_out = True
                break
            if any(p.returncode not in (None, 0) for p in procs):
                deadline = min(deadline, now + fail_grace_s)
            time.sleep(0.05)
    finally:
        for i, p in enumerate(procs):
            if p.poll() is None:
                killed.add(i)
                kill_group(p)
        for fh in handles:
            fh.close()
    result.elapsed_s = time.monotonic() - begin
    for i, (p, path) in enumerate(zip(procs, log_paths, strict=False)):
        text = Path(path).read_text(errors="replace")
        rc = None if i in killed else p.returncode
        result.nodes.append(NodeRun(node=i, returncode=rc, log_path=str(path), output=text))
    return result
