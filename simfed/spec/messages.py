"""Error messages of one line with no value longer than `MAX_SHOWN` characters.

`shown(value)` is a value as an error message prints it (its repr, cut); `one_line(message)`
is what the command lines print for any refusal: line breaks made visible, and every quoted
value or unbroken run of characters longer than `MAX_SHOWN` cut, with its full length said (a
10,000-character label is named, not printed)."""

from __future__ import annotations

import re
from typing import Any

MAX_SHOWN = 200  # characters of one value in a message
MAX_LINE = 2000  # characters of a whole message

# a quoted Python repr ('...' or "..."), or a run of characters without a space
_LONG = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|\S+")


def cut(text: str, limit: int = MAX_SHOWN) -> str:
    """`text`, or its first `limit` characters and how long it is."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...({len(text):,} characters)"


def shown(value: Any, limit: int = MAX_SHOWN) -> str:
    """A value as a message prints it: its repr, cut to `limit` characters."""
    try:
        text = repr(value)
    except Exception:  # a repr that fails (a hostile object): its type
        text = f"<{type(value).__name__}>"
    return cut(text, limit)


def one_line(message: str, limit: int = MAX_SHOWN) -> str:
    """A message as one line: line breaks shown as \\n, long values cut (see the module)."""
    text = message.replace("\r", "\\r").replace("\n", "\\n")
    if len(text) > limit:
        text = _LONG.sub(lambda m: cut(m.group(0), limit), text)
    return cut(text, MAX_LINE)


def internal_error_line(program: str, exc: BaseException, argv: list[str]) -> str:
    """The one line a command prints for a fault of its own (a bug, not the input): the
    exception's type and first line, and the log file (in the temporary folder) that holds the
    command line and the traceback."""
    import tempfile
    import time
    import traceback

    text = "".join(traceback.format_exception(exc))
    first = cut((str(exc).splitlines() or [""])[0])
    try:
        fd, log = tempfile.mkstemp(prefix=time.strftime(f"{program}-crash-%Y%m%d-%H%M%S-"),
                                   suffix=".log")
        with open(fd, "w", encoding="utf-8") as f:
            f.write(f"{program} {' '.join(argv)}\n{text}")
        where = f"traceback in {log}"
    except OSError:
        where = "no log file could be written"
    return (f"internal error (a bug in {program}, not in the input): {type(exc).__name__}: "
            f"{first} ({where})")


INTERNAL_ERROR = 3  # the exit status of a fault of the program itself


def ending(program: str, exc: BaseException, argv: list[str]) -> tuple[str, int]:
    """The error contract for a command that ended with `exc`: the line it prints on stderr and
    its exit status. Bad input (a SpecError) or a file that cannot be read or written (an
    OSError) is one line and status 2; anything else is a fault of the program: the
    internal_error_line and status 3."""
    from .schema import SpecError

    if isinstance(exc, SpecError):
        return f"error: {one_line(str(exc))}", 2  # long values cut
    if isinstance(exc, OSError):  # the file system: a full disk, a path that went away
        name = f" {exc.filename}" if exc.filename else ""
        return one_line(f"error: cannot access{name}: {exc.strerror or exc}"), 2
    return internal_error_line(program, exc, argv), INTERNAL_ERROR
