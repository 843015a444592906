"""``kvnumba.prepare``: validate and resolve the unchanging part of a transfer once, then call it.

Everything an entry point checks before launching depends on buffers and sizes that stay the same across
the calls of a HiCache load; only the indices (and ``layer_id``) change (``prepare``'s example).

A prepared kernel transfer whose calls take exactly the indices (``layer_id``, the launch shape) is called
straight through its plan's fast call (``plan.per_call``); any other through ``Transfer._call``. The plain
entry points share a nothing-bound ``Transfer``'s plan cache (``plain``), which finds plans by value.
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Any, Union

from ..checks import guard, validate
from ..driver.streams import stream_handle
from ..types import StreamLike
from ..plan import build, routes
from ..plan.cache import forget_plans
from ..plan.direct_plan import DirectPlan
from ..plan.fp8_plan import Fp8Plan
from ..plan.kernel_plan import KernelPlan
from ..plan.spec import SPECS, TBL, Spec
from .snapshot import Snapshot

_KERNEL_CALL = ("src_indices", "dst_indices", "layer_id", "block_quota", "num_warps_per_block", "route")
_DIRECT_CALL = ("src_indices", "dst_indices")

# Which one follows the spec's kind ("kernel" or "direct"); kv.copy with a kv.Fp8View: an Fp8Plan.
Plan = Union[KernelPlan, DirectPlan, Fp8Plan]  # Nvfp4Plan is an Fp8Plan


class _HandedOver(property):
    """A ``__call__`` that hands each call to the instance's attribute named as ``method``: the method itself,
    unless the instance holds a function of its own under that name (a prepared transfer's fast call). It shows
    ``method``'s annotations (``typing.get_type_hints``)."""

    def __init__(self, method: Callable[..., Any]) -> None:
        super().__init__(attrgetter(method.__name__))
        self.__wrapped__ = method
        self.__annotations__ = method.__annotations__


class Transfer:
    """One entry point with some of its arguments bound (validated once): what ``prepare`` returns, called
    as its docstring says. Results, errors and "nothing written on error" are the plain entry point's.
    """

    def __init__(self, spec: Spec, bound: dict[str, Any], stream: StreamLike | None = None,
                 check: bool = False) -> None:
        self.spec = spec
        # What it holds of its buffers: copies of lists, aliases of torch tensors (kvnumba.api.snapshot).
        table_names = frozenset(n for n in spec.buffers if spec.layout_of(n) is TBL)
        self._snapshot = Snapshot(bound, frozenset(spec.buffers), table_names)
        self.bound = self._snapshot.values
        self.stream = stream
        self.check = bool(check)
        params = spec.params
        self._free = tuple(n for n in params if n not in bound)
        self._positional = tuple(n for n in self._free if n not in spec.keyword_only)  # the rest: by keyword only
        bound_names = tuple(n for n in params if n in bound)
        self._bound_values = tuple(self.bound[n] for n in bound_names)  # the snapshot's (owned) values
        # Calls that leave out only trailing arguments with defaults get them appended.
        self._tails: dict[int, tuple[Any, ...]] = {}
        for n in range(len(self._positional) + 1):
            rest = self._free[n:]
            if all(r in spec.defaults for r in rest):
                self._tails[n] = tuple(spec.defaults[r] for r in rest)
        # Every argument's position in ``args + bound values``.
        position = {n: i for i, n in enumerate(self._free)}
        position.update({n: len(self._free) + i for i, n in enumerate(bound_names)})
        self._geometry = build.geometry_names(spec)
        self._arrays = len(spec.buffers)  # the buffers come first among the geometry arguments
        self._pick_geometry = itemgetter(*[position[n] for n in self._geometry])
        call_names = _KERNEL_CALL if spec.kind == "kernel" else _DIRECT_CALL
        self._pick_call = itemgetter(*[position[n] for n in call_names if n in position])
        self._cache = build.plan_cache(spec)
        self._plan: Plan | None = None
        if all(n in bound for n in self._geometry):
            geometry = self._pick_geometry((None,) * len(self._free) + self._bound_values)
            self._plan = self._build(geometry, False, stream)
            # A destination that turns read-only later is refused as the plain call refuses it: its plan
            # checked again. (Plans found per call go by the flags: kvnumba.plan.cache.)
            self._snapshot.watch_destinations(build.destinations(spec), lambda: self._build(geometry, True, stream))
        elif all(n in bound or n in spec.defaults for n in self._geometry):  # kv.copy without layers=: checked now
            values = tuple(self.bound[n] if n in bound else spec.defaults[n] for n in self._geometry)
            self._cache.get(values[:self._arrays], values[self._arrays:], lambda: self._build(values, False, stream))
        self._validate_bound_call_arguments()
        fast = self._fast_call()
        if fast is not None:
            self.__dict__["_call"] = fast  # shadows the method ``_call``: what ``__call__`` hands over

    def _fast_call(self) -> Callable[..., Any] | None:
        """For a prepared kernel transfer whose calls take exactly (indices[, layer_id], launch shape): its
        plan's fast call, in the call's signature (``plan.per_call``); else None (``_call`` takes its calls)."""
        spec, plan = self.spec, self._plan
        if not isinstance(plan, KernelPlan) or self.stream is not None or self.check:  # kernel entry points only
            return None
        if self._free != tuple(n for n in _KERNEL_CALL if n in spec.params):
            return None
        if plan.raw_tables:  # check=True must read raw tables again: _call does
            return None
        again = None
        if plan.tables:  # with checks on, the layer tables' contents are read again: the plan built again
            geometry = dict(zip(self._geometry, self._pick_geometry((None,) * len(self._free) + self._bound_values)))
            again = functools.partial(build.build, spec, geometry, True)
        fast = plan.fast_call(self._snapshot, again)
        if spec.per_layer:
            return fast
        if spec.keyword_only:  # kv.copy: its launch shape and route by keyword only, as in the plain call
            def by_keyword(src_indices: Any, dst_indices: Any, *, block_quota: Any = 2, num_warps_per_block: Any = 32,
                           route: Any = "auto", stream: StreamLike | None = None, check: bool = False) -> Any:
                return fast(src_indices, dst_indices, None, block_quota, num_warps_per_block, stream=stream,
                            check=check, route=route)
            return by_keyword

        def positional(src_indices: Any, dst_indices: Any, block_quota: Any = 2, num_warps_per_block: Any = 32, *,
                       stream: StreamLike | None = None, check: bool = False) -> Any:
            return fast(src_indices, dst_indices, None, block_quota, num_warps_per_block, stream=stream, check=check)
        return positional

    # --- binding ---------------------------------------------------------------------------------

    def _validate_bound_call_arguments(self) -> None:
        """Indices, ``layer_id`` and the launch shape given to ``prepare`` are checked there too."""
        b = self.bound
        if "src_indices" in b and "dst_indices" in b:
            validate.indices(b["src_indices"], b["dst_indices"])
        else:
            for name in ("src_indices", "dst_indices"):
                if name in b:
                    validate.index_info(name, b[name])
        if "block_quota" in b or "num_warps_per_block" in b:
            validate.launch_config(b.get("block_quota", 2), b.get("num_warps_per_block", 32))
        if "route" in b:
            routes.check_route(b["route"])
        if "layer_id" in b and self.spec.per_layer:
            if isinstance(self._plan, KernelPlan):  # per-layer: a kernel entry point's plan, if built
                self._plan.window_for(b["layer_id"])
            else:
                validate.integer("layer_id", b["layer_id"], minimum=0, maximum=validate.MAX_SIZE)

    def _complete(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """``args`` and ``kwargs`` as one tuple of the free arguments, in order, with defaults."""
        name = self.spec.name
        if len(args) > len(self._positional):
            raise TypeError(f"{name} transfer takes {len(self._positional)} positional arguments "
                            f"({', '.join(self._positional) or 'none'}) but {len(args)} were given")
        values = dict(zip(self._positional, args))
        for key, value in kwargs.items():
            if key not in self._free:
                if key in self.bound:
                    raise TypeError(f"{name} transfer: {key} was bound at prepare time")
                raise TypeError(f"{name} transfer got an unexpected keyword argument {key!r}")
            if key in values:
                raise TypeError(f"{name} transfer got multiple values for argument {key!r}")
            values[key] = value
        missing = [n for n in self._free if n not in values and n not in self.spec.defaults]
        if missing:
            raise TypeError(f"{name} transfer missing required argument{'s' if len(missing) > 1 else ''}: "
                            f"{', '.join(missing)}")
        return tuple(values[n] if n in values else self.spec.defaults[n] for n in self._free)

    def _build(self, geometry_values: tuple[Any, ...], strict: bool, stream: StreamLike | None = None) -> Plan:
        return build.build(self.spec, dict(zip(self._geometry, geometry_values)), strict, stream)

    def _plan_for_geometry(self, values: tuple[Any, ...], strict: bool, stream: StreamLike | None = None) -> Plan:
        """The plan for geometry ``values`` (buffers first, then sizes: the arguments' order); ``stream``: the
        call's (a plan is not built while it is being captured)."""
        plan = self._plan
        if plan is None:
            return build.find(self.spec, self._cache, values, strict, stream)
        if strict and plan.tables:  # checks on: the contents of the tables are read again
            return self._build(values, True, stream)
        return plan

    # --- calling ---------------------------------------------------------------------------------

    def _call(self, *args: Any, stream: StreamLike | None = None, check: bool = False, **kwargs: Any) -> None:
        """A call, its arguments completed, its plan found (``_plan_for_geometry``), then run."""
        if kwargs:
            args = self._complete(args, kwargs)
        else:
            tail = self._tails.get(len(args))
            if tail is None:
                args = self._complete(args, kwargs)
            elif tail:
                args += tail
        self._snapshot.verify()
        everything = args + self._bound_values
        strict = check or self.check or guard.ALWAYS_CHECK
        if stream is None:
            stream = self.stream
        plan = self._plan
        if plan is None or (strict and plan.tables):
            plan = self._plan_for_geometry(self._pick_geometry(everything), strict, stream)
        call = self._pick_call(everything)
        if self.spec.kind == "kernel":
            route = "auto"
            if self.spec.per_layer:
                src_indices, dst_indices, layer_id, block_quota, warps = call
            elif len(call) == 5:  # kv.copy: and its route
                src_indices, dst_indices, block_quota, warps, route = call
                layer_id = None
            else:
                src_indices, dst_indices, block_quota, warps = call
                layer_id = None
            plan.fast(src_indices, dst_indices, layer_id, block_quota, warps, stream=stream,  # type: ignore[union-attr]
                      check=strict, route=route)  # kind "kernel": a KernelPlan
        else:
            plan.run(call[0], call[1], stream, strict)

    # Python finds ``__call__`` on the type: this one hands each call to the instance's ``_call`` (the method
    # above, or the fast call ``__init__`` set), with no Python frame of its own.
    if TYPE_CHECKING:
        def __call__(self, *args: Any, stream: StreamLike | None = None, check: bool = False, **kwargs: Any) -> None:
            ...
    else:
        __call__ = _HandedOver(_call)

    @property
    def __signature__(self) -> inspect.Signature:
        params = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY if n in self.spec.keyword_only
                                    else inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                    default=self.spec.defaults.get(n, inspect.Parameter.empty))
                  for n in self._free]
        params += [inspect.Parameter("stream", inspect.Parameter.KEYWORD_ONLY, default=None),
                   inspect.Parameter("check", inspect.Parameter.KEYWORD_ONLY, default=False)]
        return inspect.Signature(params)

    def __repr__(self) -> str:
        bound = ", ".join(f"{n}={_short(v)}" for n, v in self.bound.items())
        return f"<Transfer {self.spec.name}({bound}) -> call{self.__signature__}>"


