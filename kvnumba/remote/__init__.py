"""kvnumba beyond one process: copy KV-cache tokens between processes and machines through NIXL, in any
two layouts ``kv.copy`` supports.

- ``Agent(name, backends=("UCX",))`` wraps a NIXL agent;
- ``Agent.export(view) -> bytes`` registers a cache view's memory and describes it (NIXL metadata and
  the view's geometry); ``Agent.connect(bytes) -> RemoteView`` on the other side;
- ``Agent.copy(src, dst, src_indices, dst_indices, layers=None)`` with exactly one ``RemoteView``: a READ
  or a WRITE, planned from both layouts (``kvnumba.remote.plan``): merged runs, or the remote side's runs
  through a staging buffer and ``kv.copy`` (the route is in the returned ``RemoteCopy``'s ``repr``);
- ``plan_copy(src, dst, src_indices, dst_indices, layers)``: the descriptors a copy would post, without NIXL.

It needs NIXL's Python API (``pip install --no-deps nixl-cu13``, or ``nixl-cu12`` with a CUDA 12 driver;
``pip install -e ".[nixl]"`` from the checkout also pulls torch); importing ``kvnumba.remote`` does not.
"""
from ._nixl import available as nixl_available
from .agent import Agent
from .handles import RemoteCopy, RemoteView
from .counts import CopyPlan, plan_copy

__all__ = ["Agent", "CopyPlan", "RemoteCopy", "RemoteView", "nixl_available", "plan_copy"]
