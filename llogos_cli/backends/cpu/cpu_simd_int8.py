"""Block rows times 8-bit activations in integer SIMD, as llama.cpp multiplies them (LLVM vector IR
through numba intrinsics, like cpu_simd).

The plain types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) store a block as d, maybe m, and 32 quants u with
weight = d · (u - bias) + m; their activations come as llama.cpp's Q8_0 blocks of 32 (int8 xq, a
scale dx, x ≈ dx · xq, and xsum = Σ xq), so

    Σ_l w_l · x_l ≈ d · dx · Σ_l u_l · xq_l + (m - bias · d) · dx · xsum.

Their rows are tiled at load, TILE rows side by side (TILED, as llama.cpp's AMX back end repacks
them), so that one instruction multiplies every row of a tile by four activations broadcast to all
of them, and the rows' scales convert as one vector; no sum is folded across lanes:
- VNNI (AVX-512 VNNI): `vpdpbusd` on 512-bit vectors, four byte products summed into each row's
  int32 lane; nothing saturates, so Q8_0 takes its quants as u = q + 128 and 128 · xsum comes off;
- AVX-VNNI (Intel's client CPUs): the same `vpdpbusd` on two 256-bit halves (rows 0-7, 8-15);
  Q8_0's bytes become |q| times xq with q's sign (`vpsignb`), which needs no correction;
- AVX2: two 256-bit halves, `vpmaddubsw` (byte pairs summed into int16, saturating), as many of
  them added in int16 as the quants' size leaves room for (INT16_WORDS: eight words of 4-bit
  quants, 2 · 15 · 127 each), then one `vpmaddwd` by ones (into int32): about half the multiplies
  of a `vpmaddwd` per `vpmaddubsw` (both issue on the same multiply ports). Q8_0 could reach the
  int16 limit in one pair, so there the bytes become |q| times xq with q's sign, widened each.
All give the exact integer sums, and the float steps after them are the same.

The K types (k_tile_dot8) take one scale per 256 activations (llama.cpp's Q8_K), so a block's
sub-blocks add up in integers. Their rows are tiled the same way (K_TILED): a group of 32 weights
of every row of a tile takes eight words' products (_rows_sums), which leave each row's integer sum
in its own lane, one `vpmulld` multiplies the sums by the rows' scales of the group, and one conversion serves a
block of every row.

The instruction set is a compile-time choice: the kernels take `isa` as a NumPy scalar whose type
names it (ISA_ARG), so that each set is its own specialisation in numba's cache and a test can
run the AVX2 code on a VNNI machine. Which set runs is chosen from the CPU's flags (host_isas);
LLVM compiles a set's kernels only for a CPU that has it.
"""

import numpy as np
from llvmlite import ir
from llvmlite import binding as llvm
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from llogos_cli.gguf.quants import IQ4_NL_VALUES, MXFP4_VALUES
from llogos_cli.backends.cpu.cpu_simd import (
    F32,
    I8,
    I16,
    I32,
    I64,
    at,
    broadcast,
    const,
    load,
    vec,
)

# A float operation's flag that lets LLVM fuse a multiply into an add (the same in every kernel) but
# not regroup a sum: numba's fastmath pass marks every float operation that has no flag `fast`,
# which would let LLVM regroup a sum differently in kernels of one token and of several (k_row_dot8),
# and a batched row then differ from the same row alone.
ORDERED = ("contract",)
# The sets these kernels are written for, best first: AVX-512 VNNI; AVX-VNNI (the same `vpdpbusd`
# in a VEX encoding, 256 bits only: Intel's client CPUs since Alder Lake); AVX2.
ISA_ARG = {"vnni": np.int8(0), "avxvnni": np.int32(0), "avx2": np.int16(0)}   # the type of the scalar is what counts
_ISA_OF_TYPE = {types.int8: "vnni", types.int32: "avxvnni", types.int16: "avx2"}
# The CPU flags each set needs, as LLVM names them.
ISA_FEATURES = {"vnni": ("avx512vnni", "avx512vl"), "avxvnni": ("avxvnni", "avx2"), "avx2": ("avx2",)}


def host_isas(features=None) -> list[str]:
    """The instruction sets of ISA_ARG this CPU can run, best first, from its flags (LLVM's view of
    the host's, or `features`, a mapping of flag to bool)."""
    if features is None:
        features = llvm.get_host_cpu_features()
    return [isa for isa, needed in ISA_FEATURES.items() if all(features.get(f, False) for f in needed)]


def host_isa(features=None) -> str | None:
    """The best instruction set this CPU has for these kernels; None: none of them."""
    return next(iter(host_isas(features)), None)


# How far ahead of the tile-block a kernel multiplies it asks for the rows' bytes (`prefetcht0`). A
# product of a decode step is short: the hardware's prefetchers, which start afresh on every 4 KiB
# page, leave each thread waiting on memory at every call's start and page.
PREFETCH_AHEAD = 2048
CACHE_LINE = 64


