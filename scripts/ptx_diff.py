"""Did a change alter what the GPU runs? The PTX of kvnumba's kernels in two checkouts, compared, on any machine.

    python scripts/ptx_diff.py --before REV [--after REV_OR_DIR] [--only WORD ...] [--keep DIR]

A refactor of a kernel's Python should leave its PTX alone; where a GPU is scarce, that is the cheapest check
that it did. Each side is a git revision (exported with ``git archive``) or a folder holding a checkout (``.``:
this working tree, the default ``--after``). Each side runs in its own Python with ``NUMBA_ENABLE_CUDASIM=0``:
NVVM compiles for compute capability 9.0 without a GPU. Both sides compile the same list of kernels (``cases()``,
written against today's API: a case that an older checkout cannot build is reported as missing there).

Before comparing, comments and indentation go, and Numba's mangled symbols (``_ZN...``, whose counters move when
unrelated code is compiled first) are numbered in order of first use. Per kernel it prints ``same`` (byte for byte),
``same once normalised``, ``differs (N lines)`` or why it is missing. ``--only`` keeps the kernels whose names
contain a word (each takes seconds to a minute to compile: all of them take minutes per side on two cores).
``--keep DIR`` writes each side's PTX and each difference there. Exit status: 0 when every kernel compared is the
same, 1 when one differs or is missing.
"""
import argparse
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))


# --- the kernels: (name, function giving its PTX), run inside the checkout being dumped --------------------
def cases():
    from kvnumba.kernels import dequantise_pipelined, dequantise_staged, factory, nvfp4, nvfp4_load, quantise_wide
    from kvnumba.kernels import scaled_copy, staged
    from kvnumba.kernels import layouts as L
    from kvnumba.kernels.layer_wait import wait_ptx
    from kvnumba.kernels.nvfp4_packed import decode4_ptx, decode4_unit_ptx, encode16_ptx
    from kvnumba.kernels.ptx import ptx_of
    from kvnumba.kernels.resident import resident_ptx
    from kvnumba.kernels.resident_staged import resident_staged_ptx
    from kvnumba.layouts import PageFirstDirect, PageUnified
    from kvnumba.layouts.vllm import BLOCKS, HEAD_MAJOR_BLOCKS
    from kvnumba.plan.spec import KERNEL_ENTRY_POINTS, SPECS
    from kvnumba.quant import E4M3, E5M2

    for name in KERNEL_ENTRY_POINTS:  # the seed's ten
        spec = SPECS[name]
        yield f"seed {name}", lambda s=spec: factory.kernel_ptx(s.src_layout, s.dst_layout, s.mla)
    for kinds, groups in ((2, 1), (2, 2), (1, 1)):
        pool = PageUnified.arithmetic(kinds, groups)
        for src, dst in ((pool, L.LAYER_FIRST), (L.LAYER_FIRST, pool)):
            yield f"factory {src.name}->{dst.name}", lambda s=src, d=dst, m=kinds == 1: factory.kernel_ptx(s, d, m)
    for src, mla in ((L.PAGE_FIRST, False), (L.PAGE_HEAD, False), (L.PAGE_FIRST, True)):
        yield f"staged {src.name}->lf{' mla' if mla else ''}", lambda s=src, m=mla: ptx_of(
            staged.get_staged_kernel(s, L.LAYER_FIRST, m), staged.SIGNATURE, (9, 0))
    for src, mla, narrow in (("pf", False, False), ("ph", False, False), ("pf", True, False), ("pf", False, True)):
        yield (f"resident {src}->lf{' mla' if mla else ''}{' narrow' if narrow else ''}",
               lambda a=(src, mla, narrow): resident_ptx(a[0], "lf", a[1], narrow=a[2]))
    yield "resident staged pf->lf_tbl", lambda: resident_staged_ptx(L.PAGE_FIRST, L.LAYER_TABLE, False)
    yield "layer wait", wait_ptx
    fp8 = {"fp8 register quantise pf->blocks e4m3 bf16": (L.PAGE_FIRST, BLOCKS, False, "quantise", E4M3, "bfloat16"),
           "fp8 register dequantise blocks->pf e4m3 bf16": (BLOCKS, L.PAGE_FIRST, False, "dequantise", E4M3,
                                                           "bfloat16"),
           "fp8 register dequantise hnd_blocks->ph e5m2 f16": (HEAD_MAJOR_BLOCKS, L.PAGE_HEAD, False, "dequantise",
                                                              E5M2, "float16"),
           "fp8 register copy lf_tbl->pfd mla": (L.LAYER_TABLE, PageFirstDirect.parts, True, "copy", E4M3,
                                                 "bfloat16")}
    for name, args in fp8.items():
        yield name, lambda a=args: scaled_copy.kernel_ptx(*a)
    yield "fp8 wide quantise lf_tbl->pf", lambda: quantise_wide.kernel_ptx(L.LAYER_TABLE, L.PAGE_FIRST, False)
    for codec, dtype in ((E4M3, "bfloat16"), (E5M2, "float16")):
        yield (f"fp8 pipelined dequantise pf->lf_tbl {codec.name} {dtype}",
               lambda c=codec, d=dtype: dequantise_pipelined.kernel_ptx(L.PAGE_FIRST, L.LAYER_TABLE, False, c, d))
        yield (f"fp8 staged dequantise ph->lf_tbl {codec.name} {dtype}",
               lambda c=codec, d=dtype: dequantise_staged.kernel_ptx(L.PAGE_HEAD, L.LAYER_TABLE, False, c, d))
    nv = {"nvfp4 quantise lf_tbl": ("quantise", L.LAYER_TABLE, False, True, "bfloat16"),
          "nvfp4 dequantise pf f16": ("dequantise", L.PAGE_FIRST, True, False, "float16"),
          "nvfp4 copy": ("copy", None, False, True, "bfloat16")}
    for name, args in nv.items():
        yield name, lambda a=args: nvfp4.kernel_ptx(*a)
    yield "nvfp4 pipelined load lf_tbl", lambda: nvfp4_load.kernel_ptx(L.LAYER_TABLE, False, "bfloat16", 8)
    yield "nvfp4 encode16", encode16_ptx
    for dtype in ("bfloat16", "float16"):
        yield f"nvfp4 decode4 {dtype}", lambda d=dtype: decode4_ptx(d)
        yield f"nvfp4 decode4 unit {dtype}", lambda d=dtype: decode4_unit_ptx(d)


