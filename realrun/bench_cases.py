"""What `realrun bench` can measure, named once for the launcher (`realrun.bench`) and the ranks
(`realrun.bench_worker`): the process-group kinds of the collective cases and the parts of the
bench (torch-free)."""

from __future__ import annotations

from simfed.spec.scenario import BENCH_PARTS

GROUP_KINDS = ("intra", "inter", "world", "fl")  # fl: the scenario's federation groups, one
# rank per node position in each block of group_nodes nodes (summary group "nodes{b}")
PARTS = BENCH_PARTS  # comm, compute, units, optimizer, checks
