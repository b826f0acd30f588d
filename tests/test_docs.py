"""The docs run: every command block of README.md and docs/*.md, and every number the README
quotes is one a command prints.

The convention (README.md, "Docs that run"):
- a fenced block is `sh` (commands, run), `python` (run: a doc's python blocks share one
  namespace, in order, like a notebook), or one of TEXT_KINDS (output, data: not run); a block
  without a language is an error, so a command block cannot escape the test by omission;
- every `sh` line runs in a scratch copy of the repository's inputs (scenarios/, validation/,
  results/, figures/, tests/fixtures/), in the doc's order (a later command may read what an
  earlier one wrote), with `.venv/bin/` and the bare names `simfed` and `realrun` resolving to
  this interpreter's scripts, and must exit 0;
- a command whose comment ends in `[ci adds: ARGS]` runs with ARGS appended (a shorter run of a
  long command: fewer steps, --quick); one whose comment ends in `[ci skips: REASON]` is not run
  (it needs root, a GPU cluster, or is CI itself). A block whose first line is such a comment
  applies it to every line.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
INPUTS = ("scenarios", "validation", "results", "figures", "tests/fixtures", "benchmarks")
RUN_KINDS = ("sh", "python")
TEXT_KINDS = ("text", "yaml", "json", "csv", "console")
ADDS = re.compile(r"\[ci adds: ([^\]]+)\]\s*$")
SKIPS = re.compile(r"\[ci skips: ([^\]]+)\]\s*$")
FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
COMMAND_TIMEOUT_S = 240  # a longer command needs [ci adds: ...] or [ci skips: ...]
MAX_DOC_LINES = 400
MAX_README_LINES = 200


def blocks(doc: Path) -> list[tuple[int, str, str]]:
    """(line number, language, body) of every fenced block."""
    text = doc.read_text(encoding="utf-8")
    return [(text[:m.start()].count("\n") + 1, m.group(1), m.group(2))
            for m in FENCE.finditer(text)]


def commands(body: str) -> list[tuple[str, str | None]]:
    """A `sh` block's commands ((command, None) to run; (command, reason) to skip), continuation
    lines joined, the CI's additions appended."""
    lines, cur = [], ""
    for raw in body.splitlines():
        cur += raw.strip() if cur else raw.rstrip()
        if cur.endswith("\\"):
            cur = cur[:-1].rstrip() + " "
            continue
        if cur.strip():
            lines.append(cur.strip())
        cur = ""
    block_skip = None
    out: list[tuple[str, str | None]] = []
    for i, line in enumerate(lines):
        if line.startswith("#"):
            skip = SKIPS.search(line)
            if i == 0 and skip:
                block_skip = skip.group(1)
            continue
        skip, adds = SKIPS.search(line), ADDS.search(line)
        reason = block_skip or (skip.group(1) if skip else None)
        command = line.split(" # ")[0].split("  #")[0].rstrip()
        if adds and not reason:
            command = _append(command, adds.group(1))
        out.append((command, reason))
    return out


def _append(command: str, args: str) -> str:
    """ARGS after the command's own, before a redirection."""
    head, sep, tail = command.partition(" > ")
    return f"{head} {args.strip()}{sep}{tail}"


