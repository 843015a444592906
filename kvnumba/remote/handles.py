"""What ``Agent.connect`` and ``Agent.copy`` return: ``RemoteView`` (another agent's exported view) and
``RemoteCopy`` (a copy under way). Neither knows the ``Agent``: a copy is given the NIXL calls it polls
with and what to call once it is over."""
from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import errors
from ..layouts import Geometry
from ..units import format_bytes
from ._nixl import call
from .sides import Side

if TYPE_CHECKING:
    from .header import Header

_POLL_S = (0.0, 0.00005, 0.0002, 0.001)  # wait()'s sleeps between polls, growing to the last


class RemoteView:
    """A cache view another agent exported, as this agent connected to it (``Agent.connect``).

    It has the view's ``geometry`` (layers, tokens, page size, heads, item bytes, dtype), ``mla``, the
    ``layout`` (the view class's name), where its memory is (``mem``: ``"DRAM"`` or ``"VRAM"``), who
    exported it (``agent``) and whether it may be written (``writable``: as exported). Use it as ``src``
    or ``dst`` of ``Agent.copy``.
    """

    def __init__(self, owner: object, header: Header, side: Side, blobs: list[bytes], token: int) -> None:
        self._owner = weakref.ref(owner)
        self.agent: str = header.agent
        self.instance: int = header.instance
        self.token_address: int = header.token
        self.token = token  # what the exporter's token slot holds while the export stands (export.token_of)
        self.writable: bool = header.writable  # whether its exporter lets peers write it
        self.side = side
        self.geometry: Geometry = side.geometry
        self.mla: bool = side.mla
        self.layout: str = side.origin.class_name  # the view class's name
        self.mem: str = side.origin.mem
        self.blobs = blobs  # NIXL metadata: the view's regions, then the token slab's (with connection information)
        self.regions: list[tuple[Any, ...]] = [tuple(r) for r in header.regions]

    def connected_by(self, agent: object) -> bool:
        """Whether ``agent`` is the one that connected this view (only it can copy with it)."""
        return self._owner() is agent

    def __repr__(self) -> str:
        g = self.geometry
        where = self.mem if self.mem == "DRAM" else f"VRAM cuda:{self.side.origin.device}"
        return (f"RemoteView({self.layout} of agent {self.agent!r}: L={g.layers}, T={g.tokens}, P={g.page_size}, "
                f"H={g.heads}, item={g.item_bytes} B{', MLA' if self.mla else ''}, {where}"
                f"{'' if self.writable else ', read-only'})")


class RemoteCopy:
    """An ``Agent.copy`` under way: ``done()``, ``wait()``; ``bytes`` (moved by NIXL), ``descriptors``
    (posted), ``route`` (``"direct"`` or ``"staged"``), ``op`` (``"READ"`` or ``"WRITE"``). Its
    ``repr`` says all of it. A transfer that fails in NIXL raises ``RemoteError`` from ``done()`` or
    ``wait()`` (and again on every later call): it never reports success.

    With a NIXL ``handle``, it is given NIXL's ``check_state(handle)`` and ``telemetry(handle)``, and
    ``on_release(copy)``, called once when its handle is released (the agent stops tracking it)."""

    def __init__(self, op: str, route: str, descriptors: int, nbytes: int, detail: str, handle: Any = None,
                 relayout: Any = None, release: Any = None, *, check_state: Callable[[Any], str] | None = None,
                 telemetry: Callable[[Any], Any] | None = None,
                 on_release: Callable[[RemoteCopy], None] | None = None) -> None:
        self.op, self.route = op, route
        self.descriptors, self.bytes, self.detail = descriptors, nbytes, detail
        self._handle, self._relayout, self._release = handle, relayout, release
        self._check_state, self._telemetry, self._on_release = check_state, telemetry, on_release
        self._error: BaseException | None = None
        self._done = handle is None
        self.nixl_descriptors: int | None = None  # what NIXL's telemetry counted, where it has it
        if self._done:
            self._finish()

    def done(self) -> bool:
        """True once every byte is in place (after a staged READ: relayout done too); ``RemoteError``
        if the transfer failed."""
        if self._error is not None:
            raise self._error
        if self._done:
            return True
        try:
            state = call("check_xfer_state", self._check_state, self._handle)
        except errors.RemoteError as error:
            self._fail(error)
        if state == "PROC":
            return False
        if state != "DONE":
            self._fail(errors.RemoteError(f"the NIXL {self.op} ({self.descriptors} descriptors) failed: state "
                                          f"{state!r}; the destination may hold part of the data"))
        self._done = True
        self._finish()
        return True

    def wait(self, timeout: float | None = None) -> RemoteCopy:
        """Block until ``done()``; ``TimeoutError`` after ``timeout`` seconds (the copy goes on)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        polls = 0
        while not self.done():
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{self!r} not done after {timeout} s")
            time.sleep(_POLL_S[min(polls, len(_POLL_S) - 1)])
            polls += 1
        return self

    def _finish(self) -> None:
        try:
            if self._handle is not None and self._telemetry is not None:
                try:
                    self.nixl_descriptors = int(self._telemetry(self._handle).descCount)
                except Exception:  # noqa: BLE001 - telemetry is optional in NIXL builds
                    self.nixl_descriptors = None
            if self._relayout is not None:
                self._relayout()
        except BaseException as error:
            self._error = error
            raise
        finally:
            self._cleanup()

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._cleanup()
        raise error

    def cancel(self, why: str) -> None:
        """Give the copy up without raising (``Agent.close`` does, for the copies in flight): its handle is
        released, and later ``done()``/``wait()`` raise ``RemoteError`` saying ``why``. Done or failed: nothing."""
        if not self._done and self._error is None:
            self._error = errors.RemoteError(f"the {self.op} was cancelled: {why}")
            self._cleanup()

    def _cleanup(self) -> None:
        handle, self._handle = self._handle, None
        on_release, self._on_release = self._on_release, None
        self._check_state = self._telemetry = None  # NIXL's agent is not held once the handle is gone
        if handle is not None:
            if on_release is not None:
                on_release(self)
            with contextlib.suppress(Exception):  # NIXL keeps a handle it cannot release, and frees it with the agent
                handle.release()
        release, self._release, self._relayout = self._release, None, None
        if release is not None:
            release()

    def __repr__(self) -> str:
        state = "failed" if self._error is not None else ("done" if self._done else "in flight")
        return f"RemoteCopy({self.op}, route={self.route}: {self.detail}, {format_bytes(self.bytes)}, {state})"
