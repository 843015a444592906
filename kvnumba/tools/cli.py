"""The ``kvnumba`` command (also ``python -m kvnumba``)."""
import argparse
import json
import os
import sys


def _demo_shape(args, base):
    """The demo's shape from the options given (others from ``base``); ``args.error`` (usage, exit 2) for
    options that do not fit together."""
    from .demo import DemoShape

    page_size = base.page_size if args.page_size is None else args.page_size
    tokens = base.tokens if args.tokens is None else args.tokens
    pool = max(base.pool, 2 * tokens) if args.pool is None else args.pool
    given = {"--tokens": args.tokens is not None, "--page-size": args.page_size is not None}
    shown = {name: "" if given[name] else " (the default)" for name in given}
    if tokens % page_size:
        args.error(f"--tokens {tokens}{shown['--tokens']} must be a multiple of --page-size "
                   f"{page_size}{shown['--page-size']}: whole pages are moved")
    if pool < tokens:
        args.error(f"--pool {pool} is smaller than --tokens {tokens}{shown['--tokens']}: the pool must hold "
                   f"every token moved")
    return DemoShape(
        layers=base.layers if args.layers is None else args.layers,
        item_size=base.item_size if args.item_size is None else args.item_size,
        page_size=page_size, tokens=tokens, pool=pool,
        block_quota=base.block_quota, num_warps_per_block=base.num_warps_per_block)


def _demo(args):
    from . import demo

    base = demo.SIMULATOR_SHAPE if demo.SIMULATOR else demo.DemoShape()
    shape = _demo_shape(args, base)
    try:
        demo.run(shape)
    except KeyboardInterrupt:
        print("kvnumba demo: error: interrupted", file=sys.stderr)
        return 130
    except AssertionError as err:  # a byte differs; np.testing's message spans lines
        print(f"kvnumba demo: error: verification failed: {_squeezed(str(err))}", file=sys.stderr)
        return 1
    except Exception as err:  # noqa: BLE001 - one line, never a traceback
        print(f"kvnumba demo: error: {_one_line(err)}", file=sys.stderr)
        return 1
    return 0


def _squeezed(text):
    return " ".join(text.split())


def _one_line(err):
    """An exception as one line of text: an OSError as ``file: reason``; unexpected kinds with their name."""
    if isinstance(err, OSError) and err.strerror:
        text = f"{err.filename}: {err.strerror}" if err.filename else err.strerror
    elif isinstance(err, (ValueError, TypeError, OSError, ImportError)):
        text = str(err)
    else:
        text = f"{type(err).__name__}: {err}"
    return _squeezed(text)


def _convert(args):
    from .convert_files import Interrupted, convert_file

    try:
        shapes = convert_file(args.input, args.output, args.src, args.dst, args.page_size,
                              chunk_bytes=args.chunk_bytes, progress=None if args.quiet else sys.stderr)
    except Interrupted as err:
        print(f"kvnumba convert: error: {err}; the partial output was removed", file=sys.stderr)
        return 128 + err.signum  # the shell's convention for "ended by this signal"
    except KeyboardInterrupt:
        print("kvnumba convert: error: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - one line, never a traceback
        print(f"kvnumba convert: error: {_one_line(err)}", file=sys.stderr)
        return 1
    for name, shape in shapes.items():
        print(f"{args.output}{f'[{name}]' if name else ''}: {args.dst} {shape}")
    return 0


def _info(args):
    from .info import facts, report

    found = facts()
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    for key, value in report(found):
        print(f"{key + ':':<22} {value}")
    return 0


def _layout_name(value):
    from ..convert import layout, layout_name

    try:
        return layout_name(layout(value))
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("layout: ")) from None


def _positive_int(text):
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _item_bytes(text):
    """argparse type: a positive multiple of 8 (the kernels move 8-byte words)."""
    value = _positive_int(text)
    if value % 8:
        raise argparse.ArgumentTypeError(f"expected a positive multiple of 8 (the kernels move 8-byte words), "
                                         f"got {value}")
    return value


def build_parser():
    parser = argparse.ArgumentParser(prog="kvnumba", description="KV-cache transfers with Numba-CUDA")
    commands = parser.add_subparsers(dest="command", required=True)
    d = commands.add_parser("demo", help="HiCache-style backup and per-layer load back, verified, with GB/s")
    d.add_argument("--layers", type=_positive_int)
    d.add_argument("--tokens", type=_positive_int, help="tokens moved each way (a multiple of --page-size)")
    d.add_argument("--item-size", type=_item_bytes, help="bytes per token per layer for K (and for V); a multiple of 8")
    d.add_argument("--page-size", type=_positive_int)
    d.add_argument("--pool", type=_positive_int, help="token slots on each side (at least --tokens)")
    d.set_defaults(func=_demo, needs_kernels=True, error=d.error)

    c = commands.add_parser(
        "convert",
        help="convert a .npy file, or every array of a .npz archive or a .safetensors file, between cache layouts",
        description="Convert one K (or V, or MLA) tensor of a whole cache between layouts: layer_first (L, T, *item), "
                    "page_first (T, L, *item), page_first_direct (T/P, L, P, *item), page_head (T/P, H, P, L, D). "
                    "Works in chunks with NumPy; the output appears complete or not at all. A .safetensors file keeps "
                    "its metadata, and its bf16/fp8 tensors their dtype (needs: pip install 'kvnumba[safetensors]').")
    c.add_argument("input", metavar="IN", help="input .npy file, .npz archive or .safetensors file")
    c.add_argument("output", metavar="OUT", help="output file (same kind as IN)")
    c.add_argument("--from", dest="src", required=True, type=_layout_name, metavar="LAYOUT",
                   help="layout of IN: layer_first, page_first, page_first_direct, page_head (or lf, pf, pfd, ph), "
                        "or module:Class naming a kvnumba.CacheView subclass (a layout of your own)")
    c.add_argument("--to", dest="dst", required=True, type=_layout_name, metavar="LAYOUT", help="layout of OUT")
    c.add_argument("--page-size", type=_positive_int,
                   help="tokens per page (needed for page_first_direct and page_head)")
    c.add_argument("--chunk-bytes", type=_positive_int, metavar="N",
                   help="bytes per chunk (default: $KVNUMBA_CHUNK_BYTES, else 64 MiB)")
    c.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    c.set_defaults(func=_convert)

    i = commands.add_parser("info", help="versions, the GPU (or simulator), and whether the batched-copy path is there")
    i.add_argument("--json", action="store_true", help="the same facts as one JSON object")
    i.set_defaults(func=_info)
    return parser


def _rerun_on_simulator_without_gpu(argv):
    """Without a GPU, run the command again on Numba's CUDA simulator (it must be chosen before import)."""
    from ..driver.target import SIMULATOR, gpu_available

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
