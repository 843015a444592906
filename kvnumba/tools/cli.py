"""The ``kvnumba`` command (also ``python -m kvnumba``). Every failure is one line on stderr,
``kvnumba <command>: error: ...``, with exit code 2 (bad command line or setting), 1 (the command failed) or
128 + the signal's number (docs/guides/command-line.md).
"""
import argparse
import dataclasses
import functools
import json
import os
import sys
import warnings

from .. import __version__


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors as one line (no usage block): the problem, and where the options are listed."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


def _fail(command, message, code):
    print(f"kvnumba {command}: error: {message}", file=sys.stderr)
    return code


def _squeezed(text):
    return " ".join(text.split())


def _one_line(err):
    """An exception as one line: an OSError as ``file: reason``; unexpected kinds with their name."""
    if isinstance(err, OSError) and err.strerror:
        text = f"{err.filename}: {err.strerror}" if err.filename else err.strerror
    elif isinstance(err, (ValueError, TypeError, OSError, ImportError, RuntimeError)) and str(err):
        text = str(err)
    else:
        text = f"{type(err).__name__}: {err}"
    return _squeezed(text)


def _setup_problem():
    """``(message, exit code)`` when kvnumba cannot run here: a bad setting (2), or a refusal such as
    ``KVNUMBA_REQUIRE_GPU=1`` without a GPU (1); None when all is well."""
    from .. import config
    from ..driver import target

    bad = config.problems()
    if bad:
        return "; ".join(f"{message}: fix or unset it" for message in bad.values()), 2
    if target.REFUSAL is not None:
        return str(target.REFUSAL), 1
    return None


# --- demo ---------------------------------------------------------------------------------------------------

def _demo_shape(args, base):
    """The demo's shape from the options given (others from ``base``); ``args.error`` (exit 2) for
    options that do not fit together."""
    given = {name: getattr(args, name) for name in ("layers", "item_size", "page_size", "tokens", "pool")}
    shape = dataclasses.replace(base, **{name: value for name, value in given.items() if value is not None})
    if args.pool is None:
        shape.pool = max(base.pool, 2 * shape.tokens)
    tokens = f"--tokens {shape.tokens}{'' if args.tokens is not None else ' (the default)'}"
    if shape.tokens % shape.page_size:
        args.error(f"{tokens} must be a multiple of --page-size "
                   f"{shape.page_size}{'' if args.page_size is not None else ' (the default)'}: whole pages are moved")
    if shape.pool < shape.tokens:
        args.error(f"--pool {shape.pool} is smaller than {tokens}: the pool must hold every token moved")
    return shape


def _demo(args):
    from ..driver import target
    from . import demo

    base = demo.SIMULATOR_SHAPE if demo.SIMULATOR else demo.DemoShape()
    shape = _demo_shape(args, base)
    try:
        with warnings.catch_warnings():
            if target.CHOICE.automatic:  # said here in one line, instead of as a warning
                print(f"kvnumba: {target.CHOICE.reason}: running on Numba's CUDA simulator (set NUMBA_ENABLE_CUDASIM=1 "
                      "to choose it, or KVNUMBA_REQUIRE_GPU=1 to refuse)", file=sys.stderr)
                warnings.filterwarnings("ignore", message=target.WARNING[:40])
            demo.run(shape)
    except KeyboardInterrupt:
        return _fail("demo", "interrupted", 130)
    except AssertionError as err:  # a byte differs; np.testing's message spans lines
        return _fail("demo", f"verification failed: {_squeezed(str(err))}", 1)
    except Exception as err:  # noqa: BLE001 - one line, never a traceback
        return _fail("demo", _one_line(err), 1)
    return 0


def _rerun_on_simulator_without_gpu(argv):
    """A CUDA driver but no usable GPU: run the command again on Numba's CUDA simulator (it must be chosen
    before numba.cuda is imported). Not where the GPU target was asked for (``NUMBA_ENABLE_CUDASIM=0``)."""
    from ..driver.target import CHOICE, SIMULATOR, gpu_available

    if SIMULATOR or CHOICE.reason == "NUMBA_ENABLE_CUDASIM=0" or gpu_available():
        return
    print("kvnumba: a CUDA driver but no usable GPU: running on Numba's CUDA simulator", file=sys.stderr)
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    os.execve(sys.executable, [sys.executable, "-m", "kvnumba", *argv], env)


# --- convert ------------------------------------------------------------------------------------------------

