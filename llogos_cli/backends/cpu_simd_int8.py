"""Block rows times 8-bit activations in integer SIMD, as llama.cpp multiplies them (LLVM vector IR
through numba intrinsics, like cpu_simd).

The activations come in blocks of 32: int8 quants xq, a scale dx (x ≈ dx · xq) and sx = dx · Σ xq
(cpu_quant_int8.quantize_blocks). Every plain type stores a block as d, maybe m, and 32 unsigned
quants u with weight = d · (u - bias) + m, so

    Σ_l w_l · x_l ≈ d · dx · Σ_l u_l · xq_l + (m - bias · d) · sx,

and the integer sum Σ u_l · xq_l of unsigned bytes by signed bytes is one instruction per 32:
- VNNI (AVX-512 VNNI with VL): `vpdpbusd` on 256-bit vectors, four byte products summed into each
  of 8 int32 lanes; nothing saturates, so Q8_0 takes its quants as u = q + 128 (bias 128);
- AVX2: `vpmaddubsw` (byte pairs summed into int16, saturating) then `vpmaddwd` by ones (into
  int32). 4- and 5-bit quants stay far from the int16 limit (2 · 31 · 127); Q8_0 could reach it,
  so there the bytes become |q| times xq with q's sign (`vpsignb`), bias 0.
The 8 int32 lanes are converted and multiplied by d · dx into a float vector summed once per row.

The instruction set is a compile-time choice: the kernels take `isa` as a NumPy scalar whose type
names it (ISA_ARG), so that each set is its own specialisation in numba's cache and a test can
run the AVX2 code on a VNNI machine.
"""

import numpy as np
from llvmlite import ir
from llvmlite import binding as llvm
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from llogos_cli.backends.cpu_simd import (
    F32,
    I8,
    I16,
    I32,
    I64,
    PLAIN,
    at,
    broadcast,
    const,
    each_block,
    f16_at,
    fsum,
    load,
    plain_quants,
    vec,
)

ISA_ARG = {"vnni": np.int8(0), "avx2": np.int16(0)}   # the type of the scalar is what counts
_ISA_OF_TYPE = {types.int8: "vnni", types.int16: "avx2"}


def host_isa() -> str | None:
    """The best instruction set this CPU has for these kernels; None: neither."""
    features = llvm.get_host_cpu_features()
    if features.get("avx512vnni", False) and features.get("avx512vl", False):
        return "vnni"
    if features.get("avx2", False):
        return "avx2"
    return None


def _call(builder, name: str, ret: ir.Type, *args):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


def _int_dot(builder, isa: str, name: str, q, xhi, xlo):
    """<8 x i32> partial sums of Σ u · (254 · xhi + xlo) over the block, u the unsigned quants (see
    the module): at most 32 · 255 · 127 · 255 < 2^31."""
    if isa == "vnni":
        if name == "q8_0":
            q = builder.xor(q, const(I8, 32, -128))   # q + 128 as an unsigned byte
        u = builder.bitcast(q, vec(I32, 8))

        def dot(acc, x):
            return _call(builder, "llvm.x86.avx512.vpdpbusd.256", vec(I32, 8), acc, u, builder.bitcast(x, vec(I32, 8)))
        return dot(_times_254(builder, dot(const(I32, 8, 0), xhi)), xlo)
    if name == "q8_0":   # |q| · (x with q's sign): the same products, a byte pair-sum within int16
        xhi, xlo = (_call(builder, "llvm.x86.avx2.psign.b", vec(I8, 32), x, q) for x in (xhi, xlo))
        q = _call(builder, "llvm.abs.v32i8", vec(I8, 32), q, ir.Constant(ir.IntType(1), 0))

    def dot(x):
        pairs = _call(builder, "llvm.x86.avx2.pmadd.ub.sw", vec(I16, 16), q, x)
        return _call(builder, "llvm.x86.avx2.pmadd.wd", vec(I32, 8), pairs, const(I16, 16, 1))
    return builder.add(_times_254(builder, dot(xhi)), dot(xlo))


def _times_254(builder, v):
    return builder.sub(builder.shl(v, const(I32, 8, 8)), builder.shl(v, const(I32, 8, 1)))


def _scalar(context, builder, array_t, array, index, elem: ir.Type):
    return builder.extract_element(load(context, builder, array_t, array, index, elem, 1), ir.Constant(I32, 0))


