"""Running fuzz cases against the `simfed` command line and classifying what happened.

Each case runs in a worker process (a pool of them; a worker that dies is replaced), through
click's test runner with the real command group, inside its own temporary folder, under a
per-case alarm (a hang raises `Hang`, a BaseException that the CLI's error handling cannot
swallow) and an address-space limit (a memory blow-up becomes a MemoryError, not a dead host).

Outcomes:
  ok               exit 0, strict JSON written, nothing outside the named outputs
  refused          exit 2 and one error line
  accepted_invalid exit 0 on a case the contract says is invalid (silent acceptance)
  refused_valid    exit 2 on a case the contract says is valid (over-strict)
  multiline_error  exit 2 but not exactly one error line
  traceback        a Python traceback reached the output, or an exception escaped the CLI
  internal_error   exit 3: simfed's own "internal error (... traceback in LOG)" line
  hang             over the time limit
  crash            the worker process died (killed for memory, a segfault)
  invalid_json     exit 0 but a JSON file written is not strict JSON (NaN, Infinity, bad)
  stray_file       a file written outside the case folder's named outputs
  replaced         a device, FIFO, socket or symbolic link the case made is no longer what it
                   was (an output path replaced what it names)
  other_exit       any other exit status

realrun's cases are held to the same contract; its internal-error status is 4 (3 is a rank that
lost its peers). `report` is `python -m simfed.convergence.report` (an argparse program, run
through a thin click wrapper), held to simfed's contract.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from .cases import EITHER, INVALID, OUTSIDE, SCENARIOS, VALID, Case

BAD = ("accepted_invalid", "multiline_error", "traceback", "internal_error", "hang", "crash",
       "invalid_json", "stray_file", "replaced", "other_exit")
INTERNAL = {"simfed": 3, "realrun": 4, "report": 3}  # each program's internal-error exit status
TIME_LIMIT_S = 10
MEMORY_LIMIT_BYTES = 3 * 2**30


SPECIAL_KIND = {"sparse": "file"}  # a special the runner makes -> what _kind_of calls it


class Hang(BaseException):
    """Raised by the alarm: not an Exception, so no `except Exception` can hide it."""


@dataclass
class Result:
    id: int
    kind: str
    what: str
    expect: str
    outcome: str
    exit_code: int | None
    seconds: float
    detail: str


def _on_alarm(signum, frame):
    raise Hang()


def address_space() -> int:
    """This process's mapped address space in bytes (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _init_worker(realrun: bool = False) -> None:
    """Limits and the alarm; the command lines imported here, outside any case's time limit
    (an import cut short by the alarm would leave a module half-initialised for every later
    case of the worker: torch's takes seconds on a loaded host)."""
    import resource

    os.environ["OMP_NUM_THREADS"] = "1"
    import io
    import warnings

    import scipy.optimize  # noqa: F401 - calibrate's fits

    import simfed.calibration.published
    import simfed.calibration.validate
    import simfed.cli
    import simfed.engine
    import simfed.figures  # noqa: F401
    from simfed.plots.common import new_figure

    with warnings.catch_warnings():  # matplotlib's font cache and first draw
        warnings.simplefilter("ignore")
        fig = new_figure()
        fig.subplots().plot([1, 2], [1, 2], label="x")
        fig.savefig(io.BytesIO(), format="png")
    if realrun:  # torch imports more on first use (torch._dynamo in a first backward): warm up
        from click.testing import CliRunner

        import realrun.cli

        CliRunner().invoke(realrun.cli.main, [
            "converge", str(SCENARIOS / "cpu4.yaml"), "-a", "fl_fsdp", "--set",
            "training.steps=1", "--set", "training.eval_sequences=4"])
    try:
        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        # a case may grow the worker by MEMORY_LIMIT_BYTES beyond what the imports took (torch
        # alone maps gigabytes of address space)
        want = address_space() + MEMORY_LIMIT_BYTES
        limit = want if hard == resource.RLIM_INFINITY else min(hard, want)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ValueError, OSError):
        pass
    signal.signal(signal.SIGALRM, _on_alarm)


