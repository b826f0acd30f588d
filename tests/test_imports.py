"""simfed never imports torch; realrun imports only simfed.spec from simfed."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_importing_simfed_does_not_load_torch():
    code = (
        "import sys, importlib, pkgutil, simfed\n"
        "for m in pkgutil.walk_packages(simfed.__path__, 'simfed.'):\n"
        "    importlib.import_module(m.name)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_realrun_imports_only_simfed_spec():
    offenders = []
    for path in (ROOT / "realrun").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for n in names:
                if n.split(".")[0] == "simfed" and not n.startswith("simfed.spec"):
                    offenders.append(f"{path.relative_to(ROOT)}: {n}")
    assert not offenders, offenders
