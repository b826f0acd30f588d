"""A one-host launch: `realrun run` validates the scenario, starts torchrun (standalone
rendezvous, which picks a free port) with `python -m realrun.train` per rank, shows rank 0's
progress, keeps torchrun's full output in DIR/torchrun.log, and turns a failure into one line
that names the rank.

Which rank failed: torchrun reports each worker's exit status. A rank killed by a signal other
than torchrun's own SIGTERM (sent to the survivors) is the culprit; otherwise the first worker
that printed a bad-input or internal error; otherwise the first that lost a peer.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from simfed.spec import load_scenario, read_trace

from .config import parse_overrides, parse_window, resolve_data_path, select_algorithms
from .errors import EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_PEER_LOST, RealrunError

_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")
_WORKER_ERROR = re.compile(r"^error: rank (\d+): (.*)$", re.MULTILINE)


@dataclass(frozen=True)
class RunRequest:
    scenario: str
    algorithm: str
    out: Path
    nproc: int | None = None
    overrides: tuple[str, ...] = ()
    device: str = "auto"
    timeout_s: float = 120.0
    profile_steps: str = ""
    dump_fedavg: bool = False
    kill_rank: int = -1
    kill_at_step: int = -1
    echo: bool = True


def validate(req: RunRequest) -> tuple[int, bool]:
    """Check what can be checked before starting processes; returns (nproc, debug detail)."""
    sc = load_scenario(req.scenario, parse_overrides(req.overrides))
    select_algorithms(sc, req.algorithm)
    if sc.data.source != "synthetic":
        if not sc.data.path:
            raise RealrunError(f"data.path: required for data.source {sc.data.source}")
        resolve_data_path(sc.data.path, Path(req.scenario))
    parse_window(req.profile_steps)
    world = sc.cluster.world
    nproc = world if req.nproc is None else req.nproc
    if nproc != world:
        raise RealrunError(
            f"--nproc {nproc}: the scenario's cluster {sc.cluster.name} has {sc.cluster.nodes} "
            f"nodes x {sc.cluster.node.gpus} = {world} ranks (one process per rank on this host;"
            " several hosts: launch torchrun -m realrun.train on each)"
        )
    if req.kill_rank >= world:
        raise RealrunError(f"--kill-rank {req.kill_rank}: ranks are 0..{world - 1}")
    if req.timeout_s <= 0:
        raise RealrunError(f"--timeout-s {req.timeout_s}: must be > 0")
    return nproc, sc.runtime.host.debug_checks == "detail"


def torchrun_command(req: RunRequest, nproc: int) -> list[str]:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
        f"--nproc-per-node={nproc}", "--max-restarts=0",
        "-m", "realrun.train", req.scenario, "--algorithm", req.algorithm, "--out", str(req.out),
        "--device", req.device, "--timeout-s", str(req.timeout_s),
    ]
    for item in req.overrides:
        cmd += ["--set", item]
    if req.profile_steps:
        cmd += ["--profile-steps", req.profile_steps]
    if req.dump_fedavg:
        cmd.append("--dump-fedavg")
    if req.kill_rank >= 0:
        cmd += ["--kill-rank", str(req.kill_rank), "--kill-at-step", str(req.kill_at_step)]
    return cmd


def run(req: RunRequest) -> int:
    """Launch, stream, diagnose. Returns the exit status; prints `error: ...` on failure."""
    nproc, detail = validate(req)
    req.out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    if detail:
        env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    start = time.monotonic()
    log_path = req.out / "torchrun.log"
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(torchrun_command(req, nproc), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env)
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                if req.echo and line.startswith("realrun: "):
                    print(line, end="", flush=True)
            rc = proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGTERM)  # torchrun stops its workers
            proc.wait()
            raise
    elapsed_s = time.monotonic() - start
    if rc == 0:
        if req.echo:
            print(f"realrun: done in {elapsed_s:.1f} s, outputs in {req.out}", flush=True)
        return 0
    text = log_path.read_text(encoding="utf-8", errors="replace")
    msg, code = diagnose(text, req.out)
    print(f"error: {msg} (after {elapsed_s:.1f} s; traces so far in {req.out}, "
          f"log in {log_path})", file=sys.stderr, flush=True)
    return code


def diagnose(log_text: str, out: Path) -> tuple[str, int]:
    """The failed rank and why, from torchrun's failure report and the workers' error lines."""
    exits = {int(r): int(c) for r, c in _FAILURE.findall(log_text)}
    worker_errors = [(int(r), m) for r, m in _WORKER_ERROR.findall(log_text)]
    killed = sorted(r for r, c in exits.items() if c < 0 and c != -signal.SIGTERM)
    if killed:
        r = killed[0]
        sig = _signal_name(-exits[r])
        done = completed_steps(out, r)
        after = f" after completing {done} step(s)" if done is not None else ""
        return f"rank {r} died ({sig}){after}; the other ranks were stopped", EXIT_PEER_LOST
    peer_lost = [(r, m) for r, m in worker_errors if exits.get(r) == EXIT_PEER_LOST]
    for r, m in worker_errors:
        if exits.get(r) in (EXIT_BAD_INPUT, EXIT_INTERNAL):
            return f"rank {r}: {m}", exits[r]
    if peer_lost:
        r, m = peer_lost[0]
        return f"rank {r}: {m}", EXIT_PEER_LOST
    if worker_errors:
        r, m = worker_errors[0]
        return f"rank {r}: {m}", EXIT_INTERNAL
    if exits:
        r, c = sorted(exits.items())[0]
        return f"rank {r} exited with status {c}", EXIT_INTERNAL
    return "torchrun failed before starting the workers", EXIT_INTERNAL


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def completed_steps(out: Path, rank: int) -> int | None:
    """Steps a rank's newest trace under `out` shows as complete (None: no trace)."""
    paths = sorted(out.rglob(f"trace_rank{rank}.jsonl"), key=lambda p: p.stat().st_mtime)
    if not paths:
        return None
    try:
        _, spans = read_trace(paths[-1])
    except Exception:
        return None
    return len({s.step for s in spans if s.cat == "step"})
