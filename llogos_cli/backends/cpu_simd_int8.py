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
sub-blocks add up in integers. Their rows are repacked at load (K_PACKED) so that each int32 lane
of a 256-bit vector gathers one 32-weight group of the block, the activations quantized in the same
order: the same instruction as above (`_dot4`) then leaves each group's sum in its own lane, which
one `vpmulld` multiplies by the groups' scales, and one conversion serves the block. In GGUF's own
order a group's quants fill whole vectors, and each needs its scale broadcast and its sum folded
on its own: the repacking halves the instructions a block costs.

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
    at,
    broadcast,
    const,
    f16_at,
    fsum,
    load,
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


def _scalar(context, builder, array_t, array, index, elem: ir.Type):
    return builder.extract_element(load(context, builder, array_t, array, index, elem, 1), ir.Constant(I32, 0))


# The plain types' rows as cpu_quant_int8.packed_rows lays them out: two blocks at a time (a pair,
# the second all zeros past an odd count), their d (and m) as two float16s, then their quants so
# that int32 lanes 0-3 of a vector hold the first block's, 4-7 the second's: A (elements 0-15 of
# each) and B (16-31), the 4-bit types' 32 bytes of nibbles as they are (low nibbles A, high B),
# Q8_0's 64 bytes as A then B; Q5's fifth bits as two u32 masks, bit p for byte p of A, then of B.
# name: (bytes, d at, m at, masks at, quants at, the quants' bias).
PLAIN_PACKED = {
    "q8_0": (68, 0, None, None, 4, 0),
    "q4_0": (36, 0, None, None, 4, 8),
    "q4_1": (40, 0, 2 * 2, None, 8, 0),
    "q5_0": (44, 0, None, 4, 12, 16),
    "q5_1": (48, 0, 4, 8, 16, 0),
}


def _pair_quants(context, builder, row_t, row, o, name: str) -> list:
    """A pair's quants as the vectors A and B (<32 x i8>): unsigned, except Q8_0's."""
    _, _, _, masks_at, qs_at, _ = PLAIN_PACKED[name]
    if name == "q8_0":
        return [load(context, builder, row_t, row, at(builder, o, qs_at + 32 * h), I8, 32) for h in range(2)]
    v = load(context, builder, row_t, row, at(builder, o, qs_at), I8, 32)
    quants = [builder.and_(v, const(I8, 32, 15)), builder.lshr(v, const(I8, 32, 4))]
    if masks_at is not None:   # the fifth bit where the mask has it
        bits = [builder.bitcast(load(context, builder, row_t, row, at(builder, o, masks_at + 4 * h), I32, 1),
                                vec(ir.IntType(1), 32)) for h in range(2)]
        quants = [builder.select(b, builder.or_(q, const(I8, 32, 16)), q) for q, b in zip(quants, bits)]
    return quants


def _pair_halves(context, builder, row_t, row, at_byte):
    """The two float16s at at_byte, each in four lanes of a <8 x float>."""
    two = builder.bitcast(load(context, builder, row_t, row, at_byte, I16, 2), vec(ir.HalfType(), 2))
    wide = builder.fpext(two, vec(F32, 2))
    return builder.shuffle_vector(wide, wide, ir.Constant(vec(I32, 8), [0] * 4 + [1] * 4))


