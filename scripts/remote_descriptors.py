"""The NIXL descriptors kvnumba.remote plans for one request, in every pair of built-in layouts, next to
what SGLang and vLLM post for it: the table of scripts/RESULTS.md ("Beyond one process").

    python scripts/remote_descriptors.py                 # 32 layers, 8192-token request, pages of 64, 2 KiB items
    python scripts/remote_descriptors.py --quick         # a small request (CI runs it)
    python scripts/remote_descriptors.py --measure       # NIXL's host cost per descriptor, two agents here

Pure planning (``kvnumba.remote.plan_copy``): no NIXL, no transfer, no GPU. The caches are views over
``np.zeros`` arrays, which the operating system backs only when written, so a pool of many GiB costs
nothing here. The remote side is the source (a decode instance READs from a prefill's cache); the
staged route keeps the source's runs and relayouts on the destination with ``kv.copy``.

Two placements of the request's 8192 tokens: *contiguous* (128 consecutive pages on both sides) and
*scattered* (128 pages picked at random from each side's pool, tokens in page order).
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import kvnumba as kv  # noqa: E402
from kvnumba.remote import plan_copy  # noqa: E402

LAYOUTS = ["LayerFirst", "LayerFirst (list)", "PageFirst", "PageFirstDirect", "PageHead", "VllmFlashAttn",
           "FlashInfer NHD", "FlashInfer HND"]


def view(name, L, T, P, H, D):
    """A view of layout ``name`` over zeroed uint16 arrays (bf16 stand-ins): ``T`` token slots, ``L`` layers."""
    z = lambda *shape: np.zeros(shape, np.uint16)  # noqa: E731
    if name == "LayerFirst":
        return kv.LayerFirst(z(L, T, H, D), z(L, T, H, D))
    if name == "LayerFirst (list)":
        return kv.LayerFirst([z(T, H, D) for _ in range(L)], [z(T, H, D) for _ in range(L)])
    if name == "PageFirst":
        return kv.PageFirst(z(T, L, H, D), z(T, L, H, D))
    if name == "PageFirstDirect":
        return kv.PageFirstDirect(z(T // P, L, P, H, D), z(T // P, L, P, H, D))
    if name == "PageHead":
        return kv.PageHead(z(T // P, H, P, L, D), z(T // P, H, P, L, D))
    if name == "VllmFlashAttn":
        return kv.VllmFlashAttn([z(2, T // P, P, H, D) for _ in range(L)])
    if name == "FlashInfer NHD":
        return kv.VllmFlashInfer([z(T // P, 2, P, H, D) for _ in range(L)], layout="NHD")
    if name == "FlashInfer HND":
        return kv.VllmFlashInfer([z(T // P, 2, H, P, D) for _ in range(L)], layout="HND")
    raise ValueError(name)


def placements(tokens, pool, page, seed=0):
    """``{name: (src tokens, dst tokens)}`` for a request of ``tokens`` in pools of ``pool`` slots."""
    pages = tokens // page
    rng = np.random.default_rng(seed)
    within = np.arange(page)

    def spread(chosen):
        return (chosen[:, None] * page + within[None, :]).ravel().astype(np.int64)

    return {
        "contiguous": (np.arange(pool // 2, pool // 2 + tokens, dtype=np.int64), np.arange(tokens, dtype=np.int64)),
        "scattered": (spread(rng.permutation(pool // page)[:pages]), spread(rng.permutation(pool // page)[:pages])),
    }


def size(n):
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def per(plan):
    return size(plan.smallest) if plan.smallest == plan.largest else f"{size(plan.smallest)}-{size(plan.largest)}"


def measure(total=64 * 2**20, counts=(1, 64, 1024, 8192, 32768), repeats=5):
    """Two NIXL agents in this process (UCX, host memory): the same ``total`` bytes READ as ``count``
    equal descriptors; median microseconds of building the lists and the request (``get_xfer_descs`` +
    ``initialize_xfer``) and of posting and waiting (``transfer`` to done), per transfer and per descriptor."""
    from kvnumba.remote import _nixl

    nixl = _nixl.api()
    a = nixl.nixl_agent("measure-a", nixl.nixl_agent_config(backends=["UCX"]))
    b = nixl.nixl_agent("measure-b", nixl.nixl_agent_config(backends=["UCX"]))
    src = np.ones(total, np.uint8)
    dst = np.zeros(total, np.uint8)
    a.register_memory([(src.ctypes.data, total, 0, "")], "DRAM")
    b.register_memory([(dst.ctypes.data, total, 0, "")], "DRAM")
    b.add_remote_agent(a.get_agent_metadata())
    print(f"NIXL {_nixl.name()}, UCX, host memory, two agents in one process; {size(total)} per transfer\n")
    print("| descriptors | bytes each | prepare us | transfer us | prepare us per descriptor | transfer us per descriptor | GB/s |")
    print("|---|---|---|---|---|---|---|")
    for count in counts:
        length = total // count
        offsets = np.arange(count, dtype=np.uint64) * length
        prep, move = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            local = b.get_xfer_descs(np.column_stack((dst.ctypes.data + offsets, np.full(count, length, np.uint64),
                                                      np.zeros(count, np.uint64))).astype(np.uint64), "DRAM")
            remote = b.get_xfer_descs(np.column_stack((src.ctypes.data + offsets, np.full(count, length, np.uint64),
                                                       np.zeros(count, np.uint64))).astype(np.uint64), "DRAM")
            handle = b.initialize_xfer("READ", local, remote, "measure-a")
            t1 = time.perf_counter()
            state = b.transfer(handle)
            while state == "PROC":
                state = b.check_xfer_state(handle)
            t2 = time.perf_counter()
            if state != "DONE":
                raise RuntimeError(f"transfer ended {state}")
            handle.release()
            prep.append(t1 - t0)
            move.append(t2 - t1)
        p, m = np.median(prep) * 1e6, np.median(move) * 1e6
        print(f"| {count} | {size(length)} | {p:.0f} | {m:.0f} | {p / count:.2f} | {m / count:.2f} | "
              f"{total / m / 1e3:.2f} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=8192, help="tokens of the request")
    parser.add_argument("--page", type=int, default=64)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128, help="bf16 elements per head")
    parser.add_argument("--quick", action="store_true", help="4 layers, 256 tokens, pages of 16, 2 heads of 16")
    parser.add_argument("--measure", action="store_true", help="time NIXL per descriptor here instead")
    args = parser.parse_args(argv)
    if args.measure:
        measure()
        return
    if args.quick:
        args.layers, args.tokens, args.page, args.heads, args.head_dim = 4, 256, 16, 2, 16
    L, N, P, H, D = args.layers, args.tokens, args.page, args.heads, args.head_dim
    pool = 2 * N
    item = H * D * 2
    pages = N // P
    print(f"# {L} layers, a {N}-token request ({pages} pages of {P}), items of {H} heads x {D} bf16 = {size(item)}, "
          f"K and V: {size(N * L * 2 * item)}; pools of {pool} token slots\n")
    print("What SGLang and vLLM post for it (one descriptor per range; their own layouts on both sides):\n")
    print("| poster | contiguous pages | scattered pages |")
    print("|---|---|---|")
    print(f"| vLLM NixlConnector: one per (layer, K/V, block) | {L * 2 * pages} x {size(P * item)} | "
          f"{L * 2 * pages} x {size(P * item)} |")
    print(f"| SGLang NIXL, same TP: one per (layer, K/V, run of pages consecutive on both sides) | {L * 2} x "
          f"{size(N * item)} | {L * 2 * pages} x {size(P * item)} |")
    print(f"| SGLang NIXL, another TP (`send_kvcache_slice`): one per (layer, K/V, token) | {L * 2 * N} x "
          f"{size(item)} (all heads; fewer bytes per head slice) | same |")
    print(f"| per page per layer (the yardstick) | {L * 2 * pages} | {L * 2 * pages} |\n")
    views = {name: view(name, L, pool, P, H, D) for name in LAYOUTS}
    cases = placements(N, pool, P)
    print("What kvnumba.remote plans, `route=auto` (the descriptors, their bytes, the route), and what the direct "
          "route alone would post (both sides merged). Ratio: per page per layer / kvnumba.\n")
    print("| source (remote) | destination (local) | contiguous: kvnumba | direct | ratio | scattered: kvnumba | direct | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    started = time.perf_counter()
    for s in LAYOUTS:
        for d in LAYOUTS:
            cells = []
            for placement, (src, dst) in cases.items():
                plan = plan_copy(views[s], views[d], src, dst, remote="src")
                cells += [f"{plan.descriptors} x {per(plan)} ({plan.route})", str(plan.direct),
                          f"{L * 2 * pages / plan.descriptors:.4g}"]
            print(f"| {s} | {d} | " + " | ".join(cells) + " |")
    print(f"\n(planned in {time.perf_counter() - started:.0f} s on this machine)")


if __name__ == "__main__":
    main()