def plain_row_dot8(name: str):
    """An intrinsic dot(row, xq, dx, sx, isa) -> float32: Σ over the row's `name` blocks of the
    weights times the 8-bit activations (xq int8, dx and sx float32 per 32), in `isa`'s integer
    instructions."""
    size, d_at, m_at, _, _, stored_bias = PLAIN[name]

    @intrinsic
    def dot(typingctx, row, xq, dx, sx, isa):
        if isa not in _ISA_OF_TYPE:
            return None
        chosen = _ISA_OF_TYPE[isa]
        # the bias of the unsigned bytes _int_dot multiplies: with VNNI, Q8_0's are q + 128
        bias = 128 if name == "q8_0" and chosen == "vnni" else stored_bias

        def codegen(context, builder, sig, args):
            row_t, xq_t, dx_t, sx_t, _ = sig.args
            row, xq, dx, sx, _ = args
            acc = cgutils.alloca_once_value(builder, const(F32, 8, 0.0))
            offsets = cgutils.alloca_once_value(builder, ir.Constant(F32, 0.0))
            with each_block(context, builder, row_t, row, size) as (o, e):
                k = builder.udiv(e, ir.Constant(I64, 32))
                isum = _int_dot(builder, chosen, name, plain_quants(context, builder, row_t, row, o, name),
                                load(context, builder, xq_t, xq, builder.add(e, e), I8, 32),
                                load(context, builder, xq_t, xq, at(builder, builder.add(e, e), 32), I8, 32))
                d = f16_at(context, builder, row_t, row, at(builder, o, d_at))
                dxk, sxk = _scalar(context, builder, dx_t, dx, k, F32), _scalar(context, builder, sx_t, sx, k, F32)
                step = builder.fmul(d, builder.fmul(dxk, ir.Constant(F32, 1 / 254)))   # a unit of xlo
                scale = broadcast(builder, step, 8)
                total = builder.fadd(builder.load(acc), builder.fmul(builder.sitofp(isum, vec(F32, 8)), scale, flags=["fast"]),
                                     flags=["fast"])
                builder.store(total, acc)
                # the offset of every weight from d · u: m (if any) less bias · d
                offset = builder.fmul(ir.Constant(F32, -float(bias)), d)
                if m_at is not None:
                    offset = builder.fadd(offset, f16_at(context, builder, row_t, row, at(builder, o, m_at)))
                builder.store(builder.fadd(builder.load(offsets), builder.fmul(offset, sxk)), offsets)
            return builder.fadd(fsum(builder, builder.load(acc)), builder.load(offsets))
        return types.float32(row, xq, dx, sx, isa), codegen
    return dot


def _k_quants(context, builder, row_t, row, o, name: str) -> list:
    """The 256-weight block at byte o as eight <32 x i8> vectors of unsigned quants, in element order.
    Q4_K: qs at 16, 32 bytes per pair of sub-blocks (low nibbles the first, high the second);
    Q5_K: the same at 48, plus bit j of qh[l] (32 bytes at 16) as sub-block j's fifth bits;
    Q6_K: per half h, bytes a = ql[64h:+32], c = ql[64h+32:+32], bits = qh[32h:+32] (qh at 128)
    give its four quarters a & 15, c & 15, a >> 4, c >> 4 with two high bits each from bits."""
    low, four = const(I8, 32, 15), const(I8, 32, 4)
    if name == "q6_k":
        quants = []
        for h in range(2):
            a = load(context, builder, row_t, row, at(builder, o, 64 * h), I8, 32)
            c = load(context, builder, row_t, row, at(builder, o, 64 * h + 32), I8, 32)
            bits = load(context, builder, row_t, row, at(builder, o, 128 + 32 * h), I8, 32)
            for nibbles, shift in ((builder.and_(a, low), 0), (builder.and_(c, low), 2),
                                   (builder.lshr(a, four), 4), (builder.lshr(c, four), 6)):
                high = builder.and_(builder.lshr(bits, const(I8, 32, shift)), const(I8, 32, 3))
                quants.append(builder.or_(nibbles, builder.shl(high, four)))
        return quants
    qs_at = 16 if name == "q4_k" else 48
    qh = load(context, builder, row_t, row, at(builder, o, 16), I8, 32) if name == "q5_k" else None
    quants = []
    for g in range(4):
        v = load(context, builder, row_t, row, at(builder, o, qs_at + 32 * g), I8, 32)
        for k, q in enumerate((builder.and_(v, low), builder.lshr(v, four))):
            if qh is not None:
                bit = builder.and_(builder.lshr(qh, const(I8, 32, 2 * g + k)), const(I8, 32, 1))
                q = builder.or_(q, builder.shl(bit, four))
            quants.append(q)
    return quants


_K_BYTES = {"q4_k": 144, "q5_k": 176, "q6_k": 210}


def _pick(builder, v, lanes: list[int]):
    return builder.shuffle_vector(v, v, ir.Constant(vec(I32, len(lanes)), lanes))


