"""A testbed is removed whatever happens: clean-ups run with Ctrl-C / SIGTERM / SIGHUP held,
SIGTERM and SIGHUP become SystemExit while a `with Testbed` block runs, and the testbeds still
up at interpreter exit are removed."""

from __future__ import annotations

import atexit
import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_ACTIVE: dict[int, Callable[[], Any]] = {}  # id -> its `down`
_ATEXIT_REGISTERED = False


@contextlib.contextmanager
def signals_blocked() -> Iterator[None]:
    """Hold Ctrl-C / SIGTERM / SIGHUP while a clean-up runs, so it always finishes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _down_all() -> None:
    for down in list(_ACTIVE.values()):
        with contextlib.suppress(Exception):
            down()


def _raise_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def hold(key: int, down: Callable[[], Any]) -> dict[int, Any]:
    """Register `down` to run at exit; SIGTERM/SIGHUP raise SystemExit (in the main thread).
    Returns the handlers to give back to `release`."""
    global _ATEXIT_REGISTERED
    if not _ATEXIT_REGISTERED:
        atexit.register(_down_all)
        _ATEXIT_REGISTERED = True
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.getsignal(sig)
            signal.signal(sig, _raise_on_signal)
    _ACTIVE[key] = down
    return previous


def forget(key: int) -> None:
    """No longer remove this testbed at exit (it is down)."""
    _ACTIVE.pop(key, None)


def restore(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    previous.clear()
