"""What-if sweeps: a grid of scenario overrides, every point simulated in a worker process, one
row per point and algorithm in deterministic CSV and JSON.

A sweep varies dotted scenario keys (the same keys as `simfed run --set`) over lists or ranges:

    simfed sweep scenarios/512gpu.yaml --set training.steps=16 \\
        --vary cluster.nodes=16:1024:x2 --vary algorithms.fl_fsdp.group_nodes=1,2,4,8

Values: `V1,V2,...` (each read as a YAML scalar), `START:STOP` or `START:STOP:STEP` (arithmetic,
STOP included) or `START:STOP:xF` (geometric: times F). Keys joined by `+` vary together with
the same values (`algorithms.fl_fsdp.group_nodes+algorithms.fl_hsdp.group_nodes=2,4,8`).

A sweep file is YAML with a single top-level `sweep:` mapping (scenario files stay valid
scenarios; `simfed sweep FILE` tells the two apart by that key):

    sweep:
      scenario: ../scenarios/512gpu.yaml   # relative to this file
      set: {training.steps: 16}            # fixed overrides, applied at every point
      vary:                                # one grid axis per key (in this order)
        cluster.nodes: [16, 32, 64, 128]
        algorithms.fl_fsdp.aggregate_every: "1:64:x2"
      linked:                              # axes of keys that vary together, equal lengths
        - algorithms.fl_fsdp.group_nodes: [1, 2, 4]
          algorithms.fl_hsdp.group_nodes: [2, 4, 8]
      algorithms: [fsdp, fl_fsdp]          # optional; the first is the speedup baseline

Command-line `--vary` axes come after the file's, `--set` overrides the file's, `--algorithm`
replaces the file's list. Points run as (scenario path, overrides) tasks on a local process
pool, a Dask cluster or Ray. A point that is impossible never stops the sweep: an algorithm
whose plan does not fit the cluster gives a row with status `invalid` and the one-line error;
one that runs out of GPU memory gives `does_not_fit` (numbers kept); any other failure `error`.
Rows are ordered by point, then algorithm, so the same sweep writes byte-identical files with
any executor and any number of workers. Workers must see the scenario files at the same path.

Modules, one concern each: grid (axes and the value grammar), sweepfile (the sweep-file
format), check (keys and algorithms before a run), point (one point in a worker), executors
(local, Dask, Ray), runner (run_sweep and the progress bar), output (CSV/JSON written and read
back; the CSV holds scalar fields only, arrays stay in the JSON). The Python entry point is
`simfed.sweep` (simfed.api); the command, `simfed sweep`, is simfed.commands.sweep.
"""

from .check import check_key, prepare, scenario_data, select_algorithms
from .executors import EXECUTORS, Executor, Task, default_jobs
from .grid import MAX_POINTS, Axis, SweepSpec, parse_values, parse_vary
from .output import flatten, read_rows, scalar_columns, to_csv, to_json, write_outputs
from .point import STATUSES, run_point
from .runner import SweepResult, run_sweep
from .sweepfile import SWEEP_KEY, is_sweep_file, load_sweep_file

__all__ = [
    "EXECUTORS", "MAX_POINTS", "STATUSES", "SWEEP_KEY", "Axis", "Executor", "SweepResult",
    "SweepSpec", "Task", "check_key", "default_jobs", "flatten", "is_sweep_file",
    "load_sweep_file", "parse_values", "parse_vary", "prepare", "read_rows", "run_point",
    "run_sweep", "scalar_columns", "scenario_data", "select_algorithms", "to_csv", "to_json",
    "write_outputs",
]