def plain_row_dot8(name: str, n_tok: int):
    """An intrinsic dot(row, xq, dx, sx, t, isa) -> n_tok float32 sums: the packed plain-type row
    (PLAIN_PACKED) times tokens t .. t + n_tok - 1 of activations as cpu_quant_int8.quantize_blocks
    lays them out (C-order 2-D): per pair of blocks, 64 int8 quants (A then B) and, per int32
    lane, the scale dx of its block and sx = dx · the sum of the lane's eight quants. A pair's
    quants are unpacked once for all the tokens; `_dot4` leaves each lane's integer sum, and

        Σ_l w_l · x_l ≈ Σ_lanes dx · d · Σ u · xq + (m - bias · d) · sx

    adds into one float vector per token, summed once per row, in a fixed order (ORDERED), so that
    a token's sum does not depend on the tokens beside it. Q8_0's signed quants multiply as |q|
    times x with q's sign (`vpsignb`), whose byte pair-sums stay within int16 for AVX2, and both
    instruction sets then compute the same sums."""
    size, d_at, m_at, _, _, stored_bias = PLAIN_PACKED[name]

    @intrinsic
    def dot(typingctx, row, xq, dx, sx, t, isa):
        if isa not in _ISA_OF_TYPE:
            return None
        chosen = _ISA_OF_TYPE[isa]

        def codegen(context, builder, sig, args):
            row_t, xq_t, dx_t, sx_t, _, _ = sig.args
            row, xq, dx, sx, t, _ = args
            per_token = builder.udiv(builder.extract_value(context.make_array(xq_t)(context, builder, xq).shape,
                                                           xq_t.ndim - 1), ir.Constant(I64, 64))
            n_pairs = builder.udiv(builder.extract_value(context.make_array(row_t)(context, builder, row).shape, 0),
                                   ir.Constant(I64, size))
            tokens = [builder.add(t, ir.Constant(I64, i)) for i in range(n_tok)]
            accs = [cgutils.alloca_once_value(builder, const(F32, 8, 0.0)) for _ in range(n_tok)]
            with cgutils.for_range(builder, n_pairs) as loop:
                o = builder.mul(loop.index, ir.Constant(I64, size))
                d = _pair_halves(context, builder, row_t, row, at(builder, o, d_at))
                offset = _pair_halves(context, builder, row_t, row, at(builder, o, m_at)) if m_at is not None else None
                if stored_bias:
                    offset = builder.fmul(d, const(F32, 8, -float(stored_bias)), flags=ORDERED)
                quants = _pair_quants(context, builder, row_t, row, o, name)
                if name == "q8_0":
                    signs, quants = quants, [_call(builder, "llvm.abs.v32i8", vec(I8, 32), q, ir.Constant(ir.IntType(1), 0))
                                             for q in quants]
                for token, acc in zip(tokens, accs):
                    pair = builder.add(builder.mul(token, per_token), loop.index)
                    xs = [load(context, builder, xq_t, xq, builder.add(builder.mul(pair, ir.Constant(I64, 64)),
                                                                       ir.Constant(I64, 32 * h)), I8, 32) for h in range(2)]
                    if name == "q8_0":
                        xs = [_call(builder, "llvm.x86.avx2.psign.b", vec(I8, 32), x, q) for x, q in zip(xs, signs)]
                    isum = _dot4(builder, chosen, _dot4(builder, chosen, const(I32, 8, 0), quants[0], xs[0]), quants[1], xs[1])
                    lanes = builder.mul(pair, ir.Constant(I64, 8))
                    scaled = builder.fmul(builder.sitofp(isum, vec(F32, 8)), load(context, builder, dx_t, dx, lanes, F32, 8),
                                          flags=ORDERED)
                    pair_sum = builder.fmul(scaled, d, flags=ORDERED)
                    if offset is not None:   # one explicit fused step: LLVM's own choice of what to fuse could differ by kernel
                        pair_sum = _call(builder, "llvm.fma.v8f32", vec(F32, 8), offset,
                                         load(context, builder, sx_t, sx, lanes, F32, 8), pair_sum)
                    # one addition a pair on the accumulator's chain, the rest beside it
                    builder.store(builder.fadd(builder.load(acc), pair_sum, flags=ORDERED), acc)
            return context.make_tuple(builder, sig.return_type, [fsum(builder, builder.load(a)) for a in accs])
        return types.UniTuple(types.float32, n_tok)(row, xq, dx, sx, t, isa), codegen
    return dot


