"""kvnumba beyond one process: copy KV-cache tokens between processes and machines through NIXL, in any
two layouts ``kv.copy`` supports.

- ``Agent(name)`` wraps a NIXL agent; ``Agent.export(view) -> bytes`` registers and describes a view,
  ``Agent.connect(bytes) -> RemoteView`` on the other side;
- ``Agent.copy(src, dst, src_indices, dst_indices, layers=None)`` with exactly one ``RemoteView``: a READ or
  a WRITE, planned from both layouts (``remote.plan``), its route in the returned ``RemoteCopy``'s ``repr``;
- ``plan_copy(...)``: the descriptors a copy would post, without NIXL.

It needs NIXL's Python API (``pip install --no-deps nixl-cu13``, or ``nixl-cu12``); importing it does not.
"""
from ._nixl import available as nixl_available
from .agent import Agent
from .handles import RemoteCopy, RemoteView
from .counts import CopyPlan, plan_copy

__all__ = ["Agent", "CopyPlan", "RemoteCopy", "RemoteView", "nixl_available", "plan_copy"]
