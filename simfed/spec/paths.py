"""Output paths, checked before any work starts (simfed's and realrun's command lines)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .schema import SpecError


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write `text` (UTF-8) to a temporary file beside `path`, then rename it over `path`: a
    crash never leaves a half-written file in place of a good one. Creates missing folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def check_output(path: str | Path | None, option: str, *, folder: bool = False) -> None:
    """`path` (a file, or a folder with `folder`) can be written: it is not the wrong kind of
    thing, and it exists writable or its nearest existing parent is a writable folder (tried
    by creating and removing a file there: `os.access` says yes to root everywhere). Raises a
    SpecError naming the option and the path."""
    if path is None:
        return
    p = Path(path)
    if str(path) == "":
        raise SpecError(f"{option}: an empty path")
    if p.exists():
        if folder and not p.is_dir():
            raise SpecError(f"{option} {path}: exists and is not a folder")
        if not folder and p.is_dir():
            raise SpecError(f"{option} {path}: is a folder, expected a file name")
        if not os.access(p, os.W_OK):
            raise SpecError(f"{option} {path}: not writable")
        probe = p if folder else p.absolute().parent
    else:
        probe = p.absolute().parent
        while not probe.exists():
            probe = probe.parent
        if not probe.is_dir():
            raise SpecError(f"{option} {path}: {probe} is not a folder")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        raise SpecError(f"{option} {path}: cannot write in {probe}: "
                        f"{exc.strerror or exc}") from None