# The K types' rows as pack_k_rows lays them out (cpu_quant_int8): per 256-weight block, its float16
# scale(s), its sub-block scales (and mins) one byte each, then its quants so that byte b of lane i
# (bytes 4i..4i+3) of unpacked vector m holds quant 32i + 4m + b: each of a vector's eight int32
# lanes gathers one 32-weight group of the block. name: (bytes, scales at, quants at, high bits at).
K_PACKED = {
    "q4_k": (148, 4, 20, None),   # d, dmin; 8 scales, 8 mins (u8); qs: 4 × 32 bytes of nibbles
    "q5_k": (180, 4, 52, 20),     # as Q4_K, plus 32 bytes: bit m of byte 4i + b is quant (i, m, b)'s fifth
    "q6_k": (210, 2, 18, 146),    # d; 16 scales (i8); ql as Q4_K's qs; qh: 2 × 32 bytes of 2-bit highs
}


def _dot4(builder, isa: str, acc, u, x):
    """acc (<8 x i32>) plus, in each lane, the sum of its four products of unsigned bytes u by signed
    bytes x (<32 x i8>): `vpdpbusd` with VNNI; `vpmaddubsw` then `vpmaddwd` by ones with AVX2, whose
    pair-sums (at most 2 · 63 · 127) do not saturate."""
    if isa == "vnni":
        return _call(builder, "llvm.x86.avx512.vpdpbusd.256", vec(I32, 8), acc,
                     builder.bitcast(u, vec(I32, 8)), builder.bitcast(x, vec(I32, 8)))
    pairs = _call(builder, "llvm.x86.avx2.pmadd.ub.sw", vec(I16, 16), u, x)
    return builder.add(acc, _call(builder, "llvm.x86.avx2.pmadd.wd", vec(I32, 8), pairs, const(I16, 16, 1)))


def _shift(builder, v, left: int):
    """v's bytes shifted left by `left` bits (right if negative)."""
    if left > 0:
        return builder.shl(v, const(I8, 32, left))
    return builder.lshr(v, const(I8, 32, -left)) if left < 0 else v


