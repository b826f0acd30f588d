"""The emulated cluster: one network namespace per node, joined by tc-rate-limited veth links.

Multi-node traffic crosses a real, slower network on one machine (root only).

Layout for a testbed with prefix P and N nodes (nothing is created in the host's own namespace):

    namespace P-sw:   bridge P-br, ports P-p0 .. P-p{N-1}      (the switch)
    namespace P-n{i}: lo, veth P-e{i} = 10.213.S.{i+1}/24      (node i; S = subnet index)

Node i's link is the veth pair P-e{i} <-> P-p{i}. A tbf qdisc at `rate_Gbps` sits on both ends'
egress, so each node sends and receives at the link rate (full duplex, like a NIC). Ranks of one
node talk over loopback inside their namespace (traffic to the node's own address stays local);
ranks of different nodes cross two rate-limited links. Every name starts with the prefix, so
`down` finds and removes leftovers after a crash; deleting a namespace removes its veths and
qdiscs with it.

Modules, one concern each: spec (TestbedSpec: what to build, names and addresses), netns (the
kernel plumbing: ip and tc), state (the state file), signals (removal on every exit path),
cluster (Testbed: life cycle and launching torchrun on every node through realrun.torchrun),
cli (`realrun testbed ...`).
"""

from ..torchrun import LaunchResult, NodeRun, kill_group
from .cli import testbed_group
from .cluster import Testbed, cleanup, describe, testbed_for, testbed_prefixes, testbed_status
from .netns import list_namespaces, namespaces_unavailable, privilege_problem
from .spec import DEFAULT_PREFIX, MAX_NODES, MAX_RATE_GBPS, TestbedError, TestbedSpec
from .state import state_path

__all__ = [
    "DEFAULT_PREFIX", "MAX_NODES", "MAX_RATE_GBPS", "LaunchResult", "NodeRun", "Testbed",
    "TestbedError", "TestbedSpec", "cleanup", "describe", "kill_group", "list_namespaces",
    "namespaces_unavailable", "privilege_problem", "state_path", "testbed_for",
    "testbed_group", "testbed_prefixes", "testbed_status",
]
