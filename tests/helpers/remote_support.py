"""Helpers of the ``kvnumba.remote`` tests: a second process with its own NIXL agent (``Peer``, driving
``tests/helpers/remote_peer.py`` over pipes), indices with runs and scattered tokens, and the expected bytes
from ``kvnumba.reference``."""
import base64
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from kvnumba import reference
from kvnumba.driver.target import SIMULATOR
from tests.helpers.view_cases import make_view, view_bytes

ROOT = Path(__file__).resolve().parents[2]  # the checkout: tests.helpers imports from there
SHAPE = dict(L=3, T=32, P=4, H=2, D=4)  # items of 16 bytes (2 heads of 8), pages of 4 tokens
PLACE = None if SIMULATOR else ("device", "numba")  # this process's views: GPU memory on a GPU
LAUNCH = dict(block_quota=1, num_warps_per_block=2)  # small simulated grids for the staged route's kv.copy
# How a peer's exported view ends (Peer.end): each makes its exports stale. (Dropping the view does not:
# the agent holds an exported view until unexport or close.)
ENDINGS = ("unexported", "the agent closed", "the process killed")


def indices(seed, count=12, tokens=SHAPE["T"]):
    """``(src, dst)`` int64 token indices: a run of consecutive tokens on both sides, then scattered
    ones (distinct destinations)."""
    rng = np.random.default_rng(seed)
    run = 5
    src_start, dst_start = rng.integers(0, tokens - run, 2)
    src = list(range(src_start, src_start + run))
    dst = list(range(dst_start, dst_start + run))
    rest_src = [t for t in rng.permutation(tokens) if t not in src][:count - run]
    rest_dst = [t for t in rng.permutation(tokens) if t not in dst][:count - run]
    return np.array(src + rest_src, np.int64), np.array(dst + rest_dst, np.int64)


def views(layout, seed, poison, mla=False, place=None, shape=SHAPE):
    """``(numpy view, placed view)`` of ``layout`` over data from ``seed`` (``view_cases.make_view``)."""
    return make_view(layout, shape["L"], shape["T"], shape["P"], shape["H"], shape["D"],
                     np.random.default_rng(seed), poison, mla, place)


def read_only(view, how):
    """``view`` over read-only memory: its NumPy buffers flagged read-only (``"flag"``, the same view), or a
    view of the same class over arrays on immutable ``bytes`` holding the same bytes (``"bytes"``)."""
    def freeze(array):
        if how == "flag":
            array.setflags(write=False)
            return array
        return np.frombuffer(array.tobytes(), array.dtype).reshape(array.shape)

    def each(buffers):
        return [freeze(b) for b in buffers] if isinstance(buffers, (list, tuple)) else freeze(buffers)

    k = each(view.k)
    v = None if view.v is None or view.v is view.k else each(view.v)
    if how == "flag":
        return view
    return view.like(k) if v is None else view.like(k, v)


def expected(src_layout, src_seed, dst_layout, dst_seed, src_idx, dst_idx, layers=None, mla=False):
    """The destination's bytes after the copy, by ``kvnumba.reference.copy`` on fresh NumPy views."""
    src, _ = views(src_layout, src_seed, False, mla)
    dst, _ = views(dst_layout, dst_seed, True, mla)
    reference.copy(src, dst, src_idx, dst_idx, layers)
    return view_bytes(dst)


def same_bytes(got, want):
    return len(got) == len(want) and all(np.array_equal(g, w) for g, w in zip(got, want))


def _b64(data):
    return base64.b64encode(data).decode()


class Peer:
    """Another process holding a NIXL agent named ``name`` and cache views made there
    (``tests/helpers/remote_peer.py``). ``request(cmd, **args)`` sends one command and returns its answer;
    a failure there raises here with the peer's traceback and log."""

    def __init__(self, name, gpu=False):
        self.name = name
        self.log = tempfile.TemporaryFile()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        peer = ROOT / "tests" / "helpers" / "remote_peer.py"
        self.process = subprocess.Popen([sys.executable, str(peer), name, "gpu" if gpu else "host"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env,
                                        text=True, bufsize=1)
        try:
            self.request("ping")
        except BaseException:  # a peer that could not start (NIXL missing there): its pipes and log closed now,
            self.close()  # not left to the garbage collector (a ResourceWarning then fails some later test)
            raise

    def request(self, cmd, **args):
        self.process.stdin.write(json.dumps({"cmd": cmd, **args}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"peer {self.name!r} ended (exit {self.process.wait()}):\n{self.stderr()}")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"peer {self.name!r} failed: {answer['error']}\n{self.stderr()}")
        return answer

    def export(self, key, layout, seed, poison=False, mla=False, read_only=None, writable=None):
        """Make a view there (over read-only memory: ``read_only``, see ``read_only``) and return its export
        (bytes; ``writable``: ``Agent.export``'s)."""
        self.request("make", key=key, layout=layout, seed=seed, poison=poison, mla=mla, read_only=read_only)
        return base64.b64decode(self.request("export", key=key, writable=writable)["exported"])

    def view_bytes(self, key):
        return [np.frombuffer(base64.b64decode(b), np.uint8) for b in self.request("bytes", key=key)["bytes"]]

    def stderr(self):
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-4000:]

    def end(self, how, key="pool"):
        """End view ``key``'s export one of the ``ENDINGS`` ways: unexport it, close the peer's agent, or
        kill the peer's process."""
        if how == "unexported":
            self.request("unexport", key=key)
        elif how == "the agent closed":
            self.request("close")
        else:
            self.kill()

    def kill(self):
        self.process.kill()
        self.process.wait(30)

    def close(self):
        if self.process.poll() is None:
            try:
                self.request("exit")
            except (RuntimeError, OSError, ValueError):
                pass
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process.stdin.close()
        self.process.stdout.close()
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
