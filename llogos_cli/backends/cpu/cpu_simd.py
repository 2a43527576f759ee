"""Block products written as LLVM vector IR (numba intrinsics), where numba's own loops fall short.

numba compiles Python loops over int8/int16 products to scalar code, and its float loops end each
sub-block with a horizontal sum. These intrinsics keep the products in vector registers instead:
- q4_k_row_dot: a whole Q4_K row in float32, 32 quants at a time converted, times their
  sub-block's scale and the activations, added into one vector that is summed once per row;
- q6_k_half_sums: 32 Q6_K quants and 32 int16 activations multiplied and added in pairs (the
  pattern LLVM turns into `vpmaddwd` on x86), each pair-sum times its sub-block's scale, the
  vector summed once per half block;
- plain_row_dot, plain_row_expand: a whole row of a 32-weight block type (Q8_0, Q4_0, Q4_1,
  Q5_0, Q5_1), each block's quants unpacked, converted and scaled as one float32 vector, then
  multiplied with the activations or stored;
- f32_rows_tile: a tile of float32 weight rows times up to 64 tokens, tokens across the lanes
  (cpu_rows).

The activations come as two int16 parts per 256 elements (cpu_quant.quantize_rows), so the
result is as exact as a float32 product: one part alone (x rounded to 16 bits of its block's
largest magnitude) put Gemma 3's logprobs 6e-3 off transformers' float32 ones, its activations
having outliers. Bounds, so that no int32 lane overflows: a lane sums 4 pair-sums of quants in
[-32, 31] with int8 scales, |sum| <= 4 * 2 * 32 * 32767 * 128 < 2^30.
"""

from contextlib import contextmanager

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F32 = ir.FloatType()
ROW_LANES = 16   # tokens in one vector of f32_rows_tile (one AVX-512 register)


def vec(t: ir.Type, n: int) -> ir.VectorType:
    return ir.VectorType(t, n)


def const(t: ir.Type, n: int, value: float) -> ir.Constant:
    return ir.Constant(vec(t, n), [value] * n)


def load(context, builder, array_type, array, offset, elem: ir.Type, n: int):
    """n elements of `array` from index `offset`, as one (unaligned) vector load."""
    data = context.make_array(array_type)(context, builder, array).data
    ptr = builder.bitcast(builder.gep(data, [offset]), vec(elem, n).as_pointer())
    return builder.load(ptr, align=1)


def at(builder, offset, k: int):
    return builder.add(offset, ir.Constant(offset.type, k))


def _pair_sums(builder, a, b):
    """(a * b) of two <32 x i32> vectors, adjacent products added: <16 x i32>."""
    p = builder.mul(a, b)
    even = builder.shuffle_vector(p, p, ir.Constant(vec(I32, 16), list(range(0, 32, 2))))
    odd = builder.shuffle_vector(p, p, ir.Constant(vec(I32, 16), list(range(1, 32, 2))))
    return builder.add(even, odd)


def _lanes(builder, scales, picks: list[int]):
    """<16 x i32> whose lane i is scales[picks[i]]."""
    return builder.shuffle_vector(scales, scales, ir.Constant(vec(I32, 16), picks))


def splat(builder, scalar_vector, n: int):
    """A <1 x T> vector's element in all n lanes."""
    return builder.shuffle_vector(scalar_vector, scalar_vector, ir.Constant(vec(I32, n), [0] * n))


def _sum(builder, v):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(I32, [vec(I32, 16)]),
                                        "llvm.vector.reduce.add.v16i32")
    return builder.call(fn, [v])


def fsum(builder, v):
    """The sum of a float vector's lanes, in any order."""
    n = v.type.count
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(F32, [F32, vec(F32, n)]),
                                        f"llvm.vector.reduce.fadd.v{n}f32")
    return builder.call(fn, [ir.Constant(F32, 0.0), v], fastmath=("reassoc",))


def broadcast(builder, scalar, n: int):
    """A float32 scalar in all n lanes."""
    return splat(builder, builder.insert_element(const(F32, 1, 0.0), scalar, ir.Constant(I32, 0)), n)


def f16_at(context, builder, row_t, row, offset):
    """The little-endian float16 at byte `offset` of row, as a float32 scalar."""
    half = builder.bitcast(load(context, builder, row_t, row, offset, I16, 1), vec(ir.HalfType(), 1))
    return builder.extract_element(builder.fpext(half, vec(F32, 1)), ir.Constant(I32, 0))


@intrinsic
def float_from_bits(typingctx, bits):
    """The float32 whose bit pattern is the int32 `bits` (exp32 sets an exponent this way)."""
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], F32)
    return types.float32(types.int32), codegen