def _scratch(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    for d in INPUTS:
        if (ROOT / d).is_dir():
            shutil.copytree(ROOT / d, work / d)
    venv = work / ".venv"
    if sys.prefix != sys.base_prefix:  # this interpreter's virtual environment, as .venv
        venv.symlink_to(Path(sys.prefix), target_is_directory=True)
        return work
    bindir = Path(sys.executable).parent
    (venv / "bin").mkdir(parents=True)
    for name in ("simfed", "realrun", "python", "python3"):
        src = bindir / name if (bindir / name).exists() else Path(sys.executable)
        (venv / "bin" / name).symlink_to(src)
    return work


def _env(work: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{work / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}".rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["COLUMNS"] = "200"
    return env


def _shell(command: str, work: Path, env: dict[str, str]) -> tuple[int | None, str, str]:
    """Run one command line with bash; past COMMAND_TIMEOUT_S its whole process group is
    killed (torchrun's workers too) and the exit code is None."""
    import signal

    proc = subprocess.Popen(["bash", "-c", command], cwd=work, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out, err
    return proc.returncode, out, err


def run_doc(doc: Path, work: Path) -> list[str]:
    """Run the doc's blocks in order; the commands that ran and those skipped, for the log."""
    log = []
    namespace: dict = {"__name__": "__doc__"}
    env = _env(work)
    for line, lang, body in blocks(doc):
        where = f"{doc.relative_to(ROOT)}:{line}"
        if lang == "sh":
            for command, reason in commands(body):
                if reason:
                    log.append(f"skipped ({reason}): {command}")
                    continue
                code, out, err = _shell(command, work, env)
                assert code is not None, (
                    f"{where}: `{command}` ran past {COMMAND_TIMEOUT_S} s: mark it "
                    "[ci adds: ARGS] (a shorter run) or [ci skips: REASON]")
                assert code == 0, (f"{where}: `{command}` exited {code}:\n{out[-3000:]}\n"
                                   f"{err[-3000:]}")
                log.append(f"ran: {command}")
        elif lang == "python":
            first = body.lstrip().splitlines()[0] if body.strip() else ""
            skip = SKIPS.search(first)
            if skip:
                log.append(f"skipped python block at {where} ({skip.group(1)})")
                continue
            cwd = os.getcwd()
            os.chdir(work)
            try:
                exec(compile(body, where, "exec"), namespace)  # the doc's code, as written
            finally:
                os.chdir(cwd)
            log.append(f"ran python block at {where}")
        else:
            assert lang in TEXT_KINDS, (
                f"{where}: a fenced block needs a language: sh or python (run by this test) or "
                f"one of {', '.join(TEXT_KINDS)} (not run); got {lang or 'none'!r}")
    return log


# docs whose owners are converting them to the convention above: skipped, with why, until their
# entry is removed (each entry is a doc that does not run yet)
PENDING: dict[str, str] = {}  # doc name -> why its commands do not follow the convention yet


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_doc_commands_run(doc, tmp_path):
    if doc.name in PENDING:
        pytest.skip(f"pending conversion to the docs-run convention: {PENDING[doc.name]}")
    log = run_doc(doc, _scratch(tmp_path))
    print("\n".join(log))


def test_convention_reads_additions_and_skips():
    body = ("simfed run a.yaml   # the paper [ci adds: --set training.steps=2]\n"
            "sudo simfed validate b.yaml \\\n    --json x.json   # all of it [ci skips: root]\n"
            "simfed schema --json > s.json   # [ci adds: --resolved]\n")
    assert commands(body) == [
        ("simfed run a.yaml --set training.steps=2", None),
        ("sudo simfed validate b.yaml --json x.json", "root"),
        ("simfed schema --json --resolved > s.json", None)]
    assert commands("# [ci skips: a cluster]\nrealrun run x\nrealrun run y\n") == [
        ("realrun run x", "a cluster"), ("realrun run y", "a cluster")]


def test_docs_are_short():
    long = {d.name: n for d in DOCS
            if (n := len(d.read_text(encoding="utf-8").splitlines()))
            > (MAX_README_LINES if d.name == "README.md" else MAX_DOC_LINES)}
    assert not long, f"over {MAX_DOC_LINES} lines (README: {MAX_README_LINES}): {long}"


# ---------------------------------------------------------------------------------------------
# the README's numbers: each one a command prints

# per README section (its `## ` heading), the commands whose output its numbers come from
SOURCES = {
    "Headline: the paper's 512-GPU runs": [
        ["run", "scenarios/512gpu.yaml"],
        ["run", "scenarios/512gpu.yaml", "--set", "runtime.host.debug_checks=off"],
        ["run", "scenarios/512gpu.yaml", "--set", "cluster.fabric.loaded_step_us=56.25"],
        ["run", "scenarios/512gpu.yaml", "--robustness"],
    ],
    "How accurate": [
        ["validate", "--published"],
        ["validate", "--show", "results/validate-run24.json"],
        ["validate", "--show", "results/validate-run25.json"],
        ["validate", "--show", "results/validate-run26.json"],
        ["validate", "--show", "results/validate.json"],
    ],
}
# numbers a section quotes that no command prints: a source's own (the paper), or a count of
# inputs; each with why
CITED = {
    "Headline: the paper's 512-GPU runs": {
        "8.04": "the paper's claim, quoted", "1.4": "the paper's step time, quoted",
        "11": "the paper's FSDP step time, quoted", "512": "the scenario's GPU count",
        "64": "the scenario's steps", "4": "a node's GPUs", "98": "FSDP's collectives per "
        "step, docs/paper-analysis.md"},
    "How accurate": {"1": "set numbers", "2": "set numbers", "3": "set numbers",
                     "4": "set numbers", "15": "the speedup target, 15%",
                     "1e-6": "a test's tolerance (tests/realrun)"},
}
# a number, with thousands separators or a decimal point; a unit or `x`/`%` may follow it, but
# not a letter or digit before it (HDR100, Llama3, p10 are names)
NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?(?:e-?\d+)?)(?!\d|\.\d|,\d{3})")


def _sections(text: str) -> dict[str, str]:
    out, name, buf = {}, None, []
    for line in text.splitlines():
        if line.startswith("## "):
            if name:
                out[name] = "\n".join(buf)
            name, buf = line[3:].strip(), []
        elif name:
            buf.append(line)
    if name:
        out[name] = "\n".join(buf)
    return out


def _prose(section: str) -> str:
    """The section without fenced blocks, links' targets and inline code (commands, paths)."""
    text = FENCE.sub("", section)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"`[^`]*`", "", text)
    return text


def _numbers(text: str) -> set[str]:
    return {m.group(1) for m in NUMBER.finditer(text)}


def _printed(argv: list[str]) -> str:
    from click.testing import CliRunner

    from simfed.cli import main

    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        res = CliRunner().invoke(main, argv, env={"COLUMNS": "200"})
    finally:
        os.chdir(cwd)
    assert res.exit_code == 0, f"simfed {' '.join(argv)}: {res.output[-2000:]}"
    return res.output


@pytest.mark.parametrize("section", sorted(SOURCES))
def test_readme_numbers_are_printed_by_a_command(section):
    sections = _sections((ROOT / "README.md").read_text(encoding="utf-8"))
    assert section in sections, f"README has no section '## {section}'"
    quoted = _numbers(_prose(sections[section]))
    printed = set()
    for argv in SOURCES[section]:
        printed |= _numbers(_printed(argv))
    missing = sorted(quoted - printed - set(CITED.get(section, {})),
                     key=lambda s: (len(s), s))
    assert not missing, (f"README '## {section}' quotes numbers that its commands "
                         f"({'; '.join(' '.join(a) for a in SOURCES[section])}) do not print: "
                         f"{missing}")
