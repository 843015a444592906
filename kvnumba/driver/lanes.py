"""SM lanes: a GPU's SMs split in two with CUDA green contexts, a set for transfers and the rest for compute.

Why: while a model computes, its kernels hold every SM, and a transfer kernel's blocks run only in the gaps
between them. Work on a green context's stream runs only on that context's SMs, so transfers launched on
one set keep their speed whatever runs on the other; the compute pays with fewer SMs (measure your model's
price before you adopt them). Both contexts share the device's memory with its primary context, so buffers
made by torch, CuPy or Numba work on both streams.
"""
import threading
import weakref

from ..integers import integer
from .bindings import check, cu
from .devices import device_count
from .target import SIMULATOR

# More SMs than any GPU has: on the simulator, with no GPU to ask, a count past it is a typo.
MOST_SMS = 1024
_MOST_HANDLE = 2**64 - 1  # a CUstream is a pointer


class LaneStream:
    """One lane's stream. Pass it as ``stream=`` to kvnumba, or wrap its ``handle`` for a framework:
    ``torch.cuda.ExternalStream(lane.handle)``, ``cupy.cuda.ExternalStream(lane.handle)``,
    ``numba.cuda.external_stream(lane.handle)``; it also speaks the ``__cuda_stream__`` protocol.

    ``handle`` (an int from 0 to 2**64 - 1), ``sms`` (None, or 1 to 1024), ``name`` (a str) and ``device``
    (the GPU whose SMs it runs on, an ordinal >= 0) are checked when it is made (``TypeError`` / ``ValueError``
    naming the field) and cannot be changed afterwards. A call whose buffers are on another GPU than
    ``device`` is refused (``DeviceMismatchError``)."""

    __slots__ = ("handle", "sms", "name", "device")
    handle: int
    sms: int | None
    name: str
    device: int

    def __init__(self, handle: int, sms: int | None, name: str, device: int = 0) -> None:
        # checked and frozen, so that kv.copy(stream=lane) never launches on a bad handle
        handle = integer("handle", handle, minimum=0, maximum=_MOST_HANDLE)
        if sms is not None:
            sms = integer("sms", sms, minimum=1, maximum=MOST_SMS)
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        device = integer("device", device, minimum=0)
        for slot, value in (("handle", handle), ("sms", sms), ("name", name), ("device", device)):
            object.__setattr__(self, slot, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"LaneStream is read-only: {name} cannot be set")

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)

    def __int__(self) -> int:
        return self.handle

    def __repr__(self) -> str:
        return f"<LaneStream {self.name}: {self.sms} SMs, handle 0x{self.handle:x}, cuda:{self.device}>"


def device_ordinal(device: object) -> int:
    """``device`` as the ordinal of a GPU present (``TypeError`` / ``ValueError`` naming it otherwise)."""
    device = integer("device", device, minimum=0)
    count = device_count()
    if device >= count:
        raise ValueError(f"device must be < {count} (the number of GPUs{' simulated' if SIMULATOR else ''}), "
                         f"got {device}")
    return device


def sm_count(device: int = 0) -> int:
    """The number of SMs of GPU ``device`` (the simulator's stand-in GPU has 1).

    Raises
    ------
    TypeError, ValueError
        ``device`` is not an integer, or not the ordinal of a GPU present.
    """
    device = device_ordinal(device)
    if SIMULATOR:
        return 1
    from .devices import attribute, context

    context(device)  # CUDA initialised, as kvnumba's other calls find it
    return attribute(device, "MULTIPROCESSOR_COUNT")