@intrinsic
def q4_k_row_dot(typingctx, row, x, scales):
    """Σ over the Q4_K blocks of row of Σ_j scales[8b + j] · Σ_l q_jl · x[256b + 32j + l]: float32
    x, scales[8b + j] = d · (six-bit scale j) of block b; the mins are left to the caller. Block
    b's 32 bytes at 144b + 16 + 32g hold sub-block 2g in their low nibbles, 2g+1 in the high."""
    def codegen(context, builder, sig, args):
        row_t, x_t, scales_t = sig.args
        row, x, scales = args
        n_blocks = builder.udiv(builder.extract_value(context.make_array(row_t)(context, builder, row).shape, 0),
                                ir.Constant(I64, 144))
        acc = cgutils.alloca_once_value(builder, ir.Constant(vec(F32, 32), [0.0] * 32))
        with cgutils.for_range(builder, n_blocks) as loop:
            o, e, s = (builder.mul(loop.index, ir.Constant(I64, k)) for k in (144, 256, 8))
            total = builder.load(acc)
            for g in range(4):
                v = load(context, builder, row_t, row, at(builder, o, 16 + 32 * g), I8, 32)
                for k, q in enumerate((builder.and_(v, const(I8, 32, 15)), builder.lshr(v, const(I8, 32, 4)))):
                    xv = load(context, builder, x_t, x, at(builder, e, 64 * g + 32 * k), F32, 32)
                    scale = splat(builder, load(context, builder, scales_t, scales, at(builder, s, 2 * g + k), F32, 1), 32)
                    weights = builder.fmul(builder.uitofp(q, vec(F32, 32)), scale, flags=["fast"])
                    total = builder.fadd(total, builder.fmul(weights, xv, flags=["fast"]), flags=["fast"])
            builder.store(total, acc)
        return fsum(builder, builder.load(acc))
    return types.float32(row, x, scales), codegen


@intrinsic
def q6_k_half_sums(typingctx, row, o, h, xhi, xlo, e):
    """Σ scale · (q - 32) · x over half h (128 quants) of the Q6_K block at row[o], for both int16
    parts of the activations (xhi, xlo), whose elements start at index e: bytes i of
    ql[64h:64h+32], ql[64h+32:64h+64] and qh[32h:32h+32] hold elements 128h + 32 * quarter + i;
    int8 scales at row[o+192+8h+2*quarter+i//16]."""
    def codegen(context, builder, sig, args):
        row_t, _, _, x_t, _, _ = sig.args
        row, o, h, xhi, xlo, e = args
        ql = builder.add(o, builder.mul(h, ir.Constant(h.type, 64)))
        qh = builder.add(at(builder, o, 128), builder.mul(h, ir.Constant(h.type, 32)))
        a = load(context, builder, row_t, row, ql, I8, 32)
        c = load(context, builder, row_t, row, at(builder, ql, 32), I8, 32)
        bits = load(context, builder, row_t, row, qh, I8, 32)
        sc_at = builder.add(at(builder, o, 192), builder.mul(h, ir.Constant(h.type, 8)))
        sc = builder.sext(load(context, builder, row_t, row, sc_at, I8, 8), vec(I32, 8))
        low, two, four = const(I8, 32, 15), const(I8, 32, 3), const(I8, 32, 4)
        quants = (builder.or_(builder.and_(a, low), builder.shl(builder.and_(bits, two), four)),
                  builder.or_(builder.and_(c, low),
                              builder.shl(builder.and_(builder.lshr(bits, const(I8, 32, 2)), two), four)),
                  builder.or_(builder.lshr(a, four), builder.shl(builder.and_(builder.lshr(bits, four), two), four)),
                  builder.or_(builder.lshr(c, four), builder.shl(builder.lshr(bits, const(I8, 32, 6)), four)))
        acc = [const(I32, 16, 0), const(I32, 16, 0)]
        for quarter, q in enumerate(quants):
            w = builder.sext(builder.sub(q, const(I8, 32, 32)), vec(I32, 32))
            # pair-sums 0-7 come from elements 0-15 (one scale), 8-15 from 16-31 (the next)
            scale = _lanes(builder, sc, [2 * quarter] * 8 + [2 * quarter + 1] * 8)
            for part, x in enumerate((xhi, xlo)):
                xv = builder.sext(load(context, builder, x_t, x, at(builder, e, 32 * quarter), I16, 32), vec(I32, 32))
                acc[part] = builder.add(acc[part], builder.mul(_pair_sums(builder, w, xv), scale))
        return context.make_tuple(builder, sig.return_type, [_sum(builder, acc[0]), _sum(builder, acc[1])])
    return types.UniTuple(types.int32, 2)(row, o, h, xhi, xlo, e), codegen