def _prefetch(context, builder, rows_t, rows, o, n_bytes: int):
    """Ask for the cache lines of rows' n_bytes from byte o + PREFETCH_AHEAD (past the array's end
    too: a prefetch never faults)."""
    data = context.make_array(rows_t)(context, builder, rows).data
    for k in range(0, n_bytes, CACHE_LINE):
        ptr = builder.gep(data, [at(builder, o, PREFETCH_AHEAD + k)])
        _call(builder, "llvm.prefetch.p0", ir.VoidType(), ptr, ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1))


def _call(builder, name: str, ret: ir.Type, *args):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


# The plain types' rows as cpu_quant_int8.tile_rows lays them out: TILE rows at a time, each of
# their 32-weight blocks side by side as one tile-block. In a tile-block: the TILE rows' d (and m)
# as TILE float16s each, Q5's fifth bits as eight 64-bit masks, then the quants as vectors of 64
# bytes in which int32 lane i holds row i's: four vectors of nibbles for the 4- and 5-bit types
# (byte b of lane i of vector n: row i's quant 4n + b in the low nibble, 16 + 4n + b in the high),
# eight of signed bytes for Q8_0 (vector n: quants 4n..4n+3); mask 2n + h's bit 4i + b is the fifth
# bit of quant 16h + 4n + b of row i. MXFP4 keeps its scales as their E8M0 bytes (2^(e - 128)
# each, MXFP4's values doubled) and its nibbles as Q4_0's, each an index into MXFP4_U, the values
# plus 12. name: (bytes, d at, m at, masks at, quants at, the quants' bias).
TILE = 16
TILED = {
    "q8_0": (TILE * 34, 0, None, None, 32, 0),
    "q4_0": (TILE * 18, 0, None, None, 32, 8),
    "q4_1": (TILE * 20, 0, 32, None, 64, 0),
    "q5_0": (TILE * 22, 0, None, 32, 96, 16),
    "q5_1": (TILE * 24, 0, 32, 64, 128, 0),
    "mxfp4": (TILE * 17, 0, None, None, TILE, 12),
    "iq4_nl": (TILE * 18, 0, None, None, 32, 0),
}
MXFP4_U = [int(v) + 12 for v in MXFP4_VALUES]   # unsigned, 0..24: a nibble's u, looked up in one shuffle
IQ4_NL_Q = [int(v) for v in IQ4_NL_VALUES]      # signed, -127..113: a nibble's quant, looked up likewise
# Types whose quants are signed bytes (IQ4_NL's looked up in its 16 levels, -127..113), multiplied
# as Q8_0's are: VNNI takes q + 128 and 128 Σ xq off again, AVX2 |q| times xq with q's sign.
SIGNED = ("q8_0", "iq4_nl")
# Types whose quants are half their bytes' high nibbles (Q4_0's and Q4_1's quants 16..31, Q4_K's
# odd groups): on the VNNI sets the nibble is multiplied where it lies, as 16 u (at most 240,
# unsigned, as `vpdpbusd` takes it), and its words' int32 sum (at most 8 · 4 · 240 · 127 in
# magnitude) shifted right by 4 after, exactly: one shift a block or group instead of one a
# vector. AVX2's `vpmaddubsw` would saturate on 2 · 240 · 127. The plain types' only with VNNI's
# 512 bits: on AVX-VNNI's two halves, the second sum's shift and add cost what the shifts saved.
# name: the sets that do it.
HIGH_IN_PLACE = {"q4_0": ("vnni",), "q4_1": ("vnni",), "q4_k": ("vnni", "avxvnni")}


def _tile_halves(context, builder, rows_t, rows, o):
    """The TILE float16s at byte o of rows as <TILE x float>."""
    halves = builder.bitcast(load(context, builder, rows_t, rows, o, I16, TILE), vec(ir.HalfType(), TILE))
    return builder.fpext(halves, vec(F32, TILE))


def _tile_e8m0(context, builder, rows_t, rows, o):
    """The TILE E8M0 bytes at byte o of rows as <TILE x float> 2^(e - 128): float32's bits (e - 1) << 23,
    or for e 0 and 1 (below float32's normal numbers) the subnormal 2^21 << e."""
    e = builder.zext(load(context, builder, rows_t, rows, o, I8, TILE), vec(I32, TILE))
    normal = builder.shl(builder.sub(e, const(I32, TILE, 1)), const(I32, TILE, 23))
    tiny = builder.shl(const(I32, TILE, 1 << 21), e)
    bits = builder.select(builder.icmp_unsigned(">=", e, const(I32, TILE, 2)), normal, tiny)
    return builder.bitcast(bits, vec(F32, TILE))


def _lookup(builder, isa: str, table: list, q):
    """Each byte of q (<64 x i8>, 0..15) replaced by table[q]: `vpshufb` within each 16-byte lane,
    on 512 bits with VNNI's AVX-512, on two 256-bit halves with AVX2."""
    if isa == "vnni":
        return _call(builder, "llvm.x86.avx512.pshuf.b.512", vec(I8, 64), ir.Constant(vec(I8, 64), table * 4), q)
    halves = [_call(builder, "llvm.x86.avx2.pshuf.b", vec(I8, 32), ir.Constant(vec(I8, 32), table * 2),
                    builder.shuffle_vector(q, q, ir.Constant(vec(I32, 32), list(range(32 * h, 32 * h + 32)))))
              for h in range(2)]
    return builder.shuffle_vector(halves[0], halves[1], ir.Constant(vec(I32, 64), list(range(64))))