def _strict_json(path: Path) -> str | None:
    """None when `path` is strict JSON, else why not."""
    def bad_constant(name: str):
        raise ValueError(f"non-JSON constant {name}")

    try:
        json.loads(path.read_text(encoding="utf-8"), parse_constant=bad_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        return f"{path.name}: {exc}"[:200]
    return None


def _classify(case: Case, code: int | None, output: str, escaped: BaseException | None,
              folder: Path, before: set[Path]) -> tuple[str, str]:
    if escaped is not None and not isinstance(escaped, SystemExit):
        return "traceback", f"{type(escaped).__name__}: {escaped}"[:300]
    if "Traceback (most recent call last)" in output:
        return "traceback", output[-300:]
    if code == INTERNAL[case.prog]:
        return "internal_error", output.strip().splitlines()[-1][:300] if output.strip() else ""
    for rel, kind in case.specials.items():
        if _kind_of(folder / rel) != SPECIAL_KIND.get(kind.split(":")[0], kind.split(":")[0]):
            return "replaced", f"{rel} ({kind}) is now {_kind_of(folder / rel)}"
    after = {p for p in folder.rglob("*") if p.is_file()}
    named = [folder / o for o in case.outputs]
    for p in sorted(after - before):
        if not any(p == n or n in p.parents for n in named) and p.name != "simfed-fuzz.log":
            return "stray_file", str(p.relative_to(folder))
    if code == 0:
        for p in sorted(after - before):
            if p.suffix == ".json" or p.name.endswith(".jsonl"):
                lines = ([p] if p.suffix == ".json" else [])
                for q in lines:
                    why = _strict_json(q)
                    if why:
                        return "invalid_json", why
                if p.name.endswith(".jsonl"):
                    for i, line in enumerate(p.read_text(encoding="utf-8").splitlines()):
                        try:
                            json.loads(line, parse_constant=lambda c: (_ for _ in ()).throw(
                                ValueError(c)))
                        except ValueError as exc:
                            return "invalid_json", f"{p.name} line {i + 1}: {exc}"[:200]
        if case.expect == INVALID:
            return "accepted_invalid", output.strip()[-200:]
        return "ok", ""
    if code == 2:
        errors = [ln for ln in output.splitlines() if ln.startswith(("error:", "Error:"))]
        if len(errors) != 1:
            return "multiline_error", output[-300:]
        if case.expect == VALID:
            return "refused_valid", errors[0][:300]
        return "refused", errors[0][:300]
    return "other_exit", f"exit {code}: {output[-200:]}"


def _kind_of(path: Path) -> str:
    """chr, blk, fifo, sock, link, loop, file, dir or missing."""
    import stat

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "missing"
    m = st.st_mode
    if stat.S_ISLNK(m):
        return "loop" if os.readlink(path) == path.name else "link"
    for test, name in ((stat.S_ISCHR, "chr"), (stat.S_ISBLK, "blk"), (stat.S_ISFIFO, "fifo"),
                       (stat.S_ISSOCK, "sock"), (stat.S_ISDIR, "dir")):
        if test(m):
            return name
    return "file"


def _make_special(path: Path, kind: str) -> None:
    import socket
    import stat

    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "chr":  # /dev/null's numbers
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    elif kind == "blk":  # a loop device's numbers (never opened: refused before)
        os.mknod(path, 0o600 | stat.S_IFBLK, os.makedev(7, 200))
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "sock":
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(path))
    elif kind == "loop":
        path.symlink_to(path.name)
    elif kind.startswith("link:"):
        path.symlink_to(kind.split(":", 1)[1])
    elif kind.startswith("sparse:"):  # a regular file of that many bytes, none on disk
        with open(path, "wb") as f:
            f.truncate(int(kind.split(":", 1)[1]))
    else:
        raise ValueError(kind)


def _main(prog: str):
    if prog == "report":
        return _report_main()
    if prog == "realrun":
        from realrun.cli import main as realrun_main

        return realrun_main
    from simfed.cli import main

    return main


@functools.cache
def _report_main():
    """`python -m simfed.convergence.report ARGS` as a click command (its exit status and
    output as the program's own; an exception that escapes it is a traceback)."""
    import click

    from simfed.convergence.report import main

    @click.command(context_settings={"ignore_unknown_options": True,
                                     "help_option_names": []})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def report(args: tuple[str, ...]) -> None:
        main(list(args))

    return report