def _convert(args):
    from ..convert.files import Interrupted, convert_file
    from ..convert.shapes import layout
    from ..layouts import registered, view_name
    from .progress import progress

    src = layout(args.src, "--from", unified=True)
    nvfp4 = args.dtype == "nvfp4"  # vLLM's NVFP4 pages, whatever --to says (kvnumba.convert.nvfp4_pages)
    if nvfp4 and args.page_size is None:
        args.error("--dtype nvfp4 needs --page-size (vLLM's block_size)")
    dst = src if nvfp4 else layout(args.dst, "--to", unified=True)
    if args.head_groups is not None and not dst.kv_pool:
        args.error(f"--head-groups applies to --to page_unified (a pool's head groups); --to {args.dst} has none: "
                   "leave it out")
    if args.dtype is not None and (src.kv_pool or dst.kv_pool):
        args.error(f"--dtype does not combine with page_unified: quantise or dequantise in another layout, then "
                   "convert")
    named = " and ".join(f"{option} {name}" for option, name, lay in (("--from", args.src, src), ("--to", args.dst, dst))
                         if lay.paged)
    if named and args.page_size is None:
        args.error(f"{named} needs --page-size (tokens per page)")
    if not named and args.page_size is not None and not nvfp4:
        paged = ", ".join(view_name(c) for c in registered() if c.paged and c.whole_tensor)
        args.error(f"--page-size applies to paged layouts only ({paged}, or a paged layout of your own); "
                   f"{args.src} -> {args.dst} has no pages: leave it out")
    try:
        shapes = convert_file(args.input, args.output, src, dst, args.page_size, chunk_bytes=args.chunk_bytes,
                              progress=functools.partial(progress, stream=None if args.quiet else sys.stderr),
                              overwrite=args.force, dtype=args.dtype, head_groups=args.head_groups)
    except Interrupted as err:
        return _fail("convert", f"{err}; the partial output was removed", 128 + err.signum)
    except KeyboardInterrupt:
        return _fail("convert", "interrupted", 130)
    except FileExistsError as err:
        return _fail("convert", f"output {err.filename!r} exists: pass --force to replace it", 1)
    except Exception as err:  # noqa: BLE001 - one line, never a traceback
        return _fail("convert", _one_line(err), 1)
    for name, shape in shapes.items():
        print(f"{args.output}{f'[{name}]' if name else ''}: {'vLLM nvfp4 pages' if nvfp4 else args.dst} {shape}")
    return 0


# --- info ---------------------------------------------------------------------------------------------------

def _info(args):
    from .info import facts, report

    found = facts()
    if args.json:
        print(json.dumps(found, indent=2))
    else:
        for key, value in report(found):
            print(f"{key + ':':<22} {value}")
    problem = _setup_problem()
    return 0 if problem is None else _fail("info", problem[0], problem[1])


# --- options ------------------------------------------------------------------------------------------------

def _layout_name(value):
    """argparse type: a layout (a view's string name, short name or ``module:Class``), as its view's name."""
    from ..layouts import view_name
    from ..convert.shapes import layout

    try:
        return view_name(layout(value, unified=True))
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("layout: ")) from None


def _dtype_name(value):
    """argparse type: what ``--dtype`` takes (``kvnumba.convert.quantised.DTYPES``)."""
    from ..convert.quantised import checked_dtype

    try:
        return checked_dtype(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("dtype ")) from None  # "argument --dtype: must ..."


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


def _default(name):
    """The demo's default for option ``name`` on a GPU and on the simulator, for its help text."""
    from .demo import SIMULATOR_SHAPE, DemoShape

    gpu, sim = getattr(DemoShape(), name), getattr(SIMULATOR_SHAPE, name)
    return f"default: {gpu:,} on a GPU, {sim:,} on the simulator"