def _short(value: Any) -> str:
    """A few words for an argument in a repr: arrays by kind, device, dtype and shape."""
    if isinstance(value, (list, tuple)):
        return f"[{len(value)} arrays]" if value and not isinstance(value[0], (int, float)) else repr(value)
    shape = getattr(value, "shape", None)
    if not isinstance(shape, tuple):  # not an array (a cache view says what it is itself)
        return repr(value)
    device = getattr(value, "device", None)
    where = f" {device}" if device is not None and not isinstance(device, int) else ""
    return f"{type(value).__name__}{where} {getattr(value, 'dtype', '')} {tuple(shape)}".replace("  ", " ")


def prepare(entry_point: Callable[..., Any] | str, /, **bound: Any) -> Transfer:
    """Bind some arguments of a kvnumba entry point, validated once; return a callable ``Transfer``.

    Parameters
    ----------
    entry_point : function or str
        Any of kvnumba's 13 entry points (``kv.transfer_kv_per_layer_pf_lf``, ...) or its name.
    **bound
        Any of its arguments, by keyword (``stream=`` and ``check=`` become the calls' defaults).
        Each is validated and resolved here: buffers described, pinned memory checked, token limits
        computed, layer-table extents read, the kernel chosen and loaded on the buffers' GPU and its
        parameter block filled.

    Returns
    -------
    Transfer
        Call it with the remaining arguments, positionally in the entry point's order (with the
        bound ones removed) or by keyword, plus ``stream=`` and ``check=``. It checks only those,
        then launches. It keeps its bound buffers alive; its ``repr`` says what is bound.

    Raises
    ------
    TypeError
        For an unknown entry point or keyword, or a bound argument of the wrong type.
    ValueError
        For a bound argument with a bad value (named in the message).

    Examples
    --------
    >>> loads = [kv.prepare(kv.transfer_kv_per_layer_pf_lf, src_k=hk, dst_k=dk[l], src_v=hv, dst_v=dv[l],
    ...                     item_size=item, src_layout_dim=L * item) for l in range(L)]  # doctest: +SKIP
    >>> for l in range(L):
    ...     loads[l](host_idx, dev_idx, l)                                              # doctest: +SKIP
    """
    name = entry_point if isinstance(entry_point, str) else getattr(entry_point, "__name__", None)
    spec = SPECS.get(name) if isinstance(name, str) else None
    if spec is None:
        raise TypeError(f"entry_point must be one of kvnumba's entry points (e.g. kv.transfer_kv_per_layer_pf_lf), "
                        f"got {entry_point!r}")
    stream = bound.pop("stream", None)
    check = bound.pop("check", False)
    unknown = [k for k in bound if k not in spec.params]
    if unknown:
        raise TypeError(f"{spec.name}() got an unexpected keyword argument {unknown[0]!r} "
                        f"(its arguments: {', '.join(spec.params)})")
    if not isinstance(check, bool):
        raise TypeError(f"check must be True or False, got {type(check).__name__}")
    if stream is not None:
        stream_handle(stream)  # a TypeError for something that is not a stream, here rather than at a call
    return Transfer(spec, bound, stream, check)


def plain_caller(name: str) -> Callable[..., Any]:
    """The per-call function of plain entry point ``name``, on the plan cache of ``plain(name)`` (found by
    value, else built and every argument checked): ``plan.build.caller``'s, or for a copy-engine entry point
    ``plan.build.direct_caller``'s (their docstrings give its arguments)."""
    spec = SPECS[name]
    return (build.caller if spec.kind == "kernel" else build.direct_caller)(spec, plain(name)._cache)


_PLAIN: dict[str, Transfer] = {}


def plain(name: str) -> Transfer:
    """The nothing-bound ``Transfer`` behind plain entry point ``name`` (shares its plan cache)."""
    transfer = _PLAIN.get(name)
    if transfer is None:
        transfer = _PLAIN.setdefault(name, Transfer(SPECS[name], {}))
    return transfer


def clear_plan_caches() -> None:
    """Forget every cached plan, FP8 copies' included, and what plans are built from (settings read at plan
    build, such as ``KVNUMBA_LOAD_PATH``, apply to the next call; ``kvnumba.plan.cache.forget_plans``)."""
    forget_plans()