# The plain 32-weight blocks: bytes, and the offsets of d (f16), m (f16: weight = d·q + m), the
# fifth bits qh (u32) and the quants; `bias` is subtracted from the quants of the types without m.
PLAIN = {  # name: (bytes, d, m, qh, qs, bias)
    "q8_0": (34, 0, None, None, 2, 0),
    "q4_0": (18, 0, None, None, 2, 8),
    "q4_1": (20, 0, 2, None, 4, 0),
    "q5_0": (22, 0, None, 2, 6, 16),
    "q5_1": (24, 0, 2, 4, 8, 0),
}


def plain_quants(context, builder, row_t, row, o, name: str):
    """The 32 stored quants of the `name` block at byte o of row as <32 x i8>, in element order
    (Q8_0's signed, the others' unsigned, their bias not yet taken off). A 4-bit type's 16 bytes
    hold elements 0-15 in their low nibbles, 16-31 in the high; Q5's u32 gives element j its fifth
    bit j."""
    _, _, _, qh_at, qs_at, _ = PLAIN[name]
    if name == "q8_0":
        return load(context, builder, row_t, row, at(builder, o, qs_at), I8, 32)
    v = load(context, builder, row_t, row, at(builder, o, qs_at), I8, 16)
    q = builder.shuffle_vector(builder.and_(v, const(I8, 16, 15)), builder.lshr(v, const(I8, 16, 4)),
                               ir.Constant(vec(I32, 32), list(range(32))))
    if qh_at is not None:
        qh = splat(builder, load(context, builder, row_t, row, at(builder, o, qh_at), I32, 1), 32)
        bits = builder.and_(builder.lshr(qh, ir.Constant(vec(I32, 32), list(range(32)))), const(I32, 32, 1))
        q = builder.or_(q, builder.shl(builder.trunc(bits, vec(I8, 32)), const(I8, 32, 4)))
    return q


def _plain_weights(context, builder, row_t, row, o, name: str):
    """The 32 weights of the `name` block at byte o of row, as one float32 vector."""
    _, d_at, m_at, _, _, bias = PLAIN[name]
    q = plain_quants(context, builder, row_t, row, o, name)
    q = builder.sext(q, vec(I32, 32)) if name == "q8_0" else builder.zext(q, vec(I32, 32))
    if bias:
        q = builder.sub(q, const(I32, 32, bias))
    weights = builder.fmul(builder.sitofp(q, vec(F32, 32)),
                           broadcast(builder, f16_at(context, builder, row_t, row, at(builder, o, d_at)), 32), flags=["fast"])
    if m_at is None:
        return weights
    return builder.fadd(weights, broadcast(builder, f16_at(context, builder, row_t, row, at(builder, o, m_at)), 32),
                        flags=["fast"])


@contextmanager
def each_block(context, builder, row_t, row, size: int):
    """A loop over the row's blocks of `size` bytes: yields the block's first byte and element."""
    n_blocks = builder.udiv(builder.extract_value(context.make_array(row_t)(context, builder, row).shape, 0),
                            ir.Constant(I64, size))
    with cgutils.for_range(builder, n_blocks) as loop:
        yield builder.mul(loop.index, ir.Constant(I64, size)), builder.mul(loop.index, ir.Constant(I64, 32))


def plain_row_dot(name: str):
    """An intrinsic dot(row, x) -> float32: Σ over the row's blocks of Σ_l w_l · x[32k + l] for
    the plain type `name` (q8_0, q4_0, q4_1, q5_0, q5_1), float32 x; the products are added into
    one vector, summed once per row."""
    size = PLAIN[name][0]

    @intrinsic
    def dot(typingctx, row, x):
        def codegen(context, builder, sig, args):
            row_t, x_t = sig.args
            row, x = args
            acc = cgutils.alloca_once_value(builder, const(F32, 32, 0.0))
            with each_block(context, builder, row_t, row, size) as (o, e):
                weights = _plain_weights(context, builder, row_t, row, o, name)
                xv = load(context, builder, x_t, x, e, F32, 32)
                builder.store(builder.fadd(builder.load(acc), builder.fmul(weights, xv, flags=["fast"]), flags=["fast"]), acc)
            return fsum(builder, builder.load(acc))
        return types.float32(row, x), codegen
    return dot


def plain_row_expand(name: str):
    """An intrinsic expand(row, out): the row's weights of the plain type `name`, into float32 out."""
    size = PLAIN[name][0]

    @intrinsic
    def expand(typingctx, row, out):
        def codegen(context, builder, sig, args):
            row_t, out_t = sig.args
            row, out = args
            data = context.make_array(out_t)(context, builder, out).data
            with each_block(context, builder, row_t, row, size) as (o, e):
                ptr = builder.bitcast(builder.gep(data, [e]), vec(F32, 32).as_pointer())
                builder.store(_plain_weights(context, builder, row_t, row, o, name), ptr, align=4)
            return context.get_dummy_value()
        return types.void(row, out), codegen
    return expand


