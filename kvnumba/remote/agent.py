"""``Agent``: a NIXL agent that exports cache views, connects to other agents' exports, and copies
tokens between a local view and a remote one, in any two layouts ``kv.copy`` supports."""
from __future__ import annotations

import contextlib
import hashlib
import secrets
import time
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import errors
from ..api.copy import copy as kv_copy
from ..api.transfer import prepare
from ..layouts import CacheView
from ..checks import bounds, validate
from ..kernels import layouts
from ..types import ArrayLike
from ..units import format_bytes
from . import _nixl, export, plan, sides, staging, tokens
from . import header as remote_header
from ._nixl import call
from .handles import RemoteCopy, RemoteView
from .sides import Side


class _Held:
    """The NIXL registrations of one local view (kept while the view lives, or until unexport/close), and
    its exports: ``exports[writable]`` is ``(token slot, export id)`` of its export with that writability."""

    def __init__(self, side: Side, keys: list[tuple[str, int, int, int]]) -> None:
        self.side, self.keys = side, keys
        self.exports: dict[bool, tuple[int, int]] = {}


class Agent:
    """A NIXL agent (``nixl_agent``) for cache views.

    Parameters
    ----------
    name : str
        The agent's name, unique among the agents that talk to each other.
    backends : sequence of str
        NIXL backends to start (``("UCX",)``). On machines whose only transport is TCP, UCX needs
        ``tcp`` in ``UCX_TLS`` (the default, all transports, includes it).

    Notes
    -----
    ``export`` on the side that owns a cache, ``connect`` on the other with the bytes it returned, then
    ``copy``; ``close()`` (or leaving ``with``) deregisters everything. One thread at a time. The routes and
    what is checked: docs/guides/remote.md.

    Examples
    --------
    >>> with Agent("decode") as agent:                                        # doctest: +SKIP
    ...     pool = agent.connect(exported_bytes)                              # the prefill's PageFirst pool
    ...     agent.copy(pool, kv.VllmFlashAttn(caches), src_tokens, dst_tokens).wait()
    """

    def __init__(self, name: str, backends: Sequence[str] = ("UCX",)) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty str, got {name!r}")
        if isinstance(backends, str) or not all(isinstance(b, str) for b in backends) or not backends:
            raise TypeError(f"backends must be a non-empty sequence of backend names, got {backends!r}")
        nixl = _nixl.api()
        config = nixl.nixl_agent_config(backends=list(backends), capture_telemetry=True)
        self._nixl = call(f"nixl_agent({name!r})", nixl.nixl_agent, name, config)
        missing = [b for b in backends if b not in self._nixl.backends]
        if missing:
            raise errors.RemoteError(f"NIXL backend(s) {missing} did not start for agent {name!r} (available plugins: "
                                     f"{sorted(self._nixl.plugin_list)}); with UCX over TCP, UCX_TLS must include tcp")
        self.name, self.backends = name, tuple(backends)
        self.instance = secrets.randbits(62) + 1
        self.closed = False
        self._registered: dict[tuple[str, int, int, int], list[Any]] = {}  # key -> [descs, count, serial]
        self._serial = 0  # numbers each registration, so that another agent tells a new one from an old
        self._loaded: dict[str, dict[int, RemoteView]] = {}  # remote agent -> token -> the view loaded
        self._held: weakref.WeakKeyDictionary[CacheView, _Held] = weakref.WeakKeyDictionary()
        # Each exported view by id, held until unexport or close: an export of a temporary view
        # (agent.export(kv.PageFirst(k, v))) stands as long as one of a view the caller keeps.
        self._exported: dict[int, CacheView] = {}
        self._tokens = tokens.Tokens(self._register_array)
        self._scratch = np.zeros(1, np.uint64)  # where a copy reads the remote token to
        self._remotes: dict[str, int] = {}  # remote agent name -> the instance connected
        self._pool = staging.Pool()
        self._inflight: set[RemoteCopy] = set()
        self._register_array(self._scratch)

    # --- registrations -------------------------------------------------------------------------------

    def _register(self, mem: str, device: int, address: int, nbytes: int) -> tuple[str, int, int, int]:
        key = (mem, device, address, nbytes)
        entry = self._registered.get(key)
        if entry is None:
            descs = call(f"register_memory({mem} {nbytes} B at 0x{address:x})", self._nixl.register_memory,
                         [(address, nbytes, device, "")], mem)
            self._serial += 1
            self._registered[key] = [descs, 1, self._serial]
        else:
            entry[1] += 1
        return key

    def _deregister(self, key: tuple[str, int, int, int]) -> None:
        entry = self._registered.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del self._registered[key]
            call("deregister_memory", self._nixl.deregister_memory, entry[0])

    def _register_array(self, array: np.ndarray) -> tuple[str, int, int, int]:
        return self._register("DRAM", 0, array.ctypes.data, array.nbytes)

    def _hold(self, view: CacheView, name: str) -> _Held:
        """The view's side, its memory registered with NIXL once per view (until the view is collected, or
        for an exported view ``unexport`` or ``close``)."""
        held = self._held.get(view) if isinstance(view, CacheView) else None
        if held is None:
            side = sides.of_view(view, name)  # TypeError naming ``name`` for what is not a view
            keys: list[tuple[str, int, int, int]] = []
            try:
                for address, nbytes in side.buffers:
                    if nbytes:
                        keys.append(self._register(side.origin.mem, side.origin.device, address, nbytes))
            except BaseException:
                for key in keys:
                    self._deregister(key)
                raise
            held = self._held[view] = _Held(side, keys)
            weakref.finalize(view, self._drop, held)
        return held

    def _drop(self, held: _Held) -> None:
        """A view's exports made stale (their token slots zeroed, then free) and its memory deregistered."""
        if self.closed:
            return
        for slot, _ in held.exports.values():
            self._tokens.release(slot)
        held.exports.clear()
        for key in list(held.keys):
            self._deregister(key)
        held.keys.clear()

    # --- export, connect -----------------------------------------------------------------------------

    def export(self, view: CacheView, *, writable: bool | None = None) -> bytes:
        """Register ``view``'s memory with NIXL and return the bytes ``Agent.connect`` reads elsewhere.

        Any kvnumba view but ``kv.LayerTable`` (raw addresses). ``writable``: whether peers may write the
        view; None: if its memory is writable, True on read-only memory: ``ValueError``. The agent holds
        ``view`` until ``unexport(view)`` or ``close()``, which make every export of it stale
        (``StaleExportError``); exporting it again gives an export of the same memory.
        """
        self._check_open()
        if writable is not None and not isinstance(writable, bool):
            raise TypeError(f"writable must be True, False or None, got {type(writable).__name__}")
        held = self._hold(view, "view")
        if writable is not False:  # None: as its memory allows
            try:
                sides.check_writable(view, "view")
                writable = True
            except ValueError as error:
                if writable:
                    raise ValueError(f"writable=True, but the view's memory is read-only ({error}); export it with "
                                     "writable=False") from None
                writable = False
        if writable not in held.exports:
            held.exports[writable] = (self._tokens.take(), secrets.randbits(62) + 1)
        slot, export_id = held.exports[writable]
        token_key = self._tokens.key(slot)
        keys = [*held.keys, token_key]
        # The view's metadata, then the token slab's with this agent's connection information: an importer
        # loads that first, reads the token, and loads the rest only if the token vouches for the header.
        blobs = [call("get_partial_agent_metadata", self._nixl.get_partial_agent_metadata,
                      self._registered[key][0], key is token_key, list(self.backends)) for key in keys]
        header = {"agent": self.name, "instance": self.instance, "export": export_id,
                  "regions": [[*key, self._registered[key][2]] for key in keys],
                  "token": self._tokens.address(slot), "writable": writable, "nixl": _nixl.name(),
                  "side": sides.header(held.side), "blobs": [hashlib.sha256(b).hexdigest() for b in blobs]}
        text = export.header_text(header)
        self._tokens.write(slot, export.token_of(text))
        self._exported[id(view)] = view
        return export.encode(text, blobs)

    def unexport(self, view: CacheView) -> None:
        """Make every export of ``view`` stale, deregister its memory and let the view go (nothing for a view
        this agent never registered)."""
        self._check_open()
        self._exported.pop(id(view), None)
        held = self._held.pop(view, None)
        if held is not None:
            self._drop(held)

    def connect(self, exported: bytes) -> RemoteView:
        """The view another agent exported (``Agent.export``'s bytes), ready for ``copy``. Every header field
        (``kvnumba.remote.header``), then the exporter's token, is checked before NIXL is given anything; a
        refused export changes nothing here.

        Raises
        ------
        TypeError, ExportError
            ``exported`` is not a kvnumba export, is damaged, of another format version, this agent's own,
            of a layout unknown here, or a header field is wrong (the error names it).
        StaleExportError
            The export no longer stands (unexported, its agent closed or replaced), or was altered.
        RemoteError
            NIXL refused the metadata or the token read.
        """
        self._check_open()
        decoded = export.decode(exported)
        header = remote_header.read(decoded.header, decoded.blobs)
        if header.agent == self.name:
            raise errors.ExportError(f"exported comes from agent {self.name!r}, this agent: within one process, "
                                     "copy with kv.copy")
        side = sides.from_header(header.side)
        remote_header.check_reach(side)
        view = RemoteView(self, header, side, decoded.blobs, export.token_of(decoded.text))
        self._admit(view)
        return view

    def _admit(self, view: RemoteView) -> None:
        """Vouch for ``view`` by its exporter's token, then give NIXL its metadata; on any error, this
        agent's picture of the exporter's agent is as it was."""
        agent = view.agent
        known = self._remotes.get(agent)
        if known is not None and known != view.instance:
            if self._alive(agent):
                raise errors.StaleExportError(
                    f"{view!r} is stale: agent {agent!r} is connected here as another agent of that name, which "
                    "is running: this export is of an earlier agent of that name (closed), or forged; nothing "
                    "changed")
            self._forget(agent)  # that agent is gone: its exports are stale; NIXL holds one agent per name
            known = None
        was_loaded = view.token in self._loaded.get(agent, {})
        try:
            if known is None or not self._has(agent, view.token_address, 8, "DRAM", 0):
                try:
                    name = call("add_remote_agent (the token slab's metadata)", self._nixl.add_remote_agent,
                                view.blobs[-1])
                except errors.RemoteError as error:  # UCX connects as it loads: a closed agent refuses
                    if type(error.__cause__).__name__ in (*_GONE, "nixlBackendError"):
                        raise errors.StaleExportError(f"{view!r} is stale: its agent {agent!r} cannot be reached "
                                                      f"(closed or ended? {error})") from error
                    raise
                name = name.decode() if isinstance(name, bytes) else name
                if name != agent:
                    raise errors.ExportError(f"exported: its NIXL metadata is agent {name!r}'s, its header says "
                                             f"{agent!r}")
            self._remotes[agent] = view.instance
            self._check_token(view)
            self._load(view)
            for i, (address, nbytes) in enumerate(view.side.buffers):
                if nbytes and not self._has(agent, address, nbytes, view.mem, view.side.origin.device):
                    raise errors.ExportError(f"exported: NIXL's metadata of agent {agent!r} does not describe "
                                             f"side.buffers[{i}] ({nbytes} bytes at 0x{address:x})")
        except BaseException:
            if known is None:  # nothing of that agent was connected before: nothing of it stays
                with contextlib.suppress(errors.RemoteError):
                    self._forget(agent)
            elif not was_loaded:
                self._loaded.get(agent, {}).pop(view.token, None)
            raise

    def _has(self, agent: str, address: int, nbytes: int, mem: str, device: int) -> bool:
        """Whether NIXL's metadata of ``agent`` covers ``nbytes`` at ``address``."""
        descs = self._nixl.get_xfer_descs(np.array([[address, nbytes, device]], np.uint64), mem)
        return bool(self._nixl.check_remote_metadata(agent, descs))

    def _alive(self, agent: str) -> bool:
        """Whether the agent connected under ``agent`` still answers for one of its exports (its token)."""
        for view in list(self._loaded.get(agent, {}).values()):
            try:
                if self._read_token(view) == view.token:
                    return True
            except errors.RemoteError:
                return False
        return False

    def _forget(self, agent: str) -> None:
        """Drop everything NIXL knows of ``agent`` (its connection and the memory it exported)."""
        self._loaded.pop(agent, None)
        self._remotes.pop(agent, None)
        call(f"remove_remote_agent({agent!r})", self._nixl.remove_remote_agent, agent)

    def _load(self, view: RemoteView) -> None:
        """NIXL holds ``view``'s metadata. NIXL keeps what it loaded of an agent's memory even after that
        agent deregistered it; a region registered anew over (part of) such memory then goes unseen. So
        when the view's regions overlap other registrations loaded for its agent, NIXL's picture of that
        agent is rebuilt: this view's metadata and that of the loaded views that do not overlap it."""
        loaded = self._loaded.setdefault(view.agent, {})
        if view.token in loaded:
            return
        keep = {token: other for token, other in loaded.items() if not _conflict(other.regions, view.regions)}
        if len(keep) < len(loaded):
            instance = self._remotes.get(view.agent)
            self._forget(view.agent)
            if instance is not None:
                self._remotes[view.agent] = instance
            loaded = self._loaded.setdefault(view.agent, {})
            for other in keep.values():
                self._add(other)
                loaded[other.token] = other
        self._add(view)
        loaded[view.token] = view

    def _add(self, view: RemoteView) -> None:
        """Give NIXL the view's metadata: the token slab's first (it brings the connection information)."""
        for blob in (view.blobs[-1], *view.blobs[:-1]):
            call("add_remote_agent", self._nixl.add_remote_agent, blob)

    # --- copy ------------------------------------------------------------------------------------------

    def copy(self, src: CacheView | RemoteView, dst: CacheView | RemoteView, src_indices: ArrayLike,
             dst_indices: ArrayLike, layers: int | range | None = None, *, route: str = "auto",
             notify: bytes | None = None, block_quota: int = 2, num_warps_per_block: int = 32) -> RemoteCopy:
        """Move token ``src_indices[i]`` of ``src`` to token ``dst_indices[i]`` of ``dst``, K and V, for
        ``layers`` (None: all; an int; a range with step 1), through NIXL.

        Exactly one of ``src`` and ``dst`` is a ``RemoteView``: a READ (remote -> local) or a WRITE
        (local -> remote); the local one is any kvnumba view. ``route``: ``"auto"``, ``"direct"`` or
        ``"staged"`` (``kvnumba.remote.plan``; docs/guides/remote.md). ``notify``: a NIXL notification the
        remote agent receives (``notifications``) once the transfer is done. ``block_quota``,
        ``num_warps_per_block``: the launch shape of the staged route's ``kv.copy``. Local GPU memory must
        be ready before a WRITE; after a READ it is ready when ``wait()`` returns.

        Returns
        -------
        RemoteCopy
            ``wait()`` / ``done()``; its ``repr`` names the route, the descriptors and the bytes.

        Raises
        ------
        TypeError, ValueError, IndexOutOfRangeError
            A bad argument, named; nothing is written and nothing is posted.
        StaleExportError
            The remote view's export is no longer valid (unexported, or its agent closed or replaced).
        RemoteError
            NIXL failed (the remote agent unreachable, a refused transfer, ...).
        """
        self._check_open()
        remote_view, local_view, op = self._roles(src, dst)
        if op == "WRITE" and not remote_view.writable:
            raise ValueError(f"dst is a read-only export (agent {remote_view.agent!r} exported it with writable=False, "
                             "or its memory is read-only); a destination must be writable; nothing was moved")
        if route not in plan.ROUTES:
            raise ValueError(f"route must be one of {', '.join(plan.ROUTES)}, got {route!r}")
        if notify is not None and not isinstance(notify, bytes):
            raise TypeError(f"notify must be bytes or None, got {type(notify).__name__}")
        launch = dict(zip(("block_quota", "num_warps_per_block"),
                          validate.launch_config(block_quota, num_warps_per_block)))
        held = self._hold(local_view, "dst" if op == "READ" else "src")
        if op == "READ":
            sides.check_writable(local_view, "dst")
        local, remote = held.side, remote_view.side
        src_side, dst_side = (remote, local) if op == "READ" else (local, remote)
        heads = plan.check_pair(src_side, dst_side)
        layer_numbers = plan.window(src_side, dst_side, layers)
        src_info, dst_info = validate.indices(src_indices, dst_indices)
        src_tokens = np.asarray(bounds.host_indices(src_info), dtype=np.int64)
        dst_tokens = np.asarray(bounds.host_indices(dst_info), dtype=np.int64)
        plan.check_tokens("src_indices", src_tokens, src_side, "the tokens of src")
        plan.check_tokens("dst_indices", dst_tokens, dst_side, "the tokens of dst")
        self._check_fresh(remote_view)
        self._reap()
        if src_tokens.size == 0:
            return RemoteCopy(op, "direct", 0, 0, "nothing to copy")
        local_tokens, remote_tokens = (dst_tokens, src_tokens) if op == "READ" else (src_tokens, dst_tokens)

        direct = plan.pair_descriptors(local, local_tokens, remote, remote_tokens, layer_numbers, heads)
        staged_count = None
        if route != "direct" and staging.can_stage(remote):
            staged_count = plan.remote_runs(remote, remote_tokens, layer_numbers).size
        elif route == "staged":
            raise ValueError(f"route='staged': no staging view can be made for the remote layout {remote.origin.class_name}")
        chosen = plan.choose(route, len(direct), staged_count)
        layers_arg = range(int(layer_numbers[0]), int(layer_numbers[-1]) + 1)
        if chosen == "direct":
            detail = (f"{len(direct)} descriptors ({_per(direct)}) {src_side.origin.class_name} -> {dst_side.origin.class_name}")
            return self._post(op, remote_view, local.origin.mem, local.origin.device, direct, chosen, detail, notify)

        # Staged: the remote side's runs into a staging view laid out like it, relayout here with kv.copy.
        unique = np.unique(remote_tokens)
        mapped, pages = plan.staging_tokens(remote, remote_tokens)
        unique_mapped, _ = plan.staging_tokens(remote, unique)
        key, capacity, staging_view, staging_held = self._pool.take(
            remote, pages, layer_numbers, local.origin.mem, local.origin.device, lambda v: self._hold(v, "staging"))
        give_back = (lambda: self._pool.give_back(key, capacity, staging_view, staging_held))
        try:
            staged = plan.pair_descriptors(staging_held.side, unique_mapped, remote, unique, layer_numbers,
                                           layouts.head_runs(remote.parts, remote.geometry.heads))
            if op == "READ":
                relayout = prepare(kv_copy, src_view=staging_view, dst_view=local_view, layers=layers_arg)
                after = (lambda: relayout(mapped, local_tokens, **launch, check=True))
            else:
                kv_copy(local_view, staging_view, local_tokens, mapped, layers_arg, **launch, check=True)
                after = None
        except BaseException:
            give_back()
            raise
        detail = (f"{len(staged)} descriptors ({_per(staged)}) of {remote.origin.class_name} runs "
                  + (f"-> staging -> kv.copy -> {local.origin.class_name}" if op == "READ"
                     else f"<- staging <- kv.copy <- {local.origin.class_name}")
                  + f"; direct would post {len(direct)}")
        return self._post(op, remote_view, local.origin.mem, local.origin.device, staged, chosen, detail, notify, after, give_back)

    def _roles(self, src: Any, dst: Any) -> tuple[RemoteView, CacheView, str]:
        remote = [name for name, v in (("src", src), ("dst", dst)) if isinstance(v, RemoteView)]
        if len(remote) != 1:
            got = "both are" if remote else "neither is"
            raise TypeError(f"exactly one of src and dst must be a kvnumba.remote.RemoteView (Agent.connect), "
                            f"{got}")
        remote_view, local_view, op = (src, dst, "READ") if remote == ["src"] else (dst, src, "WRITE")
        if not remote_view.connected_by(self):
            raise ValueError(f"{remote[0]} is a RemoteView connected by another agent; connect the export with this one")
        return remote_view, local_view, op

    def _check_fresh(self, view: RemoteView) -> None:
        """The remote view's export still stands: its agent is the one connected, and its token slot still
        holds the digest of its header (``_check_token``)."""
        if self._remotes.get(view.agent) != view.instance:
            raise errors.StaleExportError(f"{view!r} is stale: agent {view.agent!r} was replaced by a new agent of "
                                          "that name since it was exported; connect its new export")
        self._load(view)  # again, if a later export of its agent displaced it
        self._check_token(view)

    def _check_token(self, view: RemoteView) -> None:
        """Read the view's token from its exporter (one 8-byte READ): ``StaleExportError`` unless it holds the
        digest of the view's header, or if the exporter cannot be reached (it closed, or ended)."""
        try:
            value = self._read_token(view)
        except errors.RemoteError as error:
            if type(error.__cause__).__name__ in _GONE:
                raise errors.StaleExportError(f"{view!r} is stale: its agent {view.agent!r} closed or ended ({error}); "
                                              "nothing was moved") from error
            raise
        if value != view.token:
            raise errors.StaleExportError(f"{view!r} is stale: its agent no longer exports that view (unexported, or "
                                          "the agent closed), or the export was altered (its "
                                          "header is not the one its agent wrote); nothing was moved")

    def _read_token(self, view: RemoteView) -> int:
        local = self._nixl.get_xfer_descs(np.array([[self._scratch.ctypes.data, 8, 0]], np.uint64), "DRAM")
        remote = self._nixl.get_xfer_descs(np.array([[view.token_address, 8, 0]], np.uint64), "DRAM")
        self._scratch[0] = 0
        handle = call(f"initialize_xfer(READ of the export token from {view.agent!r})", self._nixl.initialize_xfer,
                      "READ", local, remote, view.agent)
        try:
            state = call("transfer", self._nixl.transfer, handle)
            deadline = time.monotonic() + 30
            while state == "PROC" and time.monotonic() < deadline:
                state = call("check_xfer_state", self._nixl.check_xfer_state, handle)
            if state != "DONE":
                raise errors.RemoteError(f"reading the export token from agent {view.agent!r} failed (NIXL state "
                                         f"{state!r}): is that agent still running?")
        finally:
            handle.release()
        return int(self._scratch[0])

    def _reap(self) -> None:
        """Finish the copies in flight that are done, whether or not anyone waits for them, so that their
        handles and staging views come back."""
        for pending in list(self._inflight):
            with contextlib.suppress(Exception):  # kept by the copy, raised by its done()/wait()
                pending.done()

    def _post(self, op: str, remote_view: RemoteView, mem: str, device: int, descriptors: plan.Descriptors,
              route: str, detail: str, notify: bytes | None, after: Any = None, release: Any = None) -> RemoteCopy:
        try:
            _check_inside(remote_view, descriptors)
            local = call("get_xfer_descs", self._nixl.get_xfer_descs, descriptors.rows("local", device), mem)
            remote = call("get_xfer_descs", self._nixl.get_xfer_descs,
                          descriptors.rows("remote", remote_view.side.origin.device), remote_view.mem)
            handle = call(f"initialize_xfer({op} with {remote_view.agent!r}, {len(descriptors)} descriptors)",
                          self._nixl.initialize_xfer, op, local, remote, remote_view.agent, notify or b"")
        except BaseException:
            if release is not None:
                release()
            raise
        try:
            state = call(f"transfer({op})", self._nixl.transfer, handle)
            if state == "ERR":
                raise errors.RemoteError(f"posting the NIXL {op} ({len(descriptors)} descriptors) to agent "
                                         f"{remote_view.agent!r} failed")
        except BaseException:
            handle.release()
            if release is not None:
                release()
            raise
        result = RemoteCopy(op, route, len(descriptors), descriptors.bytes, detail, handle, after, release,
                            check_state=self._nixl.check_xfer_state, telemetry=self._nixl.get_xfer_telemetry,
                            on_release=self._inflight.discard)
        self._inflight.add(result)
        return result

    # --- the rest --------------------------------------------------------------------------------------

    def notifications(self) -> dict[str, list[bytes]]:
        """Notifications received since the last call (``copy(..., notify=...)`` of other agents), by agent name."""
        self._check_open()
        self._reap()
        got = call("get_new_notifs", self._nixl.get_new_notifs)
        return {(k.decode() if isinstance(k, bytes) else k): list(v) for k, v in got.items()}

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError(f"agent {self.name!r} is closed")

    def close(self) -> None:
        """Cancel copies in flight, make every export stale, deregister all memory and end the agent.
        Calling it again does nothing."""
        if self.closed:
            return
        for pending in list(self._inflight):
            pending.cancel(f"agent {self.name!r} closed")
        self._tokens.clear()
        for name in list(self._remotes):
            with contextlib.suppress(Exception):  # closing goes on
                self._nixl.remove_remote_agent(name)
        self._pool.free.clear()
        for descs, *_ in list(self._registered.values()):
            with contextlib.suppress(Exception):
                self._nixl.deregister_memory(descs)
        self._registered.clear()
        self._held = weakref.WeakKeyDictionary()
        self._exported.clear()
        self.closed = True
        self._nixl = None

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._registered)} registrations, {len(self._remotes)} remote agents"
        return f"Agent({self.name!r}, backends={list(self.backends)}, {state})"


