"""A one-host launch: `realrun run` validates the scenario, starts torchrun (standalone
rendezvous, which picks a free port) with `python -m realrun.train` per rank, shows rank 0's
progress, keeps torchrun's full output in DIR/torchrun.log, and turns a failure into one line
that names the rank.

Which rank failed: torchrun reports each worker's exit status. A rank killed by a signal other
than torchrun's own SIGTERM (sent to the survivors) is the culprit; otherwise the first worker
that printed a bad-input or internal error; otherwise the first that lost a peer.

A hung rank (alive but silent) makes its peers' collectives time out; torchrun would then wait
30 s more before killing it. So once a worker reports a failed collective and torchrun has not
finished `REAP_GRACE_S` later, the workers still alive are SIGKILLed (their pids are in their
trace headers) and the hung rank is named as the one the others waited for.
"""

from __future__ import annotations

import json
import math
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from simfed.spec import load_scenario, read_trace
from simfed.spec.overrides import parse_sets

from .config import check_runnable, parse_window, resolve_data_path, select_algorithms
from .errors import EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_PEER_LOST, RealrunError
from .torchrun import start as start_job
from .torchrun import torchrun_argv

_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")
_WORKER_ERROR = re.compile(r"^error: rank (\d+): (.*)$", re.MULTILINE)
_PEER_LOST = re.compile(r"^error: rank (\d+): step (-?\d+) \((\w+)\): (\w+) over the (\w+) "
                        r"group \(ranks ([\d,]+)\) failed after ([\d.]+) s", re.MULTILINE)
REAP_GRACE_S = 3.0


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
    kill_signal: str = "KILL"
    kill_in: str = "step"
    echo: bool = True


def validate(req: RunRequest) -> tuple[int, bool]:
    """Check what can be checked before starting processes; returns (nproc, debug detail)."""
    sc = load_scenario(req.scenario, parse_sets(req.overrides))
    select_algorithms(sc, req.algorithm)
    check_runnable(sc)
    if sc.data.source != "synthetic":
        if not sc.data.path:
            raise RealrunError(f"data.path: required for data.source {sc.data.source}")
        resolve_data_path(sc.data.path, Path(req.scenario))
    window = parse_window(req.profile_steps)
    steps = sc.training.steps
    if window is not None and window[1] > steps:  # before: accepted, fewer steps profiled
        raise RealrunError(f"--profile-steps {req.profile_steps}: the run has {steps} steps "
                           f"(0..{steps - 1})")
    world = sc.cluster.world
    nproc = world if req.nproc is None else req.nproc
    if nproc != world:
        raise RealrunError(
            f"--nproc {nproc}: the scenario's cluster {sc.cluster.name} has {sc.cluster.nodes} "
            f"nodes x {sc.cluster.node.gpus} = {world} ranks (one process per rank on this host;"
            " several hosts: launch torchrun -m realrun.train on each)"
        )
    if req.kill_rank >= world or req.kill_rank < -1:  # (-1: no fault injected)
        raise RealrunError(f"--kill-rank {req.kill_rank}: ranks are 0..{world - 1}")
    # before: a fault asked for but never injected (no rank, or a step the run never reaches)
    if req.kill_at_step >= 0 and req.kill_rank < 0:
        raise RealrunError(f"--kill-at-step {req.kill_at_step}: give --kill-rank too")
    if req.kill_rank >= 0 and req.kill_at_step >= steps:
        raise RealrunError(f"--kill-at-step {req.kill_at_step}: the run has {steps} steps "
                           f"(0..{steps - 1})")
    if not math.isfinite(req.timeout_s) or req.timeout_s <= 0:  # nan: a rank's int(nan)
        raise RealrunError(f"--timeout-s {req.timeout_s}: must be a finite number > 0")
    return nproc, sc.runtime.host.debug_checks == "detail"


def torchrun_command(req: RunRequest, nproc: int) -> list[str]:
    """torchrun (realrun.torchrun, standalone on this host) with realrun.train's arguments."""
    cmd = [req.scenario, "--algorithm", req.algorithm, "--out", str(req.out),
           "--device", req.device, "--timeout-s", str(req.timeout_s)]
    for item in req.overrides:
        cmd += ["--set", item]
    if req.profile_steps:
        cmd += ["--profile-steps", req.profile_steps]
    if req.dump_fedavg:
        cmd.append("--dump-fedavg")
    if req.kill_rank >= 0:
        cmd += ["--kill-rank", str(req.kill_rank), "--kill-at-step", str(req.kill_at_step),
                "--kill-signal", req.kill_signal, "--kill-in", req.kill_in]
    return torchrun_argv("realrun.train", cmd, nproc_per_node=nproc)