class SmLanes:
    """A GPU split into a transfer lane and a compute lane (green contexts: see the module docstring). On the
    simulator both lanes are stand-in streams (handle 0), so code written for lanes runs unchanged.

    Parameters
    ----------
    transfer_sms : int
        SMs to set aside for transfers: at least 1, leaving at least one for compute (at most 1024 on
        the simulator). The driver rounds it up to its granularity (8 on Hopper); ``transfer_sms`` on
        the object is the count it gave. NumPy integers are accepted.
    device : int
        The GPU (default 0): an ordinal of a GPU present.

    Attributes
    ----------
    transfer, compute : LaneStream
        A non-blocking stream on each set of SMs.
    transfer_sms, compute_sms : int
        The SMs each set holds (None for ``compute_sms`` on the simulator).
    simulated : bool
        True on the simulator, where both streams are stand-ins.

    Raises
    ------
    TypeError, ValueError
        ``transfer_sms`` or ``device`` is not an integer, or out of range (the error names which).

    ``close()`` (or leaving a ``with`` block) destroys the streams and green contexts; wait for their work
    first. A lanes object that is garbage collected is closed then.

    Example
    -------
    >>> lanes = kv.SmLanes(8)                                            # doctest: +SKIP
    >>> compute = torch.cuda.ExternalStream(lanes.compute.handle)        # the model computes here
    >>> kv.transfer_kv_per_layer_pf_lf(..., block_quota=lanes.transfer_sms, stream=lanes.transfer)  # doctest: +SKIP
    """

    def __init__(self, transfer_sms: int, *, device: int = 0) -> None:
        transfer_sms = integer("transfer_sms", transfer_sms, minimum=1, maximum=MOST_SMS)
        device = device_ordinal(device)
        self.device = device
        self.simulated = SIMULATOR
        if SIMULATOR:
            self.transfer_sms, self.compute_sms = transfer_sms, None
            self.transfer, self.compute = (LaneStream(0, transfer_sms, "transfer", device),
                                           LaneStream(0, None, "compute", device))
            self._closer = weakref.finalize(self, _destroy, [], [])
            return
        total = sm_count(device)
        if not 1 <= transfer_sms < total:
            raise ValueError(f"transfer_sms must be between 1 and {total - 1} (cuda:{device} has {total} SMs and "
                             f"compute needs some), got {transfer_sms}")
        contexts, streams, counts = _split(device, transfer_sms)
        self._closer = weakref.finalize(self, _destroy, contexts, streams)
        self.transfer_sms, self.compute_sms = counts
        self.transfer = LaneStream(streams[0], counts[0], "transfer", device)
        self.compute = LaneStream(streams[1], counts[1], "compute", device)

    def close(self) -> None:
        """Destroy the two streams and green contexts (idempotent). Work still queued on them is the
        caller's to wait for first."""
        self._closer()

    @property
    def closed(self) -> bool:
        return not self._closer.alive

    def __enter__(self) -> "SmLanes":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = "simulated" if self.simulated else f"cuda:{self.device}"
        return f"<SmLanes {where}: transfer {self.transfer_sms} SMs, compute {self.compute_sms} SMs>"


_lock = threading.Lock()


def _split(device, transfer_sms):
    """``([green contexts], [stream handles], (transfer SMs, compute SMs))``: the device's SMs
    (``cuDeviceGetDevResource``) split into a group of at least ``transfer_sms`` and the rest
    (``cuDevSmResourceSplitByCount``), a green context and a non-blocking stream on each."""
    from .devices import context

    context(device)  # the primary context, active: green contexts retain it (cheaper than a new one)
    with _lock:
        dev = check(cu.cuDeviceGet(device), "cuDeviceGet")
        everything = check(cu.cuDeviceGetDevResource(dev, cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM),
                           "cuDeviceGetDevResource")
        groups, _, rest = check(cu.cuDevSmResourceSplitByCount(1, everything, 0, transfer_sms),
                                "cuDevSmResourceSplitByCount")
        contexts, streams = [], []
        try:
            for part in (groups[0], rest):
                desc = check(cu.cuDevResourceGenerateDesc([part], 1), "cuDevResourceGenerateDesc")
                green = check(cu.cuGreenCtxCreate(desc, dev, cu.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM),
                              "cuGreenCtxCreate")
                contexts.append(green)
                stream = check(cu.cuGreenCtxStreamCreate(green, cu.CUstream_flags.CU_STREAM_NON_BLOCKING, 0),
                               "cuGreenCtxStreamCreate")
                streams.append(int(stream))
        except BaseException:
            _destroy(contexts, streams)
            raise
    return contexts, streams, (int(groups[0].sm.smCount), int(rest.sm.smCount))


def _destroy(contexts, streams):
    for handle in streams:
        cu.cuStreamDestroy(cu.CUstream(handle))
    for green in contexts:
        cu.cuGreenCtxDestroy(green)