def f32_rows_tile(rows: int, vectors: int):
    """An intrinsic tile(w, xt, out, n0, nr): out[r, n0 + i] = Σ_k w[n0 + i, k] · xt[k, r] for the
    nr <= `rows` weight rows from n0, every token r < out.shape[0]. xt (K, ROW_LANES · vectors)
    holds the tokens across its lanes, so each weight is one broadcast multiplied into `vectors`
    registers and the rows × vectors sums stay in registers for the whole of K. Every 16 elements
    (a cache line) the same stretch of the next tile's rows is prefetched into L2: the rows are
    short, interleaved streams that the hardware prefetcher alone would start too late. w's rows
    and out's rows are contiguous (each may have its own stride)."""
    lanes = ROW_LANES * vectors

    @intrinsic
    def tile(typingctx, w, xt, out, n0, nr):
        def codegen(context, builder, sig, args):
            wa, xa, oa = (context.make_array(t)(context, builder, a) for t, a in zip(sig.args[:3], args[:3]))
            n0, nr = args[3], args[4]
            k_len = builder.extract_value(wa.shape, 1)
            w_stride = builder.extract_value(wa.strides, 0)
            w_bytes = builder.bitcast(wa.data, I8.as_pointer())
            last = builder.sub(nr, ir.Constant(I64, 1))
            row_ptrs = []   # rows past nr repeat the last one (their sums are not stored)
            for i in range(rows):
                r = builder.select(builder.icmp_signed("<", ir.Constant(I64, i), nr), ir.Constant(I64, i), last)
                row_start = builder.gep(w_bytes, [builder.mul(builder.add(n0, r), w_stride)])
                row_ptrs.append(builder.bitcast(row_start, F32.as_pointer()))
            acc = [[cgutils.alloca_once_value(builder, const(F32, ROW_LANES, 0.0)) for _ in range(vectors)] for _ in range(rows)]
            prefetch = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [I8.as_pointer(), I32, I32, I32]), "llvm.prefetch.p0i8")
            next_tile = builder.mul(w_stride, ir.Constant(I64, rows))

            def step(k):
                xk = builder.gep(xa.data, [builder.mul(k, ir.Constant(I64, lanes))])
                xs = [builder.load(builder.bitcast(builder.gep(xk, [ir.Constant(I64, ROW_LANES * v)]), vec(F32, ROW_LANES).as_pointer()),
                                   align=4) for v in range(vectors)]
                for i in range(rows):
                    wk = broadcast(builder, builder.load(builder.gep(row_ptrs[i], [k])), ROW_LANES)
                    for v in range(vectors):
                        total = builder.fadd(builder.load(acc[i][v]), builder.fmul(wk, xs[v], flags=["fast"]), flags=["fast"])
                        builder.store(total, acc[i][v])

            n_blocks = builder.udiv(k_len, ir.Constant(I64, 16))
            with cgutils.for_range(builder, n_blocks) as loop:
                k0 = builder.mul(loop.index, ir.Constant(I64, 16))
                for i in range(rows):
                    ahead = builder.gep(builder.bitcast(row_ptrs[i], I8.as_pointer()),
                                        [builder.add(next_tile, builder.mul(k0, ir.Constant(I64, 4)))])
                    builder.call(prefetch, [ahead, ir.Constant(I32, 0), ir.Constant(I32, 2), ir.Constant(I32, 1)])
                for u in range(16):
                    step(at(builder, k0, u))
            with cgutils.for_range_slice(builder, builder.mul(n_blocks, ir.Constant(I64, 16)), k_len,
                                         ir.Constant(I64, 1)) as (k, _):
                step(k)

            sums = builder.bitcast(cgutils.alloca_once(builder, vec(F32, ROW_LANES), size=rows * vectors), F32.as_pointer())
            for i in range(rows):
                for v in range(vectors):
                    lane0 = builder.gep(sums, [ir.Constant(I64, (i * vectors + v) * ROW_LANES)])
                    builder.store(builder.load(acc[i][v]), builder.bitcast(lane0, vec(F32, ROW_LANES).as_pointer()), align=4)
            out_bytes = builder.bitcast(oa.data, I8.as_pointer())
            out_stride = builder.extract_value(oa.strides, 0)
            with cgutils.for_range(builder, builder.extract_value(oa.shape, 0)) as loop:
                token = loop.index
                out_row = builder.bitcast(builder.gep(out_bytes, [builder.mul(token, out_stride)]), F32.as_pointer())
                for i in range(rows):
                    with builder.if_then(builder.icmp_signed("<", ir.Constant(I64, i), nr)):
                        value = builder.load(builder.gep(sums, [builder.add(token, ir.Constant(I64, i * lanes))]))
                        builder.store(value, builder.gep(out_row, [builder.add(n0, ir.Constant(I64, i))]))
        return types.void(w, xt, out, n0, nr), codegen
    return tile
