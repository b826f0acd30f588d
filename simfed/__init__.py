"""simfed: a discrete-event model of FSDP, HSDP, FL+FSDP and FL+HSDP on GPU clusters.

The Python API (docs/python-api.md):

    import simfed

    scn = simfed.load("scenarios/512gpu.yaml", set={"training.steps": 16})
    res = simfed.simulate(scn)             # typed; res.to_json() is `simfed run --json`
    rows = simfed.sweep(scn, vary={"cluster.nodes": [32, 64, 128]})
    table = simfed.collective(scn, "all_reduce", nodes=2)

Bad input raises `simfed.SpecError`, whose one-line message names the key path and the value.
"""

# `simfed.sweep` is the function; the subpackage of the same name (simfed/sweep/, imported by
# simfed.api first) stays importable as `from simfed.sweep import ...`
from .api import (
    AlgorithmResult,
    CollectiveTable,
    Scenario,
    SimulationResult,
    SpecError,
    SweepResult,
    collective,
    load,
    simulate,
    sweep,
)

__version__ = "0.1.0"

__all__ = ["AlgorithmResult", "CollectiveTable", "Scenario", "SimulationResult", "SpecError",
           "SweepResult", "__version__", "collective", "load", "simulate", "sweep"]
