"""`--set KEY=VALUE` overrides, parsed once for every command (simfed run, sweep, plot, validate;
realrun run, bench, testbed): dotted scenario keys with YAML values, read under
`simfed.spec.yamlio`'s limits."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .schema import SpecError
from .yamlio import parse_yaml

# YAML 1.1 reads these as booleans; scenario keys that take them (e.g. runtime.host.debug_checks)
# are choices spelled as words, so a value on the command line stays the word it was typed as
_WORDS = ("on", "off", "yes", "no", "y", "n")


def parse_sets(items: Iterable[str], option: str = "--set") -> dict[str, Any]:
    """`["cluster.nodes=64", ...]` -> {"cluster.nodes": 64, ...}; a malformed item is a
    SpecError naming the option and the item."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SpecError(f"{option} {item!r}: expected KEY=VALUE, e.g. cluster.nodes=64")
        if raw.strip().lower() in _WORDS:
            out[key] = raw.strip()
            continue
        out[key] = parse_yaml(raw, f"{option} {key}")  # bounded: simfed.spec.yamlio
    return out
