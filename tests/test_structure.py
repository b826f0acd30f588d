"""The shape of the code: imports go one way (no circle between modules, no package importing
a layer above its own), and no module grows past 600 lines.

Imports are read from the source (`ast`), every one counted: at the top of a module, inside a
function (a lazy import is still a dependency) and under `if TYPE_CHECKING:`.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("simfed", "realrun")
MAX_MODULE_LINES = 600

# simfed's layers, lowest first: a package may import its own layer's modules and those of
# lower layers only (spec <- hardware/network/collectives/compute <- engine <- analysis/plots
# <- api <- cli; simfed.commands holds subcommands of the cli). The interface the engine calls
# for host contention lives in the engine (simfed/engine/host.py); simfed.contention
# implements it from below.
LAYERS = {
    "spec": 0,
    "hardware": 1, "memory": 1, "convergence": 1, "contention": 1,
    "network": 2, "compute": 2, "collectives": 2,
    "engine": 3,
    "calibration": 4, "sweep": 4, "bench": 4,
    "analysis": 5,
    "plots": 6,
    "figures": 7,
    "api": 8,
    "commands": 9,
    "cli": 10,
}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _imports() -> dict[str, set[str]]:
    """Per module, the modules of simfed and realrun it imports (a name imported from a package
    counts as its submodule when there is one)."""
    mods = _modules()

    def known(name: str) -> str:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    edges: dict[str, set[str]] = defaultdict(set)
    for mod, path in mods.items():
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[:len(package) - (node.level - 1)]
                    src = ".".join(base + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                targets = [f"{src}.{a.name}" if f"{src}.{a.name}" in mods else src
                           for a in node.names]
            for t in targets:
                k = known(t)
                if k and k != mod:
                    edges[mod].add(k)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    counter = 0
    for root in sorted(set(edges) | {t for ts in edges.values() for t in ts}):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def test_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": {"c"}}) == []


def test_no_import_circle():
    cycles = _cycles(_imports())
    assert not cycles, f"modules that import each other (directly or through others): {cycles}"


def test_every_simfed_package_has_a_layer():
    tops = {m.split(".")[1] for m in _modules() if m.startswith("simfed.")}
    assert tops <= set(LAYERS), f"give these a layer in LAYERS: {sorted(tops - set(LAYERS))}"


def test_no_upward_import_in_simfed():
    upward = []
    for mod, targets in _imports().items():
        if not mod.startswith("simfed."):
            continue
        own = mod.split(".")[1]
        for t in targets:
            if not t.startswith("simfed."):
                continue
            other = t.split(".")[1]
            if other != own and LAYERS[other] >= LAYERS[own]:
                upward.append(f"{mod} -> {t}")
    assert not upward, f"imports of a layer not below the importer's: {upward}"


def test_simfed_never_imports_realrun():
    bad = [f"{m} -> {t}" for m, ts in _imports().items() if m.startswith("simfed")
           for t in ts if t.startswith("realrun")]
    assert not bad, bad


def test_no_module_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in _modules().values()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by concern): {long}"


# realrun's command-line modules (launchers) sit above the code the ranks run: nothing they
# launch imports them (a package's __init__ may re-export its own command)
REALRUN_LAUNCHERS = {"realrun.cli", "realrun.bench", "realrun.launch", "realrun.testbed.cli"}


def test_realrun_ranks_never_import_the_launchers():
    bad = [f"{m} -> {t}" for m, ts in _imports().items() if m.startswith("realrun")
           and m not in REALRUN_LAUNCHERS for t in ts
           if t in REALRUN_LAUNCHERS and not t.startswith(m + ".")]
    assert not bad, f"imports of realrun's launchers from below them: {bad}"
