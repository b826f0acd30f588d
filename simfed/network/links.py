"""A link class: a set of identical physical links (NVLink egress of a GPU, a NIC rail, a leaf
uplink, a Dragonfly+ group's global links) that carry the same load under symmetry.

A simulation never instantiates one object per cable: it instantiates one `LinkClass` per kind
and per class of equivalent nodes, and a collective loads each class with the bytes that one of
its links carries (see `network.geometry`).
"""

from __future__ import annotations

from dataclasses import dataclass

# Kinds, also the keys of the `bytes_by_link` report.
NVLINK, NIC, LEAF_UP, GLOBAL = "nvlink", "inter_node", "leaf_uplink", "global"
LINK_KINDS = (NVLINK, NIC, LEAF_UP, GLOBAL)
# A leaf switch's aggregate forwarding capacity (all inter-node egress of its nodes): not a
# byte-accounting kind (those bytes are already counted as inter_node)
SWITCH = "switch"


@dataclass(frozen=True, slots=True)
class LinkClass:
    index: int
    kind: str
    node_class: int  # -1 for fabric-wide classes
    capacity_Bps: float  # one link, after protocol efficiency
    count: int  # physical links in the class

    @property
    def label(self) -> str:
        return self.kind if self.node_class < 0 else f"{self.kind}[{self.node_class}]"
