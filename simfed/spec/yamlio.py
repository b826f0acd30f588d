"""Reading YAML input safely: bounded size, UTF-8 only, no duplicate keys, bounded nesting and
bounded alias expansion.

Every file simfed or realrun reads as configuration (scenarios, includes, profiles, sweep specs)
goes through `read_yaml`, and every YAML value given on a command line (`--set KEY=VALUE`)
through `parse_yaml`. A fault is a `SpecError` whose one-line message names the file (and line)
and the limit; nothing here can hang, exhaust memory or raise anything else:

- a file must be a regular file of at most `MAX_FILE_BYTES` (so /dev/zero, a FIFO or a
  directory is refused before it is read) and valid UTF-8 (a UTF-8 byte-order mark is allowed;
  UTF-16, Latin-1 and binary data are refused);
- a mapping must not repeat a key (YAML would silently keep the last one);
- nesting deeper than `MAX_DEPTH` is refused (it would overflow Python's stack);
- aliases may share data, but the document, with every alias expanded, may hold at most
  `MAX_NODES` values (a "billion laughs" alias bomb is refused instead of expanded), and an alias
  may not contain itself.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from .schema import SpecError

# Limits. The shipped scenarios are < 10 KB, nest 5 deep and hold < 1,000 values; these leave
# two to three orders of magnitude of room and keep a hostile file's cost under a second.
MAX_FILE_BYTES = 4 * 2**20
MAX_DEPTH = 64
MAX_NODES = 200_000
MAX_DATA_BYTES = 2 * 2**30  # measurements read as text (traces, bench summaries)


class _Refused(yaml.YAMLError):
    def __init__(self, message: str, mark: Any = None):
        super().__init__(message)
        self.problem = message
        self.problem_mark = mark


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader (pure Python, so nesting can be counted) refusing duplicate keys
    and deep nesting."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(f"nesting deeper than {MAX_DEPTH} levels",
                               self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base class reports it
                    continue
                if first is not None:
                    raise _Refused(f"duplicate key {key!r} (first at line {first.line + 1}; "
                                   "YAML would keep only the last)", key_node.start_mark)
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


# YAML 1.2's floats: 3e-5 and 1E+3 are numbers (YAML 1.1, PyYAML's default, reads a float
# without a dot as a string: `lr: 3e-5` was refused as "expected a number")
_FLOAT_12 = re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)$")
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+0123456789"))


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper that quotes a string the loader above would read as a number
    ("1e3"), so that what is written reads back as it was."""


_Dumper.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+0123456789"))


def dump_yaml(data: Any, **kwargs: Any) -> str:
    """yaml.safe_dump with this module's reading of numbers (see _Dumper)."""
    return yaml.dump(data, Dumper=_Dumper, **kwargs)


def expanded_size(data: Any, source: str) -> int:
    """How many values `data` holds with every shared (aliased) part counted each time it is
    used; refuses more than MAX_NODES, and a value that contains itself."""
    memo: dict[int, int] = {}
    active: set[int] = set()
    # iterative post-order walk (no recursion: the nesting is bounded, but keep it cheap)
    stack: list[tuple[Any, bool]] = [(data, False)]
    while stack:
        obj, done = stack.pop()
        if not isinstance(obj, (dict, list)):
            continue
        oid = id(obj)
        children = list(obj.keys()) + list(obj.values()) if isinstance(obj, dict) else obj
        if done:
            active.discard(oid)
            total = 1
            for c in children:
                total += memo.get(id(c), 1) if isinstance(c, (dict, list)) else 1
                if total > MAX_NODES:
                    raise SpecError(f"{source}: more than {MAX_NODES:,} values once YAML "
                                    "aliases are expanded (an alias bomb?)")
            memo[oid] = total
            continue
        if oid in memo:
            continue
        if oid in active:
            raise SpecError(f"{source}: a YAML alias refers to a value that contains it")
        active.add(oid)
        stack.append((obj, True))
        for c in children:
            if isinstance(c, (dict, list)):
                if id(c) in active:
                    raise SpecError(f"{source}: a YAML alias refers to a value that contains it")
                stack.append((c, False))
    return memo.get(id(data), 1)


def parse_yaml(text: str, source: str) -> Any:
    """Parse YAML text (from `source`, named in errors) with the limits above."""
    if len(text) > MAX_FILE_BYTES:
        raise SpecError(f"{source}: {len(text):,} characters; the limit is {MAX_FILE_BYTES:,}")
    try:
        loader = _Loader(text)  # (the reader refuses control characters here)
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        raise SpecError(f"{source}: line {line}: invalid YAML: character #x{exc.character:04x} "
                        f"is not allowed ({exc.reason}; a control character?)") from None
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" line {mark.line + 1}, column {mark.column + 1}:" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"{source}:{at} invalid YAML: {problem}") from None
    except RecursionError:  # a guard: MAX_DEPTH keeps the composer well inside the stack
        raise SpecError(f"{source}: nesting too deep") from None
    except ValueError as exc:  # an integer of more than 4,300 digits (Python's limit)
        raise SpecError(f"{source}: invalid YAML: {str(exc).split(';')[0]}") from None
    finally:
        loader.dispose()
    expanded_size(data, source)
    return data


def read_text(path: Path, where: str, limit: int = MAX_FILE_BYTES) -> str:
    """A file's text: a regular file, at most `limit` bytes (configuration: MAX_FILE_BYTES;
    measurements: MAX_DATA_BYTES), UTF-8."""
    if "\x00" in str(path):  # (os.stat would raise ValueError)
        raise SpecError(f"{where}: a file name with a NUL character: {str(path)[:200]!r}")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise SpecError(f"{where}: file not found: {path}") from None
    except OSError as exc:
        raise SpecError(f"{where}: cannot read {path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise SpecError(f"{where}: {path} is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise SpecError(f"{where}: {path} is not a regular file (a device, FIFO or socket)")
    if st.st_size > limit:
        raise SpecError(f"{where}: {path} is {st.st_size:,} bytes; the limit is "
                        f"{limit:,}")
    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)
    except OSError as exc:
        raise SpecError(f"{where}: cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > limit:
        raise SpecError(f"{where}: {path} is larger than the limit of {limit:,} bytes")
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise SpecError(f"{where}: {path} is UTF-16, not UTF-8 (it starts with a UTF-16 "
                        "byte-order mark); save it as UTF-8")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{where}: {path} is not UTF-8 text (byte {exc.start}: "
                        f"{raw[exc.start:exc.start + 1]!r})") from None
    if "\x00" in text:
        raise SpecError(f"{where}: {path} holds a NUL character (binary data, not text)")
    return text


def read_yaml(path: str | Path, where: str) -> Any:
    """Parse one YAML file with every limit above; `where` names what it is for ("scenario",
    "cluster.include")."""
    path = Path(path)
    return parse_yaml(read_text(path, where), str(path))