def _tile_quants(context, builder, rows_t, rows, o, name: str, isa: str) -> list:
    """A tile-block's quants as eight <64 x i8>, vector g holding each row's quants 4g..4g+3 (Q8_0's
    and IQ4_NL's signed, the others' unsigned; MXFP4's and IQ4_NL's looked up in MXFP4_U, IQ4_NL_Q)."""
    _, _, _, masks_at, quants_at, _ = TILED[name]
    if name == "q8_0":
        return [load(context, builder, rows_t, rows, at(builder, o, quants_at + 64 * n), I8, 64) for n in range(8)]
    low = const(I8, 64, 15)
    packed = [load(context, builder, rows_t, rows, at(builder, o, quants_at + 64 * n), I8, 64) for n in range(4)]
    if isa in HIGH_IN_PLACE.get(name, ()):   # 16 u as it lies: _tile_isum shifts the sum
        return [builder.and_(v, low) for v in packed] + [builder.and_(v, const(I8, 64, 0xF0 - 256)) for v in packed]
    high = [builder.bitcast(builder.lshr(builder.bitcast(v, vec(I16, 32)), const(I16, 32, 4)), vec(I8, 64)) for v in packed]
    quants = [builder.and_(v, low) for v in packed + high]
    if name == "mxfp4":
        return [_lookup(builder, isa, MXFP4_U, q) for q in quants]
    if name == "iq4_nl":
        return [_lookup(builder, isa, IQ4_NL_Q, q) for q in quants]
    if masks_at is not None:   # the fifth bit where the mask has it
        for g in range(8):
            bits = builder.bitcast(load(context, builder, rows_t, rows, at(builder, o, masks_at + 8 * (2 * (g % 4) + g // 4)),
                                        I64, 1), vec(ir.IntType(1), 64))
            quants[g] = builder.select(bits, builder.or_(quants[g], const(I8, 64, 16)), quants[g])
    return quants


def _tile_isum(builder, isa: str, name: str, quants: list, words, total):
    """<TILE x i32>: each row's Σ quant · xq over a block, from its eight vectors of quants and the
    block's eight int32 words of activations `words` (<8 x i32>); `total` (<1 x i32>) is Σ xq.
    _rows_sums over the eight words; with VNNI, Q8_0's signed quants taken as q + 128 there, 128 Σ xq
    comes off again. The exact integer on every set."""
    signed = name in SIGNED

    def word(g):
        return builder.shuffle_vector(words, words, ir.Constant(vec(I32, 1), [g]))
    if isa in HIGH_IN_PLACE.get(name, ()):   # words 4-7 times 16 u: their sum shifted apart
        low, high = _rows_sums(builder, isa, quants, word, [range(4), range(4, 8)], signed, name)
        return builder.add(low, builder.ashr(high, const(I32, TILE, 4)))
    isum = _rows_sums(builder, isa, quants, word, [range(8)], signed, name)[0]
    if isa == "vnni" and signed:
        isum = builder.sub(isum, builder.shl(builder.shuffle_vector(total, total, ir.Constant(vec(I32, TILE), [0] * TILE)),
                                             const(I32, TILE, 7)))
    return isum


def tile_dot8(name: str, n_tok: int):
    """An intrinsic dot(rows, c, xq, dx, xsum, t, isa, sums): tile c of the tiled plain-type rows
    (TILED; tile c's bytes from c · TILE · rows.shape[1] on, so a last tile may lie past the array's
    rows, in memory the array's own) times tokens t .. t + n_tok - 1 of the activations as
    cpu_quant_int8.quantize_blocks lays them out (llama.cpp's Q8_0: int8 xq in element order, per
    block of 32 its scale dx and xsum = Σ xq): sums[TILE k + i] = row i's sum for token t + k. A
    block's quants are unpacked once for all the tokens; per token and block

        Σ_l w_l · x_l ≈ dx · d · Σ u · xq + (m - bias · d) · dx · xsum

    in a fixed order of float steps (ORDERED, explicit fused steps), so that a token's sums do not
    depend on the tokens beside it, and the same on both instruction sets."""
    size, d_at, m_at, _, _, bias = TILED[name]

    @intrinsic
    def dot(typingctx, rows, c, xq, dx, xsum, t, isa, sums):
        if isa not in _ISA_OF_TYPE:
            return None
        chosen = _ISA_OF_TYPE[isa]

        def codegen(context, builder, sig, args):
            rows_t, _, xq_t, dx_t, xs_t, _, _, sums_t = sig.args
            rows, c, xq, dx, xsum, t, _, sums = args
            row_bytes = builder.extract_value(context.make_array(rows_t)(context, builder, rows).shape, 1)
            tile_bytes = builder.mul(row_bytes, ir.Constant(I64, TILE))
            first = builder.mul(c, tile_bytes)   # offsets from the array's first byte
            per_token = builder.udiv(builder.extract_value(context.make_array(xq_t)(context, builder, xq).shape, 1),
                                     ir.Constant(I64, 32))
            n_blocks = builder.udiv(tile_bytes, ir.Constant(I64, size))
            accs = [cgutils.alloca_once_value(builder, const(F32, TILE, 0.0)) for _ in range(n_tok)]
            with cgutils.for_range(builder, n_blocks) as loop:
                o = builder.add(first, builder.mul(loop.index, ir.Constant(I64, size)))
                _prefetch(context, builder, rows_t, rows, o, size)
                scales = _tile_e8m0 if name == "mxfp4" else _tile_halves
                d = scales(context, builder, rows_t, rows, at(builder, o, d_at))
                offset = _tile_halves(context, builder, rows_t, rows, at(builder, o, m_at)) if m_at is not None else None
                if bias:
                    offset = builder.fmul(d, const(F32, TILE, -float(bias)), flags=ORDERED)
                quants = _tile_quants(context, builder, rows_t, rows, o, name, chosen)
                for k, acc in enumerate(accs):
                    block = builder.add(builder.mul(builder.add(t, ir.Constant(I64, k)), per_token), loop.index)
                    words = load(context, builder, xq_t, xq, builder.mul(block, ir.Constant(I64, 32)), I32, 8)
                    total = load(context, builder, xs_t, xsum, block, I32, 1)
                    isum = _tile_isum(builder, chosen, name, quants, words, total)
                    dxv = load(context, builder, dx_t, dx, block, F32, 1)
                    scale = builder.fmul(d, builder.shuffle_vector(dxv, dxv, ir.Constant(vec(I32, TILE), [0] * TILE)), flags=ORDERED)
                    a = _call(builder, "llvm.fma.v16f32", vec(F32, TILE), builder.sitofp(isum, vec(F32, TILE)), scale,
                              builder.load(acc))
                    if offset is not None:
                        sx = builder.fmul(dxv, builder.sitofp(total, vec(F32, 1)), flags=ORDERED)
                        a = _call(builder, "llvm.fma.v16f32", vec(F32, TILE), offset,
                                  builder.shuffle_vector(sx, sx, ir.Constant(vec(I32, TILE), [0] * TILE)), a)
                    builder.store(a, acc)
            out = context.make_array(sums_t)(context, builder, sums).data
            for k, acc in enumerate(accs):
                ptr = builder.bitcast(builder.gep(out, [ir.Constant(I64, TILE * k)]), vec(F32, TILE).as_pointer())
                builder.store(builder.load(acc), ptr, align=4)
            return context.get_dummy_value()
        return types.none(rows, c, xq, dx, xsum, t, isa, sums), codegen
    return dot


# The K types' rows as cpu_quant_int8.tile_rows lays them out: TILE rows at a time, each of their
# 256-weight blocks side by side as one tile-block: the TILE rows' d (and dmin) as TILE float16s,
# their sub-block scales (and mins) as one byte a row, sub-block by sub-block (Q6_K's signed), then
# the quants as vectors of 64 bytes in which int32 lane i holds row i's. Vector 8g + n of nibbles
# holds, at byte b of lane i, quant 4n + b of row i's 32-weight groups 2g (low nibble) and 2g + 1
# (high); Q5_K's fifth bits are 64 masks (8j + n: bit 4i + b for quant 4n + b of group j), Q6_K's
# two high bits are 16 vectors (4g + n, n < 4), byte b of lane i holding those of quant 4n + b of
# groups 2g, 2g + 1 (bits 0-3) and of quant 16 + 4n + b of both (bits 4-7). Q3_K's three-bit quants
# (0..7 for weights d · scale · (u - 4)) keep their two low bits as Q6_K keeps its two high ones
# (16 vectors, 4g + n) and their third as Q5_K keeps its fifth (64 masks), and its signed six-bit
# scales a byte each, per 16 as Q6_K's. IQ4_XS's nibbles are laid out as Q4_K's (each group's 32
# in element order), its eight six-bit scales less 32 a signed byte each. Q2_K's quants (0..3 for
# weights d · scale · u - dmin · min) keep Q3_K's two low bits' layout, and each of its 16 bytes of a
# four-bit scale (low) and min (high) per 16 stays as it is, a byte a row: its tiles are its blocks' size. Each is TILE times the GGUF block's bytes but Q4_K's and
# Q5_K's, whose six-bit scales and mins take a byte each, and Q3_K's (114 bytes a row for 110).
# name: (bytes, d at, dmin at, scales at, mins at, quants at, high bits at).
K_TILED = {
    "q2_k": (TILE * 84, 0, 32, 64, 64, 320, None),
    "q3_k": (TILE * 114, 0, None, 32, None, 288, 1312),
    "q4_k": (TILE * 148, 0, 32, 64, 192, 320, None),
    "q5_k": (TILE * 180, 0, 32, 64, 192, 320, 2368),
    "q6_k": (TILE * 210, 0, None, 32, None, 288, 2336),
    "iq4_xs": (TILE * 138, 0, None, 32, None, 160, None),
}
# The quants' bias of the types with one signed scale per 16 (weight = d · scale · (u - bias)), as a shift.
_BIAS_SHIFT = {"q3_k": 2, "q6_k": 5}
# K types whose quants are signed bytes: IQ4_XS's nibbles looked up in IQ4_NL's levels (IQ4_NL_Q),
# weight = d · scale · q with one signed scale per 32, multiplied as SIGNED's plain types are.
K_SIGNED = ("iq4_xs",)


# The largest quant u of each unsigned type (MXFP4's looked up in MXFP4_U), which bounds the int16
# pair-sums of AVX2's `vpmaddubsw` (2 · u · 127, the activations' |xq| <= 127): INT16_WORDS[name]
# words' of them add up in int16 before one `vpmaddwd` widens them, instead of one each.
_U_MAX = {"q4_0": 15, "q4_1": 15, "q5_0": 31, "q5_1": 31, "mxfp4": max(MXFP4_U),
          "q2_k": 3, "q3_k": 7, "q4_k": 15, "q5_k": 31, "q6_k": 63}
INT16_WORDS = {name: (2 ** 15 - 1) // (2 * u * 127) for name, u in _U_MAX.items()}


def _rows_sums(builder, isa: str, quants: list, word, spans: list, signed: bool, name: str) -> list:
    """For each span of word indices, <TILE x i32>: each row's Σ over the span's words n of the
    four products of its unsigned bytes in quants[n] (<64 x i8>, lane i row i's) by the signed bytes
    of activation word `word(n)` (<1 x i32>), broadcast to every row. signed: the quants are signed
    bytes q, taken as q + 128 with VNNI (the caller takes 128 Σ xq off again), as |q| times xq with
    q's sign on the 256-bit sets. VNNI: one 512-bit `vpdpbusd` a word; AVX-VNNI: one 256-bit
    `vpdpbusd` a word and half (rows 0-7, 8-15); AVX2: `vpmaddubsw` a word and half, its int16
    pair-sums added over INT16_WORDS[name] words (one, signed), then widened by `vpmaddwd` by ones."""
    out = []
    for span in spans:
        if isa == "vnni":
            acc = const(I32, TILE, 0)
            for n in span:
                u = builder.xor(quants[n], const(I8, 64, -128)) if signed else quants[n]
                acc = _call(builder, "llvm.x86.avx512.vpdpbusd.512", vec(I32, TILE), acc, builder.bitcast(u, vec(I32, TILE)),
                            builder.shuffle_vector(word(n), word(n), ir.Constant(vec(I32, TILE), [0] * TILE)))
            out.append(acc)
            continue
        halves = [const(I32, 8, 0), const(I32, 8, 0)]
        run = 1 if signed or isa != "avx2" else INT16_WORDS[name]
        span = list(span)
        for start in range(0, len(span), run):
            pairs = [None, None]
            for n in span[start:start + run]:
                x = builder.bitcast(builder.shuffle_vector(word(n), word(n), ir.Constant(vec(I32, 8), [0] * 8)), vec(I8, 32))
                for h in range(2):
                    part = builder.shuffle_vector(quants[n], quants[n], ir.Constant(vec(I32, 32), list(range(32 * h, 32 * h + 32))))
                    xh = x
                    if signed:
                        xh = _call(builder, "llvm.x86.avx2.psign.b", vec(I8, 32), x, part)
                        part = _call(builder, "llvm.abs.v32i8", vec(I8, 32), part, ir.Constant(ir.IntType(1), 0))
                    if isa == "avxvnni":
                        halves[h] = _call(builder, "llvm.x86.avx512.vpdpbusd.256", vec(I32, 8), halves[h],
                                          builder.bitcast(part, vec(I32, 8)), builder.bitcast(xh, vec(I32, 8)))
                        continue
                    p = _call(builder, "llvm.x86.avx2.pmadd.ub.sw", vec(I16, 16), part, xh)
                    pairs[h] = p if pairs[h] is None else builder.add(pairs[h], p)
            if isa == "avx2":
                for h in range(2):
                    halves[h] = builder.add(halves[h], _call(builder, "llvm.x86.avx2.pmadd.wd", vec(I32, 8), pairs[h],
                                                             const(I16, 16, 1)))
        out.append(builder.shuffle_vector(halves[0], halves[1], ir.Constant(vec(I32, TILE), list(range(TILE)))))
    return out


def _k_tile_groups(context, builder, rows_t, rows, o, name: str, g, isa: str) -> list:
    """Groups 2g and 2g + 1 of a K tile-block (g an i64 value): two lists of eight <64 x i8> of
    quants (unsigned; K_SIGNED's signed), vector n holding each row's quants 4n..4n+3 of the group."""
    _, _, _, _, _, quants_at, high_at = K_TILED[name]
    low = const(I8, 64, 15)

    def base(per_g: int):   # o + per_g · g
        return builder.add(o, builder.mul(g, ir.Constant(I64, per_g)))

    def two_bits(at_byte: int) -> list:   # Q6_K's high bits' layout: groups[k][n + 4 part] = bits 2k + 4 part, 2k + 4 part + 1
        out = [[None] * 8, [None] * 8]
        for n in range(4):
            v = load(context, builder, rows_t, rows, at(builder, base(256), at_byte + 64 * n), I8, 64)
            for k in range(2):
                for part in range(2):
                    out[k][n + 4 * part] = builder.and_(builder.lshr(v, const(I8, 64, 2 * k + 4 * part)), const(I8, 64, 3))
        return out

    def with_masks(groups: list, bit: int) -> list:   # Q5_K's fifth bits' layout: mask 8k + n, bit 4i + b
        for k in range(2):
            for n in range(8):
                bits = builder.bitcast(load(context, builder, rows_t, rows, at(builder, base(128), high_at + 8 * (8 * k + n)), I64, 1),
                                       vec(ir.IntType(1), 64))
                groups[k][n] = builder.select(bits, builder.or_(groups[k][n], const(I8, 64, bit)), groups[k][n])
        return groups
    if name == "q3_k":
        return with_masks(two_bits(quants_at), 4)
    if name == "q2_k":
        return two_bits(quants_at)
    nibbles = [load(context, builder, rows_t, rows, at(builder, base(512), quants_at + 64 * n), I8, 64) for n in range(8)]
    if isa in HIGH_IN_PLACE.get(name, ()):   # 16 u as it lies: the caller shifts the sum
        return [[builder.and_(v, low) for v in nibbles], [builder.and_(v, const(I8, 64, 0xF0 - 256)) for v in nibbles]]
    groups = [[builder.and_(v, low) for v in nibbles],
              [builder.and_(builder.bitcast(builder.lshr(builder.bitcast(v, vec(I16, 32)), const(I16, 32, 4)), vec(I8, 64)), low)
               for v in nibbles]]
    if name == "q5_k":
        return with_masks(groups, 16)
    if name == "iq4_xs":
        return [[_lookup(builder, isa, IQ4_NL_Q, q) for q in group] for group in groups]
    if name == "q6_k":
        high = two_bits(high_at)
        for k in range(2):
            for n in range(8):
                groups[k][n] = builder.or_(groups[k][n], builder.shl(high[k][n], const(I8, 64, 4)))
    return groups


def _k_scales(context, builder, rows_t, rows, o, at_byte: int, j, signed: bool):
    """Sub-block j's scale (or min) of every row of a tile-block as <TILE x i32> (j an int or an i64 value)."""
    if isinstance(j, int):
        j = ir.Constant(I64, j)
    v = load(context, builder, rows_t, rows, builder.add(at(builder, o, at_byte), builder.mul(j, ir.Constant(I64, TILE))), I8, TILE)
    return (builder.sext if signed else builder.zext)(v, vec(I32, TILE))


def k_tile_dot8(name: str, n_tok: int):
    """An intrinsic dot(rows, c, xq, dx, xs, t, isa, sums): tile c of the tiled K-type rows (K_TILED;
    tile c's bytes from c · TILE · rows.shape[1] on) times tokens t .. t + n_tok - 1 of llama.cpp's
    Q8_K activations in element order (cpu_quant_int8.quantize_k_blocks: int8 xq, a scale dx per 256
    and xs, int32 sums of xq over each 16): sums[TILE k + i] = row i's sum for token t + k. Per
    block, a group's `_rows_sums` leave every row's integer sum; times the rows' scales in
    integers (`vpmulld`), the mins (Q4_K, Q5_K per 32; Q2_K per 16) or the quants' bias (4 for Q3_K, 32 for Q6_K, 128
    for IQ4_XS's signed quants with VNNI) taken against xs,
    then d · dx times the block's sums into one float vector per token, in a fixed order of steps
    (ORDERED), so that a token's sums do not depend on the tokens beside it."""
    size, d_at, dmin_at, scales_at, mins_at, _, _ = K_TILED[name]
    signed = name in K_SIGNED

    @intrinsic
    def dot(typingctx, rows, c, xq, dx, xs, t, isa, sums):
        if isa not in _ISA_OF_TYPE:
            return None
        chosen = _ISA_OF_TYPE[isa]

        def codegen(context, builder, sig, args):
            rows_t, _, xq_t, dx_t, xs_t, _, _, sums_t = sig.args
            rows, c, xq, dx, xs, t, _, sums = args
            tile_bytes = builder.mul(builder.extract_value(context.make_array(rows_t)(context, builder, rows).shape, 1),
                                     ir.Constant(I64, TILE))
            first = builder.mul(c, tile_bytes)   # offsets from the array's first byte
            per_token = builder.udiv(builder.extract_value(context.make_array(xq_t)(context, builder, xq).shape, 1),
                                     ir.Constant(I64, 256))
            n_blocks = builder.udiv(tile_bytes, ir.Constant(I64, size))
            accs = [cgutils.alloca_once_value(builder, const(F32, TILE, 0.0)) for _ in range(n_tok)]
            with cgutils.for_range(builder, n_blocks) as loop:
                o = builder.add(first, builder.mul(loop.index, ir.Constant(I64, size)))
                _prefetch(context, builder, rows_t, rows, o, size)
                blocks = [builder.add(builder.mul(builder.add(t, ir.Constant(I64, k)), per_token), loop.index) for k in range(n_tok)]
                sums_at = [cgutils.alloca_once_value(builder, const(I32, TILE, 0)) for _ in range(n_tok)]
                # A loop over pairs of groups, not the blocks' code unrolled: unrolled, LLVM loads and
                # unpacks the quants of every group at once and spills them (~160 stack accesses a block).
                with cgutils.for_range(builder, ir.Constant(I64, 4)) as groups_loop:
                    g = groups_loop.index
                    totals = [builder.load(a) for a in sums_at]
                    groups = _k_tile_groups(context, builder, rows_t, rows, o, name, g, chosen)
                    for kk, quants in enumerate(groups):
                        j = builder.add(builder.mul(g, ir.Constant(I64, 2)), ir.Constant(I64, kk))
                        if name in _BIAS_SHIFT or name == "q2_k":   # a scale per 16
                            scales = [_k_scales(context, builder, rows_t, rows, o, scales_at,
                                                builder.add(builder.mul(j, ir.Constant(I64, 2)), ir.Constant(I64, h)),
                                                name != "q2_k")
                                      for h in range(2)]
                            if name == "q2_k":   # the low four bits of the scale-and-min byte
                                scales = [builder.and_(s, const(I32, TILE, 15)) for s in scales]
                        else:
                            scale = _k_scales(context, builder, rows_t, rows, o, scales_at, j, signed)
                        for k, block in enumerate(blocks):
                            e = builder.add(builder.mul(block, ir.Constant(I64, 256)), builder.mul(j, ir.Constant(I64, 32)))
                            words = load(context, builder, xq_t, xq, e, I32, 8)
                            per16 = name in _BIAS_SHIFT or name == "q2_k"   # the group's first and second 16 apart
                            isums = _rows_sums(builder, chosen, quants,
                                               lambda n: builder.shuffle_vector(words, words, ir.Constant(vec(I32, 1), [n])),
                                               [range(4), range(4, 8)] if per16 else [range(8)], signed, name)
                            if name in _BIAS_SHIFT:   # (Σ u · x - bias · Σ x) · scale, per 16
                                for h in range(2):
                                    s = load(context, builder, xs_t, xs, builder.add(builder.mul(block, ir.Constant(I64, 16)),
                                             builder.add(builder.mul(j, ir.Constant(I64, 2)), ir.Constant(I64, h))), I32, 1)
                                    s = builder.shl(builder.shuffle_vector(s, s, ir.Constant(vec(I32, TILE), [0] * TILE)),
                                                    const(I32, TILE, _BIAS_SHIFT[name]))
                                    totals[k] = builder.add(totals[k], builder.mul(builder.sub(isums[h], s), scales[h]))
                            elif name == "q2_k":
                                for h in range(2):
                                    totals[k] = builder.add(totals[k], builder.mul(isums[h], scales[h]))
                            else:
                                isum = isums[0]
                                if kk == 1 and chosen in HIGH_IN_PLACE.get(name, ()):   # Σ 16 u · x, exactly
                                    isum = builder.ashr(isum, const(I32, TILE, 4))
                                if signed and chosen == "vnni":   # less 128 Σ xq over the group's 32
                                    s = load(context, builder, xs_t, xs, builder.add(builder.mul(block, ir.Constant(I64, 16)),
                                                                                     builder.mul(j, ir.Constant(I64, 2))), I32, 2)
                                    s = builder.add(builder.shuffle_vector(s, s, ir.Constant(vec(I32, TILE), [0] * TILE)),
                                                    builder.shuffle_vector(s, s, ir.Constant(vec(I32, TILE), [1] * TILE)))
                                    isum = builder.sub(isum, builder.shl(s, const(I32, TILE, 7)))
                                totals[k] = builder.add(totals[k], builder.mul(isum, scale))
                    for a, total in zip(sums_at, totals):
                        builder.store(total, a)
                totals = [builder.load(a) for a in sums_at]
                d = _tile_halves(context, builder, rows_t, rows, at(builder, o, d_at))
                if dmin_at is not None:   # Σ min · Σ xq per token, in floats: integers below 2^24, exact in any order
                    dmin = _tile_halves(context, builder, rows_t, rows, at(builder, o, dmin_at))
                    per16 = name == "q2_k"   # a min per 16 (the high four bits of its scale's byte), else per 32
                    pairs = []
                    for block in blocks:
                        sums16 = load(context, builder, xs_t, xs, builder.mul(block, ir.Constant(I64, 16)), I32, 16)
                        pairs.append(builder.sitofp(sums16, vec(F32, 16)) if per16 else builder.sitofp(builder.add(
                            builder.shuffle_vector(sums16, sums16, ir.Constant(vec(I32, 8), list(range(0, 16, 2)))),
                            builder.shuffle_vector(sums16, sums16, ir.Constant(vec(I32, 8), list(range(1, 16, 2))))), vec(F32, 8)))
                    by_min = [const(F32, TILE, 0.0) for _ in blocks]
                    for j in range(16 if per16 else 8):
                        m = _k_scales(context, builder, rows_t, rows, o, mins_at, j, False)
                        m = builder.uitofp(builder.lshr(m, const(I32, TILE, 4)) if per16 else m, vec(F32, TILE))
                        for k, p in enumerate(pairs):
                            by_min[k] = _call(builder, "llvm.fma.v16f32", vec(F32, TILE), m,
                                              builder.shuffle_vector(p, p, ir.Constant(vec(I32, TILE), [j] * TILE)), by_min[k])
                for k, (block, acc) in enumerate(zip(blocks, accs)):
                    dxv = load(context, builder, dx_t, dx, block, F32, 1)
                    dxs = builder.shuffle_vector(dxv, dxv, ir.Constant(vec(I32, TILE), [0] * TILE))
                    total = builder.fmul(builder.sitofp(totals[k], vec(F32, TILE)), builder.fmul(d, dxs, flags=ORDERED), flags=ORDERED)
                    if dmin_at is not None:   # less the mins' part, in one explicit fused step
                        total = _call(builder, "llvm.fma.v16f32", vec(F32, TILE), builder.fneg(by_min[k]),
                                      builder.fmul(dmin, dxs, flags=ORDERED), total)
                    builder.store(builder.fadd(builder.load(acc), total, flags=ORDERED), acc)
            out = context.make_array(sums_t)(context, builder, sums).data
            for k, acc in enumerate(accs):
                ptr = builder.bitcast(builder.gep(out, [ir.Constant(I64, TILE * k)]), vec(F32, TILE).as_pointer())
                builder.store(builder.load(acc), ptr, align=4)
            return context.get_dummy_value()
        return types.none(rows, c, xq, dx, xs, t, isa, sums), codegen
    return dot


def quantize8(block: int, per_sum: int):
    """An intrinsic q(x, xq, dx, xs, t): token t's activations (row t of x, float32) as llama.cpp
    quantizes them for these products, a block of `block` elements at a time: dx[t, b] = d =
    max|x| / 127, xq[t] = x · (1 / d) rounded to the nearest integer (ties to even; 0 where d is 0),
    and xs[t] the sums of xq over each per_sum elements. A block's elements are loaded, their
    largest magnitude found, scaled, rounded and summed in vector registers (numba's scalar loop
    took a float `max` per element, one after another)."""
    n = block // 16   # vectors of 16 floats a block

    def _store(context, builder, array_t, array, offset, value):
        data = context.make_array(array_t)(context, builder, array).data
        builder.store(value, builder.bitcast(builder.gep(data, [offset]), value.type.as_pointer()), align=1)

    @intrinsic
    def q(typingctx, x, xq, dx, xs, t):
        def codegen(context, builder, sig, args):
            x_t, xq_t, dx_t, xs_t, _ = sig.args
            x, xq, dx, xs, t = args

            def row(array_t, array):   # the offset of row t of a C-ordered matrix
                return builder.mul(t, builder.extract_value(context.make_array(array_t)(context, builder, array).shape, 1))

            x_row, xq_row, dx_row, xs_row = row(x_t, x), row(xq_t, xq), row(dx_t, dx), row(xs_t, xs)
            f16 = vec(F32, 16)
            n_blocks = builder.udiv(builder.extract_value(context.make_array(x_t)(context, builder, x).shape, 1),
                                    ir.Constant(I64, block))
            with cgutils.for_range(builder, n_blocks) as loop:
                o = builder.mul(loop.index, ir.Constant(I64, block))
                vs = [load(context, builder, x_t, x, builder.add(x_row, at(builder, o, 16 * i)), F32, 16) for i in range(n)]
                top = _call(builder, "llvm.fabs.v16f32", f16, vs[0])
                for v in vs[1:]:
                    top = _call(builder, "llvm.maxnum.v16f32", f16, top, _call(builder, "llvm.fabs.v16f32", f16, v))
                amax = _call(builder, "llvm.vector.reduce.fmax.v16f32", F32, top)
                d = builder.fdiv(amax, ir.Constant(F32, 127.0))
                inv = builder.select(builder.fcmp_ordered(">", d, ir.Constant(F32, 0.0)),
                                     builder.fdiv(ir.Constant(F32, 1.0), d), ir.Constant(F32, 0.0))
                invs = broadcast(builder, inv, 16)
                qs = [builder.fptosi(_call(builder, "llvm.rint.v16f32", f16, builder.fmul(v, invs)), vec(I32, 16)) for v in vs]
                for i, qv in enumerate(qs):
                    _store(context, builder, xq_t, xq, builder.add(xq_row, at(builder, o, 16 * i)), builder.trunc(qv, vec(I8, 16)))
                per = per_sum // 16
                for j in range(n // per):
                    s = qs[per * j]
                    for qv in qs[per * j + 1:per * j + per]:
                        s = builder.add(s, qv)
                    total = _call(builder, "llvm.vector.reduce.add.v16i32", I32, s)
                    _store(context, builder, xs_t, xs,
                           builder.add(xs_row, builder.add(builder.mul(loop.index, ir.Constant(I64, n // per)), ir.Constant(I64, j))),
                           total)
                _store(context, builder, dx_t, dx, builder.add(dx_row, loop.index), d)
            return context.get_dummy_value()
        return types.none(x, xq, dx, xs, t), codegen
    return q