def run(req: RunRequest) -> int:
    """Launch, stream, diagnose. Returns the exit status; prints `error: ...` on failure."""
    nproc, detail = validate(req)
    req.out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    if detail:
        env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    start, start_wall_s = time.monotonic(), time.time()
    log_path = req.out / "torchrun.log"
    reaped: set[int] = set()
    with open(log_path, "w", encoding="utf-8") as log:
        proc = start_job(torchrun_command(req, nproc), stdout=subprocess.PIPE, env=env,
                         text=True)
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=_pump, args=(proc, lines), daemon=True).start()
        peer_lost_at: float | None = None
        try:
            while (line := _next_line(lines)) is not None:
                log.write(line)
                log.flush()
                if req.echo and line.startswith("realrun: "):
                    print(line, end="", flush=True)
                if peer_lost_at is None and _PEER_LOST.match(line):
                    peer_lost_at = time.monotonic()
                if (peer_lost_at is not None and not reaped and proc.poll() is None
                        and time.monotonic() - peer_lost_at > REAP_GRACE_S):
                    reaped = reap_workers(req.out, proc.pid, start_wall_s) or {-1}
            rc = proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGTERM)  # torchrun stops its workers
            proc.wait()
            raise
    reaped.discard(-1)
    elapsed_s = time.monotonic() - start
    if rc == 0:
        if req.echo:
            print(f"realrun: done in {elapsed_s:.1f} s, outputs in {req.out}", flush=True)
        return 0
    text = log_path.read_text(encoding="utf-8", errors="replace")
    msg, code = diagnose(text, req.out, frozenset(reaped))
    print(f"error: {msg} (after {elapsed_s:.1f} s; traces so far in {req.out}, "
          f"log in {log_path})", file=sys.stderr, flush=True)
    return code


def _pump(proc: subprocess.Popen, lines: queue.Queue) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.put(line)
    lines.put(None)


def _next_line(lines: queue.Queue) -> str | None:
    """The next output line, "" after half a second of silence, None at the end."""
    try:
        return lines.get(timeout=0.5)
    except queue.Empty:
        return ""


def _parent_pid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def reap_workers(out: Path, torchrun_pid: int, since_s: float) -> set[int]:
    """SIGKILL the workers of this launch that are still alive; returns their ranks. A worker
    is known by the rank and pid in the header of a trace it wrote during this launch."""
    reaped: set[int] = set()
    for path in out.rglob("trace_rank*.jsonl"):
        try:
            if path.stat().st_mtime < since_s:
                continue
            with open(path, encoding="utf-8") as fh:
                meta = json.loads(fh.readline())["meta"]
            pid, rank = int(meta["pid"]), int(meta["rank"])
        except (OSError, ValueError, KeyError):
            continue
        if _parent_pid(pid) == torchrun_pid:
            try:
                os.kill(pid, signal.SIGKILL)
                reaped.add(rank)
            except ProcessLookupError:
                pass
    return reaped


def diagnose(log_text: str, out: Path, reaped: frozenset[int] = frozenset()
             ) -> tuple[str, int]:
    """The failed rank and why, from torchrun's failure report, the workers' error lines and
    the ranks this launcher had to kill because they hung."""
    exits = {int(r): int(c) for r, c in _FAILURE.findall(log_text)}
    worker_errors = [(int(r), m) for r, m in _WORKER_ERROR.findall(log_text)]
    if reaped:
        # the hung rank: a member of a failed collective that did not report the failure
        waits = _PEER_LOST.findall(log_text)
        waiters = sorted({int(w[0]) for w in waits})
        members = {int(r) for w in waits for r in w[5].split(",")}
        hung = sorted(reaped & members - set(waiters))
        if hung and waits:
            first, step, phase, op, kind, _, after_s = waits[0]
            return (f"rank {', '.join(map(str, hung))} stopped responding: rank {first} gave up "
                    f"after {after_s} s in {op} over the {kind} group (step {step}, {phase}); "
                    "the hung rank was killed", EXIT_PEER_LOST)
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
