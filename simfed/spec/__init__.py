"""The shared contract between the simulator and realrun: standard library, PyYAML and pydantic.

Model description, parallel plan, algorithm catalogue, scenario loader and trace schema.
"""

from .algorithms import ALGORITHMS, AlgorithmInfo, algorithm_info
from .loader import load_scenario, load_scenario_data, scenario_from_dict
from .model import ModelSpec, UnitSpec
from .plan import FED, PG_KINDS, REPLICATE, SHARD, ParallelPlan
from .scenario import (
    AlgorithmSpec,
    ClusterSpec,
    DataSpec,
    RuntimeSpec,
    Scenario,
    StragglerSpec,
    TrainingSpec,
    node_block_groups,
    ranks_per_core,
)
from .schedule import lr_factor
from .schema import SpecError, to_plain
from .trace import (
    PHASES,
    Span,
    TraceWriter,
    read_trace,
    to_chrome,
    wall_step_times,
    write_chrome,
    write_trace,
)

__all__ = [
    "ALGORITHMS",
    "FED",
    "PG_KINDS",
    "PHASES",
    "REPLICATE",
    "SHARD",
    "AlgorithmInfo",
    "AlgorithmSpec",
    "ClusterSpec",
    "DataSpec",
    "ModelSpec",
    "ParallelPlan",
    "RuntimeSpec",
    "Scenario",
    "Span",
    "SpecError",
    "StragglerSpec",
    "TraceWriter",
    "TrainingSpec",
    "UnitSpec",
    "algorithm_info",
    "load_scenario",
    "load_scenario_data",
    "lr_factor",
    "node_block_groups",
    "ranks_per_core",
    "read_trace",
    "scenario_from_dict",
    "to_chrome",
    "to_plain",
    "wall_step_times",
    "write_chrome",
    "write_trace",
]