_GONE = ("nixlRemoteDisconnectError",)  # NIXL's errors for an agent that closed or ended


def _check_inside(view: RemoteView, descriptors: plan.Descriptors) -> None:
    """Every remote range of ``descriptors`` lies in the buffer of ``view`` it was planned in (those lie in
    what its exporter registered: ``kvnumba.remote.header``); else ``ExportError``, before anything moves."""
    starts, ends = view.side.buffer_ranges()
    which = descriptors.remote_buffer
    outside = (descriptors.remote < starts[which]) | (descriptors.remote + descriptors.length > ends[which])
    if outside.any():
        i = int(np.flatnonzero(outside)[0])
        raise errors.ExportError(f"{view!r}: the copy would reach {int(descriptors.length[i])} bytes at "
                                 f"0x{int(descriptors.remote[i]):x}, outside side.buffers[{int(which[i])}] of its "
                                 "export; nothing was moved")


def _conflict(a: list[tuple[Any, ...]], b: list[tuple[Any, ...]]) -> bool:
    """Two lists of ``(mem, device, address, bytes, serial)`` registrations hold two different
    registrations of some of the same memory."""
    for mem, device, address, size, serial in a:
        for mem2, device2, address2, size2, serial2 in b:
            if (mem, device) == (mem2, device2) and address < address2 + size2 and address2 < address + size \
                    and (address, size, serial) != (address2, size2, serial2):
                return True
    return False


def _per(descriptors: plan.Descriptors) -> str:
    """Bytes per descriptor, for a repr: one size, or the range."""
    if not len(descriptors):
        return "none"
    low, high = int(descriptors.length.min()), int(descriptors.length.max())
    return f"{format_bytes(low)} each" if low == high else f"{format_bytes(low)}-{format_bytes(high)}"
