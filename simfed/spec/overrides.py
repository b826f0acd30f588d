"""`--set KEY=VALUE` overrides, parsed once for every command (simfed run, sweep, plot, validate;
realrun run, bench, testbed): dotted scenario keys with YAML values, read under
`simfed.spec.yamlio`'s limits."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from .schema import SpecError
from .yamlio import parse_yaml

# YAML 1.1 reads these as booleans; scenario keys that take them (e.g. runtime.host.debug_checks)
# are choices spelled as words, so a value on the command line stays the word it was typed as
_WORDS = ("on", "off", "yes", "no", "y", "n")
_VERSION = re.compile(r"\s*\d+(\.\d+)+\s*$")


def parse_sets(items: Iterable[str], option: str = "--set") -> dict[str, Any]:
    """`["cluster.nodes=64", ...]` -> {"cluster.nodes": 64, ...}; a malformed item is a
    SpecError naming the option and the item."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SpecError(f"{option} {item!r}: expected KEY=VALUE, e.g. cluster.nodes=64")
        if raw.strip().lower() in _WORDS or (key.endswith("version") and _VERSION.match(raw)):
            out[key] = raw.strip()  # a version stays as typed: 2.20 is not the number 2.2
            continue
        out[key] = parse_yaml(raw, f"{option} {key}")  # bounded: simfed.spec.yamlio
    return out


def set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `a.b.c` (list items by name for `algorithms.fl_fsdp.group_nodes`, or by index)."""
    keys = dotted.split(".")
    cur: Any = data
    for i, key in enumerate(keys):
        last = i == len(keys) - 1
        if isinstance(cur, list):
            match = None
            if key.isdigit() and int(key) < len(cur):
                match = int(key)
            else:
                for j, item in enumerate(cur):
                    if isinstance(item, dict) and key in (item.get("name"), item.get("label")):
                        match = j
                        break
            if match is None:
                raise SpecError(f"{dotted}: no list item {key!r}")
            if last:
                cur[match] = value
            else:
                cur = cur[match]
            continue
        if not isinstance(cur, dict):
            raise SpecError(f"{dotted}: {'.'.join(keys[:i])} is not a mapping")
        if last:
            cur[key] = value
        else:
            if key not in cur or cur[key] is None:
                cur[key] = {}
            cur = cur[key]
