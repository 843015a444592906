"""The packed NVFP4 conversions the GPU runs (``kernels.nvfp4_packed``), checked without a GPU: their PTX text is
interpreted instruction by instruction (each op's PTX meaning, float32 arithmetic rounded to nearest even in NumPy)
and must give ``kvnumba.quant.nvfp4``'s codes and elements bit for bit, on random groups, on every e2m1 tie and on
both plain dtypes; the simulator's twins must agree with them. No simulator launch: fast."""
import re

import ml_dtypes
import numpy as np
import pytest

from kvnumba.driver.target import SIMULATOR
from kvnumba.kernels import nvfp4_packed as packed
from kvnumba.kernels.simulator.nvfp4_packed import make_decode4, make_decode4_unit, make_encode16
from kvnumba.quant import nvfp4 as q

M32 = 0xFFFFFFFF


def f32(bits):
    return np.uint32(bits & M32).view(np.float32)


def bits(x):
    return int(np.float32(x).view(np.uint32))


def prmt(a, b, c):
    src = [(a >> 8 * i) & 0xFF for i in range(4)] + [(b >> 8 * i) & 0xFF for i in range(4)]
    out = 0
    for i in range(4):
        s = (c >> 4 * i) & 0xF
        v = src[s & 7]
        out |= ((0xFF if v & 0x80 else 0) if s & 8 else v) << 8 * i
    return out


def halves(word):
    return np.array([word & 0xFFFF, word >> 16], np.uint16).view(np.float16)


def from_halves(pair):
    low, high = (int(v) for v in np.asarray(pair, np.float16).view(np.uint16))
    return high << 16 | low


def packed_fma(dtype):
    """``fma.rn`` of two-element words: exact products and sums (the tests' are), rounded once into ``dtype``."""
    def fma(a, b, c):
        view = (lambda w: np.array([w & 0xFFFF, w >> 16], np.uint16).view(dtype).astype(np.float64))
        return from_plain(view(a) * view(b) + view(c), dtype)

    return fma


def from_plain(values, dtype):
    low, high = (int(v) for v in np.asarray(values, np.float64).astype(np.float32).astype(dtype).view(np.uint16))
    return high << 16 | low


def half(x, dtype):
    """``cvt.rn`` of a float32 into a bfloat16/float16's bits."""
    with np.errstate(all="ignore"):
        return int(np.array([x], np.float32).astype(dtype).view(np.uint16)[0])


OPS = {
    "and.b32": lambda a, b: a & b, "or.b32": lambda a, b: a | b, "xor.b32": lambda a, b: a ^ b,
    "shl.b32": lambda a, b: (a << b) & M32, "shr.u32": lambda a, b: a >> b, "min.u32": min,
    "add.u32": lambda a, b: (a + b) & M32, "sub.u32": lambda a, b: (a - b) & M32,
    "mul.lo.u32": lambda a, b: (a * b) & M32, "mul.rn.f32": lambda a, b: bits(f32(a) * f32(b)),
    "add.rn.f32": lambda a, b: bits(f32(a) + f32(b)), "setp.lt.u32": lambda a, b: int(a < b),
    "cvt.rn.bf16x2.f32": lambda a, b: half(f32(a), ml_dtypes.bfloat16) << 16 | half(f32(b), ml_dtypes.bfloat16),
    "cvt.rn.f16x2.f32": lambda a, b: half(f32(a), np.float16) << 16 | half(f32(b), np.float16),
    "set.ge.f16x2.f16x2": lambda a, b: from_halves((halves(a) >= halves(b)).astype(np.float16)),
    "add.rn.f16x2": lambda a, b: from_halves(halves(a) + halves(b)),
}
FMA = {"fma.rn.bf16x2": packed_fma(ml_dtypes.bfloat16), "fma.rn.f16x2": packed_fma(np.float16)}


