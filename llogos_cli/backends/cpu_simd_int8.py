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
(Each xq byte is in fact two, xhi and xlo, see cpu_quant_int8: the instructions run twice.)

The K types (k_row_dot8) take one scale per 256 activations (llama.cpp's Q8_K), so a block's
sub-blocks add up in integers: `vpmaddubsw` (quants by activations, byte pairs into int16), then
`vpmaddwd` by the sub-block's integer scale (into int32, fused with the add into `vpdpwssd` where
VNNI has it), and one conversion a block. Both instruction sets run the same code there.

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

# A float operation's flag that lets LLVM fuse a multiply into an add (the same in every kernel) but
# not regroup a sum: numba's fastmath pass marks every float operation that has no flag `fast`,
# which would let LLVM regroup a sum differently in kernels of one token and of several (k_row_dot8),
# and a batched row then differ from the same row alone.
ORDERED = ("contract",)
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
    weights times one token's two-byte activations (xq int8, dx and sx float32 per 32), in `isa`'s
    integer instructions."""
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
                step = builder.fmul(d, builder.fmul(_scalar(context, builder, dx_t, dx, k, F32), ir.Constant(F32, 1 / 254)))
                product = builder.fmul(builder.sitofp(isum, vec(F32, 8)), broadcast(builder, step, 8), flags=["fast"])
                builder.store(builder.fadd(builder.load(acc), product, flags=["fast"]), acc)
                # the offset of every weight from d · u: m (if any) less bias · d; none, where both are 0
                offset = builder.fmul(ir.Constant(F32, -float(bias)), d) if bias else None
                if m_at is not None:
                    m = f16_at(context, builder, row_t, row, at(builder, o, m_at))
                    offset = m if offset is None else builder.fadd(offset, m)
                if offset is not None:
                    sxk = _scalar(context, builder, sx_t, sx, k, F32)
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
    """A Q4_K/Q5_K block's eight six-bit scales and mins (12 bytes at o + 4) as <8 x i16> each:
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
    return builder.zext(scales, vec(I16, 8)), builder.zext(mins, vec(I16, 8))


def _scaled_pair_sums(builder, q, x, scales):
    """<8 x i32>: Σ u · x over each 4 bytes of the unsigned quants q and signed activations x
    (<32 x i8>), the products of bytes 2i and 2i + 1 times scales[i] (<16 x i16>). No sum
    saturates: |u · x| <= 63 · 127, so a pair is within 16002 of zero."""
    pairs = _call(builder, "llvm.x86.avx2.pmadd.ub.sw", vec(I16, 16), q, x)
    return _call(builder, "llvm.x86.avx2.pmadd.wd", vec(I32, 8), pairs, scales)


def k_row_dot8(name: str, n_tok: int):
    """An intrinsic dot(row, xq, dx, xs, t) -> n_tok float32 sums: the K type `name` (q4_k, q5_k,
    q6_k) row times tokens t .. t + n_tok - 1 of activations quantized as llama.cpp's Q8_K, C-order
    2-D arrays (or one token's rows with t = 0): per 256 elements one scale dx and int8 quants xq, with xs the sums of xq over each
    16 (cpu_quant_int8.quantize_k_blocks). Each block's quants and scales are decoded once for all
    the tokens. A block's products are summed in integers, each sub-block's times its integer
    scale; its mins (Q4_K, Q5_K) or its quants' bias of 32 (Q6_K) are taken against xs; the block
    then adds d · dx times its sum into one float vector per token, summed once per row. Both
    instruction sets run this code: AVX2 has every instruction it needs. Its float steps run in a
    fixed order (ORDERED), so that a token's sum is the same whichever tokens it is multiplied with."""
    size = _K_BYTES[name]

    @intrinsic
    def dot(typingctx, row, xq, dx, xs, t):
        def codegen(context, builder, sig, args):
            row_t, xq_t, dx_t, xs_t, _ = sig.args
            row, xq, dx, xs, t = args
            cols = builder.extract_value(context.make_array(xq_t)(context, builder, xq).shape, xq_t.ndim - 1)
            n_blocks = builder.udiv(builder.extract_value(context.make_array(row_t)(context, builder, row).shape, 0),
                                    ir.Constant(I64, size))
            tokens = [builder.add(t, ir.Constant(I64, i)) for i in range(n_tok)]
            accs = [cgutils.alloca_once_value(builder, const(F32, 8, 0.0)) for _ in range(n_tok)]
            with cgutils.for_range(builder, n_blocks) as loop:
                o = builder.mul(loop.index, ir.Constant(I64, size))
                if name == "q6_k":
                    scales = builder.sext(load(context, builder, row_t, row, at(builder, o, 192), I8, 16), vec(I16, 16))
                    d = f16_at(context, builder, row_t, row, at(builder, o, 208))
                else:
                    scales, mins = _k_scales_mins(context, builder, row_t, row, o)
                    d = f16_at(context, builder, row_t, row, o)
                    dmin = f16_at(context, builder, row_t, row, at(builder, o, 2))
                    mins = _pick(builder, mins, [j // 2 for j in range(16)])
                quants = _k_quants(context, builder, row_t, row, o, name)
                # Q6_K: a scale per 16 (pairs 0-7 the first, 8-15 the next); else one per 32
                per_sub = [_pick(builder, scales, [2 * j] * 8 + [2 * j + 1] * 8 if name == "q6_k" else [j] * 16)
                           for j in range(8)]
                for token, acc in zip(tokens, accs):
                    block = builder.add(builder.mul(token, builder.udiv(cols, ir.Constant(I64, 256))), loop.index)
                    e = builder.add(builder.mul(token, cols), builder.mul(loop.index, ir.Constant(I64, 256)))
                    sums = load(context, builder, xs_t, xs, builder.mul(block, ir.Constant(I64, 16)), I16, 16)
                    dxb = _scalar(context, builder, dx_t, dx, block, F32)
                    if name == "q6_k":   # the quants' bias: 32 · Σ_k scale_k · (the activations' sum over 16 k)
                        isum = builder.neg(builder.shl(_call(builder, "llvm.x86.avx2.pmadd.wd", vec(I32, 8), scales, sums),
                                                       const(I32, 8, 5)))
                    else:
                        isum = const(I32, 8, 0)
                    for j, q in enumerate(quants):
                        x = load(context, builder, xq_t, xq, at(builder, e, 32 * j), I8, 32)
                        isum = builder.add(isum, _scaled_pair_sums(builder, q, x, per_sub[j]))
                    total = builder.fmul(builder.sitofp(isum, vec(F32, 8)),
                                         broadcast(builder, builder.fmul(d, dxb, flags=ORDERED), 8), flags=ORDERED)
                    if name != "q6_k":
                        by_min = _call(builder, "llvm.x86.avx2.pmadd.wd", vec(I32, 8), mins, sums)
                        by_min = builder.fmul(builder.sitofp(by_min, vec(F32, 8)),
                                              broadcast(builder, builder.fmul(dmin, dxb, flags=ORDERED), 8), flags=ORDERED)
                        total = builder.fsub(total, by_min, flags=ORDERED)
                    builder.store(builder.fadd(builder.load(acc), total, flags=ORDERED), acc)
            return context.make_tuple(builder, sig.return_type, [fsum(builder, builder.load(a)) for a in accs])
        return types.UniTuple(types.float32, n_tok)(row, xq, dx, xs, t), codegen
    return dot
