"""The network: link classes, fluid bandwidth sharing, and where a ring's bytes travel."""

from .flow import FlowNetwork
from .links import LINK_KINDS, LinkClass

__all__ = ["LINK_KINDS", "FlowNetwork", "LinkClass"]
