"""kvnumba beyond one process: copy KV-cache tokens between processes and machines through NIXL, in any
two layouts ``kv.copy`` supports (docs/guides/remote.md): ``Agent`` exports a view as bytes, connects to
another agent's export (a ``RemoteView``) and copies (a ``RemoteCopy``); ``plan_copy`` gives the descriptors
a copy would post, without NIXL. It needs NIXL's Python API; importing it does not.
"""
from ._nixl import available as nixl_available
from .agent import Agent
from .handles import RemoteCopy, RemoteView
from .plan import CopyPlan, plan_copy

__all__ = ["Agent", "CopyPlan", "RemoteCopy", "RemoteView", "nixl_available", "plan_copy"]