def _k_scales_mins(context, builder, row_t, row, o):
    """A Q4_K/Q5_K block's eight six-bit scales and mins (12 bytes at o + 4) as <8 x float> each:
    j < 4 from the low six bits of bytes j and j + 4, j >= 4 from the nibbles of byte j + 4 and
    the top two bits of bytes j - 4 and j."""
    b = load(context, builder, row_t, row, at(builder, o, 4), I8, 16)   # past the 12 bytes: the block goes on
    first, second, third = (_pick(builder, b, list(range(k, k + 4))) for k in (0, 4, 8))
    six, four, fifteen = const(I8, 4, 63), const(I8, 4, 4), const(I8, 4, 15)
    tops = [builder.shl(builder.lshr(v, const(I8, 4, 6)), four) for v in (first, second)]
    scales = builder.shuffle_vector(builder.and_(first, six), builder.or_(builder.and_(third, fifteen), tops[0]),
                                    ir.Constant(vec(I32, 8), list(range(8))))
    mins = builder.shuffle_vector(builder.and_(second, six), builder.or_(builder.lshr(third, four), tops[1]),
                                  ir.Constant(vec(I32, 8), list(range(8))))
    return builder.uitofp(scales, vec(F32, 8)), builder.uitofp(mins, vec(F32, 8))


def k_row_dot8(name: str):
    """An intrinsic dot(row, xq, dx, sx, xl, isa) -> float32 for the K type `name` (q4_k, q5_k,
    q6_k) times the 8-bit activations, the sub-blocks' scales decoded in vector registers a block at
    a time. Q4_K and Q5_K: d · sc per 32, and the mins' -dmin · m taken against sx; Q6_K: d · sc per
    16, the quants' bias of 32 taken against xl, the activations' integer sums (254 · xhi + xlo)
    over each 4 elements, which are the lanes of _int_dot's result."""
    size = _K_BYTES[name]

    @intrinsic
    def dot(typingctx, row, xq, dx, sx, xl, isa):
        if isa not in _ISA_OF_TYPE:
            return None
        chosen = _ISA_OF_TYPE[isa]

        def codegen(context, builder, sig, args):
            row_t, xq_t, dx_t, sx_t, xl_t, _ = sig.args
            row, xq, dx, sx, xl, _ = args
            acc = cgutils.alloca_once_value(builder, const(F32, 8, 0.0))
            min_acc = cgutils.alloca_once_value(builder, const(F32, 8, 0.0))
            n_blocks = builder.udiv(builder.extract_value(context.make_array(row_t)(context, builder, row).shape, 0),
                                    ir.Constant(I64, size))
            with cgutils.for_range(builder, n_blocks) as loop:
                o = builder.mul(loop.index, ir.Constant(I64, size))
                s0 = builder.mul(loop.index, ir.Constant(I64, 8))   # the block's first sub-block of 32
                units = builder.fmul(load(context, builder, dx_t, dx, s0, F32, 8), const(F32, 8, 1 / 254))
                if name == "q6_k":
                    d = f16_at(context, builder, row_t, row, at(builder, o, 208))
                    per16 = builder.fmul(builder.sitofp(load(context, builder, row_t, row, at(builder, o, 192), I8, 16),
                                                        vec(F32, 16)), broadcast(builder, d, 16))
                else:
                    scales, mins = _k_scales_mins(context, builder, row_t, row, o)
                    steps = builder.fmul(builder.fmul(scales, broadcast(builder, f16_at(context, builder, row_t, row, o), 8)),
                                         units)
                    dmin = f16_at(context, builder, row_t, row, at(builder, o, 2))
                    offsets = builder.fmul(builder.fmul(mins, broadcast(builder, dmin, 8)),
                                           load(context, builder, sx_t, sx, s0, F32, 8))
                    builder.store(builder.fsub(builder.load(min_acc), offsets), min_acc)
                total = builder.load(acc)
                for j, q in enumerate(_k_quants(context, builder, row_t, row, o, name)):
                    x_at = builder.mul(builder.add(s0, ir.Constant(I64, j)), ir.Constant(I64, 64))
                    isum = _int_dot(builder, chosen, name, q, load(context, builder, xq_t, xq, x_at, I8, 32),
                                    load(context, builder, xq_t, xq, at(builder, x_at, 32), I8, 32))
                    if name == "q6_k":   # quants less their bias of 32; a scale for each half of the 32
                        lanes = load(context, builder, xl_t, xl, builder.mul(at(builder, s0, j), ir.Constant(I64, 8)), I32, 8)
                        isum = builder.sub(isum, builder.shl(lanes, const(I32, 8, 5)))
                        scale = builder.fmul(_pick(builder, per16, [2 * j] * 4 + [2 * j + 1] * 4), _pick(builder, units, [j] * 8))
                    else:
                        scale = _pick(builder, steps, [j] * 8)
                    total = builder.fadd(total, builder.fmul(builder.sitofp(isum, vec(F32, 8)), scale, flags=["fast"]),
                                         flags=["fast"])
                builder.store(total, acc)
            return fsum(builder, builder.fadd(builder.load(acc), builder.load(min_acc), flags=["fast"]))
        return types.float32(row, xq, dx, sx, xl, isa), codegen
    return dot
