"""Failures a run reports as one line (`error: ...`) and the exit status of each kind."""

from __future__ import annotations

EXIT_OK = 0
EXIT_BAD_INPUT = 2  # the scenario, the options or the environment are wrong
EXIT_PEER_LOST = 3  # a collective failed or timed out: another rank died or hangs
EXIT_INTERNAL = 4  # a bug: the traceback is in DIR/error_rank{r}.txt


class RealrunError(Exception):
    """Bad input or environment: the message is the whole story, no traceback."""


class CollectiveError(RealrunError):
    """A collective failed or timed out, most likely because a peer rank died."""