def run_ptx(body, *operands):
    """Interpret one of the module's PTX bodies on int64 operands; the int64 it gives."""
    reg = {f"${i + 1}": int(v) & 0xFFFFFFFFFFFFFFFF for i, v in enumerate(operands)}

    def value(token):
        if token.startswith("0f"):
            return int(token[2:], 16)
        if token[0].isdigit():
            return int(token, 0)
        return reg[token]

    for line in body.split(";"):
        line = line.strip()
        if not line or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        args = [a.strip() for a in re.split(r",(?![^{]*})", rest)]
        if op in ("mov.b64", "mov.b32") and args[0].startswith("{"):  # unpack into halves, low first
            lo, hi = (r.strip() for r in args[0][1:-1].split(","))
            width = 32 if op == "mov.b64" else 16
            reg[lo], reg[hi] = value(args[1]) & ((1 << width) - 1), value(args[1]) >> width
        elif op in ("mov.b64", "mov.b32") and args[1].startswith("{"):  # pack
            lo, hi = (r.strip() for r in args[1][1:-1].split(","))
            reg[args[0]] = reg[hi] << (32 if op == "mov.b64" else 16) | reg[lo]
        elif op in ("mov.b32", "cvt.u32.u64"):
            reg[args[0]] = value(args[1]) & M32
        elif op == "cvt.rn.f16.f32":
            reg[args[0]] = half(f32(reg[args[1]]), np.float16)
        elif op in FMA:
            reg[args[0]] = FMA[op](value(args[1]), value(args[2]), value(args[3]))
        elif op == "cvt.f32.f16":
            reg[args[0]] = bits(np.uint16(reg[args[1]]).view(np.float16).astype(np.float32))
        elif op == "selp.b32":
            reg[args[0]] = value(args[1]) if reg[args[3]] else value(args[2])
        elif op == "prmt.b32":
            reg[args[0]] = prmt(value(args[1]), value(args[2]), value(args[3]))
        elif op == "mad.lo.u32":
            reg[args[0]] = (value(args[1]) * value(args[2]) + value(args[3])) & M32
        else:
            reg[args[0]] = OPS[op](value(args[1]), value(args[2]))
    return reg["$0"]


def groups(rng, dtype, count):
    """Random groups of 16 finite elements as uint16 bits, and e2m1's ties and grid points, over many scales."""
    plain = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 6, -0.0, -0.25, -2.5, -5, 0.5, 1, 3, 4], np.float32)
    out = [(ties * np.float32(2.0) ** int(rng.integers(-4, 5))).astype(plain).view(np.uint16) for _ in range(4)]
    for _ in range(count):
        x = (rng.standard_normal(16) * 2.0 ** rng.integers(-14 if dtype == "float16" else -30, 12)).astype(np.float32)
        x[rng.integers(0, 16)] = rng.choice([0.0, -0.0])
        out.append(x.astype(plain).view(np.uint16))
    return out


def kernel_out(data_scale, global_scale):
    """The kernel's ``out`` for a group whose scale code is ``data_scale`` (the reference's, step for step)."""
    s = np.float32(1) / np.float32(global_scale)
    sf = np.array([data_scale], np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)[0]
    return bits(q._rcp(np.float32(sf * q._rcp(s)))) if sf != 0 else 0


def as_int64(word):
    return word - (1 << 64) if word >> 63 else word


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_encode16_ptx_and_twin_are_the_reference(dtype):
    """The codes by the threshold table's row for the group's scale code (the table from the kernel's ``out``
    for each code and the reference's e2m1): on random groups, ties, signed zeros and several global scales."""
    rng = np.random.default_rng(1)
    body, twin = packed.encode16_ptx(), make_encode16()
    for global_scale in (1.0, 0.37, 8.0):
        unscale = bits(q._rcp(np.float32(1) / np.float32(global_scale)))
        table = packed.threshold_table(unscale, unscale, dtype)
        for x in groups(rng, dtype, 120):
            data, scales = q.quantise(x, global_scale, dtype)
            if (x & 0x7FFF).max() >= packed.NEVER or not np.isfinite(f32(kernel_out(scales[0], global_scale))):
                continue  # the exact path's
            row = [as_int64(int(w)) for w in table[1, scales[0]].view(np.uint64)]
            words = [as_int64(int(w)) for w in x.view(np.uint64)]
            want = int(data.view(np.uint64)[0])
            assert run_ptx(body, *words, *row) == want, (x, global_scale)
            assert twin(*words, *row) & 0xFFFFFFFFFFFFFFFF == want


