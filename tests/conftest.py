import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def scenarios_dir() -> Path:
    return SCENARIOS