def build_parser():
    parser = _Parser(prog="kvnumba", description="KV-cache transfers with Numba-CUDA: SGLang's kvcacheio kernels "
                                                 "in Python, on a GPU or on Numba's CUDA simulator.")
    parser.add_argument("--version", action="version", version=f"kvnumba {__version__}",
                        help="print kvnumba's version and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     parser_class=_Parser)
    d = commands.add_parser(
        "demo", help="HiCache-style backup and per-layer load back, verified, with GB/s",
        description="Back up every layer of a paged KV cache from the GPU into a page-first pinned-host pool, load "
                    "it back layer by layer, check every byte against kvnumba.reference, and print bytes, time and "
                    "GB/s. Without a GPU it runs on Numba's CUDA simulator at a tiny size (its times mean nothing).")
    d.add_argument("--layers", type=_positive_int, metavar="N", help=f"layers in the cache ({_default('layers')})")
    d.add_argument("--tokens", type=_positive_int, metavar="N",
                   help=f"tokens moved each way, a multiple of --page-size ({_default('tokens')})")
    d.add_argument("--item-size", type=_item_bytes, metavar="BYTES",
                   help=f"bytes per token per layer, for K and for V; a multiple of 8 ({_default('item_size')})")
    d.add_argument("--page-size", type=_positive_int, metavar="N",
                   help=f"tokens per page; the demo moves whole pages ({_default('page_size')})")
    d.add_argument("--pool", type=_positive_int, metavar="N",
                   help=f"token slots on each side, at least --tokens ({_default('pool')}, or 2 x --tokens if more)")
    d.set_defaults(func=_demo, needs_kernels=True, error=d.error)

    c = commands.add_parser(
        "convert",
        help="convert a .npy file, or every array of a .npz archive or a .safetensors file, between cache layouts",
        description="Convert one K (or V, or MLA) tensor of a whole cache between layouts that hold it in one array "
                    "(e.g. layer_first (L, T, *item), page_first (T, L, *item): each view class says its shape); "
                    "or K and V, the arrays k and v, to and from SGLang's page_unified pool kv "
                    "(T/P, G, L, 2, P, H/G, D; MLA: one array, T/P, L, P, D). "
                    "OUT is written in the format its name says (.npy, .npz or .safetensors), in chunks with NumPy; "
                    "it appears complete or not at all. A .safetensors file keeps its metadata, and its bf16/fp8 "
                    "tensors their dtype (needs: pip install -e \".[safetensors]\").")
    c.add_argument("input", metavar="IN", help="input .npy file, .npz archive or .safetensors file (required)")
    c.add_argument("output", metavar="OUT",
                   help="output file (required): .npy (one array), .npz or .safetensors, written in the format its "
                        "suffix names; not IN, and not an existing file unless --force")
    c.add_argument("--from", dest="src", required=True, type=_layout_name, metavar="LAYOUT",
                   help="layout of IN (required): a cache view's name or short name (layer_first or lf, page_first "
                        "or pf, ...: a misspelt one lists them all), or module:Class naming a kvnumba.CacheView "
                        "subclass (a layout of your own)")
    c.add_argument("--to", dest="dst", required=True, type=_layout_name, metavar="LAYOUT",
                   help="layout of OUT (required), named as for --from")
    c.add_argument("--page-size", type=_positive_int, metavar="N",
                   help="tokens per page: required when --from or --to is a paged layout (page_head, page_unified, "
                        "...), refused otherwise (default: none)")
    c.add_argument("--head-groups", type=_positive_int, metavar="G",
                   help="head groups of the page_unified pools written (--to page_unified only); G must divide the "
                        "heads H (default: 1)")
    c.add_argument("--dtype", type=_dtype_name, metavar="DTYPE",
                   help="fp8_e4m3 or fp8_e5m2: quantise every bfloat16/float16 tensor X into FP8 codes X and float32 "
                        "scales X_scales (one per token, layer and head; OUT must be .safetensors); bfloat16 or "
                        "float16: dequantise such a file; nvfp4: k and v into vLLM's NVFP4 pages, one uint8 tensor kv_cache "
                        "(--page-size: its block_size) (default: every tensor as it is)")
    c.add_argument("--chunk-bytes", type=_positive_int, metavar="N",
                   help="bytes converted at a time (default: $KVNUMBA_CHUNK_BYTES, else 64 MiB)")
    c.add_argument("-f", "--force", action="store_true",
                   help="replace OUT if it exists (default: off, an existing OUT is refused)")
    c.add_argument("-q", "--quiet", action="store_true",
                   help="no progress on stderr (default: off, progress on stderr)")
    c.set_defaults(func=_convert, error=c.error)

    i = commands.add_parser("info", help="versions, the GPU (or simulator), and whether the batched-copy path is there",
                            description="What kvnumba runs on: versions, the CUDA runtime and driver, the GPU or "
                                        "the simulator (and why), batched-copy support and the settings in force.")
    i.add_argument("--json", action="store_true", help="the same facts as one JSON object (default: off, text)")
    i.set_defaults(func=_info)
    return parser


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    if args.func is not _info:  # info reports a bad setting itself, after what it found
        problem = _setup_problem()
        if problem is not None:
            return _fail(args.command, *problem)
    if getattr(args, "needs_kernels", False):
        _rerun_on_simulator_without_gpu(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
