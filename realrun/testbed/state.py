"""The state file of a testbed (STATE_DIR/<prefix>.json): its spec, when and by which process
it was built, and whether that process holds it (a `with Testbed`) or left it up for later
commands (`realrun testbed up`)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from .netns import is_alive
from .spec import PREFIX_RE, TestbedSpec

STATE_DIR = Path(os.environ.get("SIMFED_TESTBED_STATE_DIR", "/run/simfed-testbed"))


def state_path(prefix: str) -> Path:
    return STATE_DIR / f"{prefix}.json"


def state_prefixes() -> set[str]:
    """Prefixes that have a state file."""
    if not STATE_DIR.is_dir():
        return set()
    return {p.stem for p in STATE_DIR.glob("*.json") if PREFIX_RE.fullmatch(p.stem)}


def read_state(prefix: str) -> dict[str, Any] | None:
    try:
        state = json.loads(state_path(prefix).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def write_state(spec: TestbedSpec, *, held: bool) -> None:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    state = {"spec": spec.model_dump(), "created": time.time(), "pid": os.getpid(),
             "held": held}
    state_path(spec.prefix).write_text(json.dumps(state, indent=1) + "\n")


def remove_state(prefix: str) -> list[str]:
    path = state_path(prefix)
    if path.exists():
        path.unlink()
        return [str(path)]
    return []


def owner_pid(prefix: str) -> int | None:
    """The live process that holds testbed `prefix` open (a `with Testbed`), if any."""
    state = read_state(prefix) or {}
    pid = state.get("pid") if state.get("held") else None
    if isinstance(pid, int) and is_alive(pid):
        return pid
    return None