def _packed_quants(context, builder, row_t, row, o, name: str) -> list:
    """The eight unpacked <32 x i8> vectors of unsigned quants of the packed block at byte o."""
    _, _, qs_at, high_at = K_PACKED[name]
    low, four = const(I8, 32, 15), const(I8, 32, 4)
    nibbles = [load(context, builder, row_t, row, at(builder, o, qs_at + 32 * n), I8, 32) for n in range(4)]
    quants = [builder.and_(v, low) for v in nibbles] + [builder.lshr(v, four) for v in nibbles]
    if name == "q5_k":   # bit m of the high bytes to bit 4
        high = load(context, builder, row_t, row, at(builder, o, high_at), I8, 32)
        return [builder.or_(q, builder.and_(_shift(builder, high, 4 - m), const(I8, 32, 16))) for m, q in enumerate(quants)]
    if name == "q6_k":   # bits 2k, 2k + 1 of high vector m // 4 (k = m % 4) to bits 4, 5
        highs = [load(context, builder, row_t, row, at(builder, o, high_at + 32 * h), I8, 32) for h in range(2)]
        return [builder.or_(q, builder.and_(_shift(builder, highs[m // 4], 4 - 2 * (m % 4)), const(I8, 32, 48)))
                for m, q in enumerate(quants)]
    return quants


def _block_scales(context, builder, row_t, row, o, name: str, scales_at: int):
    """A packed block's sub-block scales as <8 x i32>: Q6_K's two vectors (its even and its odd
    16-weight sub-blocks, signed), the others' scales and mins (unsigned)."""
    def eight(k: int, extend):
        return extend(load(context, builder, row_t, row, at(builder, o, scales_at + 8 * k), I8, 8), vec(I32, 8))
    if name == "q6_k":
        return eight(0, builder.sext), eight(1, builder.sext)
    return eight(0, builder.zext), eight(1, builder.zext)


def k_row_dot8(name: str, n_tok: int):
    """An intrinsic dot(row, xq, dx, xs, t, isa) -> n_tok float32 sums: the packed K-type row (q4_k,
    q5_k, q6_k; see K_PACKED) times tokens t .. t + n_tok - 1 of the activations as
    cpu_quant_int8.quantize_k_blocks lays them out (C-order 2-D arrays): per 256 elements one scale
    dx and int8 quants xq in the weights' lane order, and xs (int32, 16 per block) the sums of xq over
    each group's first and its second 16. Each block's quants are unpacked once for all the tokens;
    each unpacked vector adds into eight int32 lanes, one per 32-weight group, by `_dot4`, so a
    block's integer sums come out one per group, to be multiplied by the group's scale in integers,
    the mins (Q4_K, Q5_K) or the quants' bias of 32 (Q6_K) taken against xs; then d · dx times the
    block's sums is added into one float vector per token, summed once per row. A token's float steps
    run in a fixed order (ORDERED), so that its sum does not depend on the tokens beside it."""
    size, scales_at, _, _ = K_PACKED[name]

    @intrinsic
    def dot(typingctx, row, xq, dx, xs, t, isa):
        if isa not in _ISA_OF_TYPE:
            return None
        chosen = _ISA_OF_TYPE[isa]

        def codegen(context, builder, sig, args):
            row_t, xq_t, dx_t, xs_t, _, _ = sig.args
            row, xq, dx, xs, t, _ = args
            cols = builder.extract_value(context.make_array(xq_t)(context, builder, xq).shape, xq_t.ndim - 1)
            per_token = builder.udiv(cols, ir.Constant(I64, 256))
            n_blocks = builder.udiv(builder.extract_value(context.make_array(row_t)(context, builder, row).shape, 0),
                                    ir.Constant(I64, size))
            tokens = [builder.add(t, ir.Constant(I64, i)) for i in range(n_tok)]
            accs = [cgutils.alloca_once_value(builder, const(F32, 8, 0.0)) for _ in range(n_tok)]
            zero = const(I32, 8, 0)
            with cgutils.for_range(builder, n_blocks) as loop:
                o = builder.mul(loop.index, ir.Constant(I64, size))
                d = f16_at(context, builder, row_t, row, o)
                first, second = _block_scales(context, builder, row_t, row, o, name, scales_at)
                quants = _packed_quants(context, builder, row_t, row, o, name)
                if name != "q6_k":
                    dmin = f16_at(context, builder, row_t, row, at(builder, o, 2))
                for token, acc in zip(tokens, accs):
                    block = builder.add(builder.mul(token, per_token), loop.index)
                    e = builder.mul(block, ir.Constant(I64, 256))
                    xv = [load(context, builder, xq_t, xq, at(builder, e, 32 * m), I8, 32) for m in range(8)]
                    sums = [load(context, builder, xs_t, xs, builder.add(builder.mul(block, ir.Constant(I64, 16)),
                                                                         ir.Constant(I64, 8 * h)), I32, 8) for h in range(2)]
                    dxb = _scalar(context, builder, dx_t, dx, block, F32)
                    # two chains of four: the first and the second 16 of each group
                    halves = []
                    for h in range(2):
                        a = zero
                        for m in range(4 * h, 4 * h + 4):
                            a = _dot4(builder, chosen, a, quants[m], xv[m])
                        halves.append(a)
                    if name == "q6_k":   # (Σ q · x - 32 Σ x) · scale, per 16
                        isum = builder.add(*(builder.mul(builder.sub(a, builder.shl(s, const(I32, 8, 5))), sc)
                                             for a, s, sc in zip(halves, sums, (first, second))))
                    else:
                        isum = builder.mul(builder.add(*halves), first)
                    total = builder.fmul(builder.sitofp(isum, vec(F32, 8)),
                                         broadcast(builder, builder.fmul(d, dxb, flags=ORDERED), 8), flags=ORDERED)
                    if name != "q6_k":   # less the mins' part, in one explicit fused step (as plain_row_dot8)
                        by_min = builder.sitofp(builder.neg(builder.mul(builder.add(*sums), second)), vec(F32, 8))
                        total = _call(builder, "llvm.fma.v8f32", vec(F32, 8), by_min,
                                      broadcast(builder, builder.fmul(dmin, dxb, flags=ORDERED), 8), total)
                    builder.store(builder.fadd(builder.load(acc), total, flags=ORDERED), acc)
            return context.make_tuple(builder, sig.return_type, [fsum(builder, builder.load(a)) for a in accs])
        return types.UniTuple(types.float32, n_tok)(row, xq, dx, xs, t, isa), codegen
    return dot