def run_case(case: Case, time_limit_s: float = TIME_LIMIT_S) -> Result:
    """Run one case in this process (a worker: `_init_worker` has set the alarm handler)."""
    from click.testing import CliRunner

    main = _main(case.prog)
    with tempfile.TemporaryDirectory(prefix="simfed-fuzz-") as tmp:
        folder = Path(tmp)
        for rel, content in case.files.items():
            p = folder / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(content)
        for rel, kind in case.specials.items():
            _make_special(folder / rel, kind)
        before = {p for p in folder.rglob("*") if p.is_file()}
        argv = [a.replace("{dir}", tmp) for a in case.argv]
        env = {"TMPDIR": tmp}  # where an internal error's log goes
        code: int | None = None
        output = ""
        escaped: BaseException | None = None
        t0 = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, time_limit_s)
        try:
            old = tempfile.tempdir
            tempfile.tempdir = tmp
            try:
                res = CliRunner().invoke(main, argv, env=env, catch_exceptions=True)
            finally:
                tempfile.tempdir = old
            code, output = res.exit_code, res.output
            escaped = res.exception if not isinstance(res.exception, SystemExit) else None
            if isinstance(escaped, Hang):
                raise escaped
        except Hang:
            signal.setitimer(signal.ITIMER_REAL, 0)
            return Result(case.id, case.kind, case.what, case.expect, "hang", None,
                          time.perf_counter() - t0, f"over {time_limit_s} s")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        seconds = time.perf_counter() - t0
        outcome, detail = _classify(case, code, output, escaped, folder, before)
        for p in Path("/tmp").glob(f"{OUTSIDE}*"):  # a label that is an absolute path
            p.unlink()
            if outcome in ("ok", "refused", "refused_valid"):
                outcome, detail = "stray_file", str(p)
        return Result(case.id, case.kind, case.what, case.expect, outcome, code, seconds,
                      detail)


def _run_batch(cases: list[Case], time_limit_s: float = TIME_LIMIT_S) -> list[Result]:
    return [run_case(c, time_limit_s) for c in cases]


def run_cases(cases: list[Case], jobs: int = 1, progress=None, chunk: int = 8,
              time_limit_s: float = TIME_LIMIT_S) -> list[Result]:
    """Run every case on `jobs` worker processes, `chunk` cases per task. A worker that dies
    breaks the pool: the unfinished cases then run one per fresh worker, so the one that kills
    its worker is found (a `crash`)."""
    results: dict[int, Result] = {}

    def done(r: Result) -> None:
        results[r.id] = r
        if progress:
            progress(r)

    batches = [cases[i:i + chunk] for i in range(0, len(cases), chunk)]
    init = (_init_worker, (any(c.prog == "realrun" for c in cases),))
    try:
        with ProcessPoolExecutor(max_workers=jobs, initializer=init[0], initargs=init[1]) as pool:
            for fut in [pool.submit(_run_batch, b, time_limit_s) for b in batches]:
                try:
                    for r in fut.result():
                        done(r)
                except BrokenProcessPool:
                    pass
    except BrokenProcessPool:
        pass
    for c in cases:
        if c.id in results:
            continue
        try:
            with ProcessPoolExecutor(max_workers=1, initializer=init[0],
                                     initargs=init[1]) as pool:
                done(pool.submit(run_case, c, time_limit_s).result())
        except BrokenProcessPool:
            done(Result(c.id, c.kind, c.what, c.expect, "crash", None, 0.0,
                        "worker process died"))
    return [results[c.id] for c in cases]


def summarise(results: list[Result]) -> dict[str, object]:
    from collections import Counter

    by_outcome = Counter(r.outcome for r in results)
    by_kind: dict[str, Counter] = {}
    for r in results:
        by_kind.setdefault(r.kind, Counter())[r.outcome] += 1
    slowest = max(results, key=lambda r: r.seconds) if results else None
    return {
        "cases": len(results),
        "outcomes": dict(sorted(by_outcome.items())),
        "by_kind": {k: dict(sorted(v.items())) for k, v in sorted(by_kind.items())},
        "bad": sum(by_outcome[b] for b in BAD),
        "expect": dict(Counter(r.expect for r in results)),
        "slowest_s": round(slowest.seconds, 2) if slowest else 0.0,
        "slowest": slowest.what if slowest else "",
    }


__all__ = ["BAD", "EITHER", "INVALID", "VALID", "Result", "run_case", "run_cases", "summarise"]