def test_the_threshold_table_is_the_rounding_of_every_magnitude():
    """Each row's thresholds split the magnitudes exactly where the kernel's product, rounded by the reference's
    e2m1, changes code (every magnitude, a few scale codes); rows of NaN's code never match."""
    unscale = bits(q._rcp(np.float32(1) / np.float32(0.37)))
    table = packed.threshold_table(unscale, unscale, "bfloat16")
    m = np.arange(packed.NEVER, dtype=np.uint16)
    x = m.view(ml_dtypes.bfloat16).astype(np.float32)
    for code in (0, 1, 7, 8, 0x40, 0x7E):
        out = f32(kernel_out(code, 0.37))
        with np.errstate(over="ignore"):  # huge magnitudes times out: infinity, code 7
            want = q._e2m1((x * out).astype(np.float32))
        got = (m[:, None] >= (table[0, code, :7] & 0xFFFF)[None, :]).sum(axis=1)
        np.testing.assert_array_equal(got, want)
        assert (table[0, code, :7] >> 16 == table[0, code, :7] & 0xFFFF).all()  # both halves
    assert (table[:, 0x7F] == packed.NEVER * 0x10001).all()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_decode4_ptx_and_twin_are_the_reference(dtype):
    rng = np.random.default_rng(2)
    body, twin = packed.decode4_ptx(dtype), make_decode4(dtype)
    for _ in range(200):
        data = rng.integers(0, 256, 8, dtype=np.uint8)
        scale = np.array([rng.integers(0, 256)], np.uint8)
        if scale[0] & 0x7F == 0x7F:
            continue  # NaN scales take the exact path
        global_scale = float(rng.choice([1.0, 0.5, 3.1, 1e-3]))
        want = q.dequantise(data, scale, global_scale, dtype).view(np.uint16).view(np.uint64)
        sf = bits(scale.view(ml_dtypes.float8_e4m3fn).astype(np.float32)[0])
        codes = int(data.view(np.uint64)[0]) ^ (0x8888888888888888 if sf >> 31 else 0)  # as the kernel flips them
        for j in range(4):
            got = run_ptx(body, as_int64(codes >> 16 * j), sf & 0x7FFFFFFF, bits(global_scale))
            assert got == int(want[j]), (data, scale, global_scale, j)
            assert twin(codes >> 16 * j, sf & 0x7FFFFFFF, bits(global_scale)) & 0xFFFFFFFFFFFFFFFF == int(want[j])


@pytest.mark.skipif(not SIMULATOR, reason="calls a device function as Python, which only the simulator allows")
def test_a_groups_scale_code_is_the_references():
    """``kernels.nvfp4.e4m3_code`` (branch-free: subnormals by a float32 add, normals on the bits, saturated) on
    the simulator, where a device function is its Python: every boundary of e4m3's grid and random magnitudes."""
    from kvnumba.kernels.nvfp4 import e4m3_code

    rng = np.random.default_rng(3)
    values = [0, 1, 0x7F800000, 0x3C800000, 0x3C7FFFFF, 0x43E00000, 0x43E80000, 0x43E7FFFF, 0x43F00000]
    grid = np.arange(0x7F, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32).view(np.uint32)
    values += [int(g) + d for g in grid[1:] for d in (-1, 0, 1)]  # each code, and a float32 ulp either side
    values += [int(g) + int(h) >> 1 for g, h in zip(grid[:-1], grid[1:])]  # each tie, the midpoints
    values += [int(v) for v in rng.integers(0, 0x7F800000, 3000)]
    want = q._e4m3(np.array(values, np.uint32).view(np.float32))
    assert [e4m3_code(v) for v in values] == [int(w) for w in want]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_decode4_unit_ptx_and_twin_are_the_reference(dtype):
    """With a global scale of 1 the packed products are the reference's elements: every scale code but NaN's,
    random codes, both signs of scale."""
    rng = np.random.default_rng(4)
    body, twin = packed.decode4_unit_ptx(dtype), make_decode4_unit(dtype)
    for code in [c for c in range(256) if c & 0x7F != 0x7F]:
        data, scale = rng.integers(0, 256, 8, dtype=np.uint8), np.array([code], np.uint8)
        want = q.dequantise(data, scale, 1.0, dtype).view(np.uint16).view(np.uint64)
        sf = bits(scale.view(ml_dtypes.float8_e4m3fn).astype(np.float32)[0])
        codes = int(data.view(np.uint64)[0]) ^ (0x8888888888888888 if sf >> 31 else 0)
        for j in range(4):
            assert run_ptx(body, as_int64(codes >> 16 * j), sf & 0x7FFFFFFF) == int(want[j]), (code, j)
            assert twin(codes >> 16 * j, sf & 0x7FFFFFFF) & 0xFFFFFFFFFFFFFFFF == int(want[j])
