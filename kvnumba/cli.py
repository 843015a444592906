"""The ``kvnumba`` command (also ``python -m kvnumba``)."""
import argparse
import os
import sys


def _demo(args):
    from . import demo

    shape = None
    if any(v is not None for v in (args.layers, args.tokens, args.item_size, args.page_size, args.pool)):
        base = demo.SIMULATOR_SHAPE if demo.SIMULATOR else demo.DemoShape()
        shape = demo.DemoShape(
            layers=args.layers or base.layers,
            item_size=args.item_size or base.item_size,
            page_size=args.page_size or base.page_size,
            tokens=args.tokens or base.tokens,
            pool=args.pool or max(base.pool, 2 * (args.tokens or base.tokens)),
            block_quota=base.block_quota,
            num_warps_per_block=base.num_warps_per_block,
        )
    demo.run(shape)
    return 0


def build_parser():
    parser = argparse.ArgumentParser(prog="kvnumba", description="KV-cache transfers with Numba-CUDA")
    commands = parser.add_subparsers(dest="command", required=True)
    d = commands.add_parser("demo", help="HiCache-style backup and per-layer load back, verified, with GB/s")
    d.add_argument("--layers", type=int)
    d.add_argument("--tokens", type=int, help="tokens moved each way (a multiple of --page-size)")
    d.add_argument("--item-size", type=int, help="bytes per token per layer for K (and for V)")
    d.add_argument("--page-size", type=int)
    d.add_argument("--pool", type=int, help="token slots on each side")
    d.set_defaults(func=_demo, needs_kernels=True)
    return parser


def _rerun_on_simulator_without_gpu(argv):
    """Without a GPU, run the command again on Numba's CUDA simulator (it must be chosen before import)."""
    from ._target import SIMULATOR, gpu_available

    if SIMULATOR or gpu_available():
        return
    print("kvnumba: no CUDA GPU found; running on Numba's CUDA simulator", file=sys.stderr)
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    os.execve(sys.executable, [sys.executable, "-m", "kvnumba", *argv], env)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    if getattr(args, "needs_kernels", False):
        _rerun_on_simulator_without_gpu(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
