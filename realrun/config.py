"""Command-line choices that shape a run, parsed without torch: `--set` overrides, the
`--algorithm` selection and the profiler window."""

from __future__ import annotations

from pathlib import Path

from simfed.spec import AlgorithmSpec, Scenario, SpecError

from .errors import RealrunError


def select_algorithms(scenario: Scenario, text: str) -> list[AlgorithmSpec]:
    """`--algorithm`: one name or label, a comma-separated list, or `all` (the scenario's)."""
    if text == "all":
        return list(scenario.algorithms)
    return [scenario.algorithm(name.strip()) for name in text.split(",")]


def parse_window(text: str) -> tuple[int, int] | None:
    """`--profile-steps A:B` -> (A, B), steps A..B-1; empty -> None."""
    if not text:
        return None
    a, sep, b = text.partition(":")
    try:
        lo, hi = int(a), int(b)
    except ValueError:
        lo, hi = 0, -1
    if not sep or not 0 <= lo < hi:
        raise RealrunError(f"--profile-steps {text!r}: expected A:B with 0 <= A < B")
    return lo, hi


def resolve_data_path(path: str, scenario_path: Path | None) -> Path:
    """data.path as given, or else relative to the scenario file."""
    p = Path(path)
    if not p.is_absolute() and not p.exists() and scenario_path is not None:
        p = scenario_path.parent / p
    if not p.exists():
        raise SpecError(f"data.path: file not found: {path}")
    return p


def check_runnable(scenario: Scenario) -> None:
    """What simfed simulates but realrun does not run is refused before any rank starts work:
    float8 GEMMs (torchao, FP8 tensor cores)."""
    tr = scenario.training
    if tr.float8 != "none":
        raise RealrunError(f"training.float8: {tr.float8} is simulated by simfed only; realrun "
                           "trains in the model dtype (set training.float8=none)")
