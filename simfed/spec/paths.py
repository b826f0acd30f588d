"""Output paths: checked before any work starts, and written without ever replacing what a path
points at (simfed's and realrun's command lines).

What a file output does, by what its path names (`write_bytes` / `write_text_atomic`; the
same for every command that writes a file):

- nothing yet, or a regular file: the data go to a temporary file beside it, which is then
  renamed over it (atomic: a crash or a full disk never leaves a half-written file in place of
  a good one; a failed write removes the temporary file). Missing folders are created.
- a symbolic link: followed. Its final target is treated as if it had been named (a regular
  file there is replaced atomically, the link itself stays a link; a device or FIFO there is
  written in place, as below). `--json /dev/stdout` prints the JSON (and appends it to the
  file stdout is redirected to: a link into /proc is written in place, never replaced).
- a character device (`/dev/null`, a terminal) or a FIFO: written in place (opened and written,
  never renamed over or removed). A FIFO with no reader is refused (it would block forever).
- a folder, a block device (a disk: writing it in place would destroy a file system) or a
  socket: refused before any work, one line naming the option and the path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path

from .schema import SpecError

# what an existing output path names
NEW, FILE, IN_PLACE = "new", "file", "in place"


def _through_proc(path: Path) -> bool:
    """Whether a chain of symbolic links passes through /proc or /dev/fd (a process's open
    file: /dev/stdout -> /proc/self/fd/1 -> the file the shell opened)."""
    p = str(path)
    for _ in range(40):
        if os.path.abspath(p).startswith(("/proc/", "/dev/fd/")):
            return True
        try:
            nxt = os.readlink(p)
        except OSError:
            return False
        p = os.path.join(os.path.dirname(p), nxt)
    return False


def _kind(path: Path, option: str) -> tuple[str, Path]:
    """(NEW | FILE | IN_PLACE, the path to write): a symbolic link is followed to its final
    target; a folder, block device or socket is a SpecError."""
    name = f"{option} {path}" if option else str(path)
    if "\x00" in str(path):
        raise SpecError(f"{option or 'output'}: a path with a NUL character")
    try:
        lst = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # (a file on the way: said when written)
        return NEW, path
    except OSError as exc:
        raise SpecError(f"{name}: cannot inspect it: {exc.strerror or exc}") from None
    target = path
    st = lst
    if stat.S_ISLNK(lst.st_mode):
        try:
            st = os.stat(path)  # follows every link
        except FileNotFoundError:  # a dangling link: its target is created
            return NEW, Path(os.path.realpath(path))
        except OSError as exc:  # a loop of links, a target folder we cannot enter
            raise SpecError(f"{name}: a symbolic link that cannot be followed: "
                            f"{exc.strerror or exc}") from None
        if stat.S_ISREG(st.st_mode):
            if _through_proc(path):  # /dev/stdout redirected to a file: append to it
                return IN_PLACE, path
            target = Path(os.path.realpath(path))
    mode = st.st_mode
    if stat.S_ISREG(mode):
        return FILE, target
    if stat.S_ISDIR(mode):
        raise SpecError(f"{name}: is a folder, expected a file name")
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return IN_PLACE, path  # opened through the link: /dev/stdout -> /proc/self/fd/1
    what = "a block device (a disk)" if stat.S_ISBLK(mode) else "a socket"
    raise SpecError(f"{name}: is {what}; only a file, a character device or a FIFO can be "
                    "written")


def _write_in_place(path: Path, data: bytes) -> None:
    """Write to a character device or FIFO as it is (no rename, no truncation of anything;
    a file behind /dev/stdout is appended to)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK
                     | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads: writing would block forever
            raise SpecError(f"{path}: a FIFO with no reader; start the reader first") from None
        raise
    try:
        os.set_blocking(fd, True)  # a reader is there: wait for it as a pipe does
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def write_bytes(path: str | Path, data: bytes) -> Path:
    """Write `data` to the output `path` by the rules of the module's docstring: atomically
    (a temporary file beside it, renamed over it) for a new path or a regular file, in place
    for a character device or FIFO, through a symbolic link to what it names. Returns the path.
    A failed write leaves no temporary file behind and the old file, if any, as it was."""
    path = Path(path)
    kind, target = _kind(path, "")
    if kind == IN_PLACE:
        try:
            _write_in_place(target, data)
        except OSError as exc:  # a reader that went away (EPIPE), a full device
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None
        return path
    target.parent.mkdir(parents=True, exist_ok=True)
    mode = None
    if kind == FILE:
        with contextlib.suppress(OSError):
            mode = stat.S_IMODE(os.stat(target).st_mode)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        try:
            if mode is None:  # a new file: the usual permissions (mkstemp's are 0600)
                umask = os.umask(0)
                os.umask(umask)
                mode = 0o666 & ~umask
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and not exc.filename:  # a full disk: name the file
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None
        raise
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write `text` (UTF-8) to the output `path` (see `write_bytes`): a crash never leaves a
    half-written file in place of a good one, and a device, FIFO or symbolic link is never
    replaced by a regular file. Creates missing folders."""
    return write_bytes(path, text.encode("utf-8"))


def check_output(path: str | Path | None, option: str, *, folder: bool = False) -> None:
    """`path` (a file, or a folder with `folder`) can be written: it is not the wrong kind of
    thing (a folder for a file, a block device or socket: see the module's docstring), and it
    exists writable or its nearest existing parent is a writable folder (tried by creating and
    removing a file there: `os.access` says yes to root everywhere). Raises a SpecError naming
    the option and the path."""
    if path is None:
        return
    p = Path(path)
    if str(path) == "":
        raise SpecError(f"{option}: an empty path")
    if "\x00" in str(path):
        raise SpecError(f"{option}: a path with a NUL character")
    if folder:
        if p.exists() and not p.is_dir():
            raise SpecError(f"{option} {path}: exists and is not a folder")
        if p.is_symlink() and not p.exists():
            raise SpecError(f"{option} {path}: a symbolic link to nothing, expected a folder")
    else:
        kind, target = _kind(p, option)
        if kind == IN_PLACE:
            if not os.access(target, os.W_OK):
                raise SpecError(f"{option} {path}: not writable")
            return
        p = target
    if p.exists():
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