def dump(only):
    """In a checkout (the current directory, first on sys.path): one JSON line, kernel name -> PTX or error."""
    out = {}
    try:
        found = list(cases())
    except Exception as error:  # an older checkout without today's modules: every case is missing
        print(json.dumps({"*": {"error": f"{type(error).__name__}: {error}"}}))
        return
    for name, ptx in found:
        if only and not any(word in name for word in only):
            continue
        try:
            out[name] = {"ptx": ptx()}
        except Exception as error:
            out[name] = {"error": f"{type(error).__name__}: {error}".splitlines()[0][:200]}
            traceback.print_exc()
    print(json.dumps(out))


# --- comparing -----------------------------------------------------------------------------------------
def normalise(ptx):
    """``ptx`` without comments or blank lines, its mangled symbols numbered in order of first use (an inline-asm
    snippet, which has no ``.entry``: one statement a line)."""
    lines = [re.sub(r"//.*$", "", line).strip() for line in ptx.splitlines()]
    text = "\n".join(line for line in lines if line)
    if ".entry" not in text and ".func" not in text:
        text = "\n".join(s + ";" for s in (re.sub(r"\s+", " ", s).strip() for s in text.split(";")) if s)
    names = {}
    return re.sub(r"_ZN[0-9A-Za-z_$]+", lambda m: names.setdefault(m.group(0), f"SYMBOL{len(names)}"), text) + "\n"


def compare(before, after):
    """``(verdict, diff lines)`` for one kernel's PTX on both sides."""
    if before == after:
        return "same", []
    a, b = normalise(before), normalise(after)
    if a == b:
        return "same once normalised", []
    diff = list(difflib.unified_diff(a.splitlines(), b.splitlines(), "before", "after", lineterm="", n=2))
    changed = sum(1 for line in diff if line[:1] in "+-" and not line.startswith(("+++", "---")))
    return f"differs ({changed} lines)", diff


def checkout(side, scratch, label):
    """The folder of ``side``: a folder as given, or a revision exported into ``scratch``."""
    if os.path.isdir(side):
        return os.path.abspath(side)
    folder = os.path.join(scratch, label)
    os.makedirs(folder)
    archive = subprocess.run(["git", "-C", os.path.join(HERE, ".."), "archive", side], capture_output=True)
    if archive.returncode:
        sys.exit(f"--{label} {side}: not a folder, and git cannot export it: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", folder], input=archive.stdout, check=True)
    return folder


def ptx_of_side(folder, only, label):
    """Kernel name -> ``{"ptx": ...}`` or ``{"error": ...}`` for the checkout in ``folder``."""
    # The side's folder first, then the caller's own path (where numba and numpy may come from).
    path = os.pathsep.join(p for p in (folder, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0", PYTHONPATH=path)
    command = [sys.executable, os.path.abspath(__file__), "--dump", *(["--only", *only] if only else [])]
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        sys.exit(f"the {label} side did not compile its kernels:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="a git revision, or a folder holding a checkout")
    parser.add_argument("--after", default=".", help="the same (default: this working tree)")
    parser.add_argument("--only", nargs="+", help="only the kernels whose names contain one of these words")
    parser.add_argument("--keep", help="write each side's PTX and each difference into this folder")
    parser.add_argument("--dump", action="store_true", help=argparse.SUPPRESS)  # a side's own process
    args = parser.parse_args(argv)
    if args.dump:
        return dump(args.only)
    if args.before is None:
        parser.error("--before is required")
    with tempfile.TemporaryDirectory() as scratch:
        sides = [ptx_of_side(checkout(side, scratch, label), args.only, label)
                 for side, label in ((args.before, "before"), (args.after, "after"))]
    names = [n for n in sides[1] if n != "*"] + [n for n in sides[0] if n not in sides[1] and n != "*"]
    width = max(map(len, names), default=10)
    worst = 0
    for name in names:
        got = [side.get(name) or side.get("*") or {"error": "no such case"} for side in sides]
        missing = [f"{label}: {g['error']}" for label, g in zip(("before", "after"), got) if "error" in g]
        if missing:
            verdict, diff = "missing (" + "; ".join(missing) + ")", []
        else:
            verdict, diff = compare(got[0]["ptx"], got[1]["ptx"])
        worst = max(worst, not verdict.startswith("same"))
        print(f"{name:{width}}  {verdict}")
        if args.keep:
            stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
            os.makedirs(args.keep, exist_ok=True)
            for label, g in zip(("before", "after"), got):
                if "ptx" in g:
                    with open(os.path.join(args.keep, f"{stem}.{label}.ptx"), "w") as f:
                        f.write(g["ptx"])
            if diff:
                with open(os.path.join(args.keep, f"{stem}.diff"), "w") as f:
                    f.write("\n".join(diff) + "\n")
    return worst


if __name__ == "__main__":
    sys.exit(main())
