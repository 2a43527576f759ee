"""Attention's two products over KEYS positions at a time, as LLVM vector IR (numba intrinsics, like
cpu_simd): numba's loop over one key's dot product ends each key with a horizontal sum of a vector,
which took most of a decode step's attention.

- key_scores: KEYS keys' dot products with one query. Each key's products are added in a vector
  of its own, then the KEYS vectors are summed across their lanes together, halving and pairing
  them (a shuffle and an add a vector a level), into one vector of KEYS scores;
- value_sums: KEYS values, each times its probability broadcast to every lane, added into the
  output's running sums (one vector per 16 of its elements, loaded and stored once a call).

Both take the cache's arrays whole, with the flat index of the first key (value): the KEYS rows
follow one another in memory (one block of the cache holds them), a head's row length being a
multiple of LANES (HEAD_MULTIPLE); the caller takes any other length, and the positions left over
past the last whole KEYS, one at a time. The arrays hold float32, or float16 as their uint16 bit
patterns (numba has no float16 on the CPU), widened as they are loaded (one vcvtph2ps a vector):
an f16 cache is read at half the bytes, with no float32 copy; as_float and half_bits do the same
for one element.
"""

from contextlib import contextmanager

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from llogos_cli.backends.cpu.cpu_simd import F32, I16, I32, I64, broadcast, const, load, vec

LANES = 16           # float32 lanes of one vector (AVX-512)
KEYS = 16            # positions one call takes
HEAD_MULTIPLE = LANES
_HALF = ir.HalfType()


def _floats(context, builder, array_t, array, offset):
    """LANES elements of a float32 or float16 (uint16) array from index `offset`, as float32."""
    if array_t.dtype == types.float32:
        return load(context, builder, array_t, array, offset, F32, LANES)
    bits = load(context, builder, array_t, array, offset, I16, LANES)
    return builder.fpext(builder.bitcast(bits, vec(_HALF, LANES)), vec(F32, LANES))


@intrinsic
def as_float(typingctx, x):
    """A float32, or the float16 whose bit pattern is the uint16 x, as float32."""
    if x == types.float32:
        return types.float32(x), lambda context, builder, sig, args: args[0]
    if x == types.uint16:
        return types.float32(x), lambda context, builder, sig, args: builder.fpext(builder.bitcast(args[0], _HALF), F32)


@intrinsic
def half_bits(typingctx, x):
    """The bit pattern of float32 x rounded to float16 (to nearest, ties to even, as NumPy rounds)."""
    if x == types.float32:
        return types.uint16(x), lambda context, builder, sig, args: builder.bitcast(builder.fptrunc(args[0], _HALF), I16)


def _store(context, builder, array_t, array, offset, value):
    data = context.make_array(array_t)(context, builder, array).data
    builder.store(value, builder.bitcast(builder.gep(data, [offset]), value.type.as_pointer()), align=1)


def _prefetch_next(context, builder, array_t, array, first, d):
    """Ask for the next KEYS rows after those at `first` (float index; rows of d floats): the memory
    the next call reads. (This host's hardware prefetchers do not follow the rows.)"""
    data = builder.bitcast(context.make_array(array_t)(context, builder, array).data, ir.IntType(8).as_pointer())
    size = ir.Constant(I64, array_t.dtype.bitwidth // 8)
    start = builder.mul(builder.add(first, builder.mul(d, ir.Constant(I64, KEYS))), size)
    prefetch = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [data.type, I32, I32, I32]),
                                              "llvm.prefetch.p0i8")
    with cgutils.for_range(builder, builder.udiv(builder.mul(builder.mul(d, size), ir.Constant(I64, KEYS)),
                                                 ir.Constant(I64, 64))) as loop:
        ptr = builder.gep(data, [builder.add(start, builder.mul(loop.index, ir.Constant(I64, 64)))])
        builder.call(prefetch, [ptr, ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])


def _lane_sums(builder, vectors: list):
    """KEYS vectors of LANES floats -> one vector whose lane m is the sum of vector m's lanes: each
    level pairs the vectors and adds, lane by lane, the halves of each one's runs of lanes."""
    run = LANES   # lanes that hold one key's partial sums
    while len(vectors) > 1:
        half = run // 2
        firsts = [g * run + i for g in range(LANES // run) for i in range(half)]
        lows = firsts + [LANES + f for f in firsts]
        highs = [i + half for i in lows]
        vectors = [builder.fadd(builder.shuffle_vector(a, b, ir.Constant(vec(I32, LANES), lows)),
                                builder.shuffle_vector(a, b, ir.Constant(vec(I32, LANES), highs)), flags=("fast",))
                   for a, b in zip(vectors[0::2], vectors[1::2])]
        run = half
    return vectors[0]


def _fma(builder):
    f16 = vec(F32, LANES)
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(f16, [f16, f16, f16]), "llvm.fma.v16f32")


@contextmanager
def _chunks(context, builder, array_t, array, first, d, prefetch):
    """Over the KEYS rows of d floats from flat index `first` (with prefetch, the next KEYS rows
    asked for first), LANES floats at a time: yields (c, rows), c the chunk's offset in a row, rows
    the KEYS rows' vectors there."""
    if prefetch:
        _prefetch_next(context, builder, array_t, array, first, d)
    with cgutils.for_range(builder, builder.udiv(d, ir.Constant(I64, LANES))) as loop:
        c = builder.mul(loop.index, ir.Constant(I64, LANES))
        row = builder.add(first, c)
        yield c, [_floats(context, builder, array_t, array, builder.add(row, builder.mul(d, ir.Constant(I64, m))))
                  for m in range(KEYS)]


def _key_scores(prefetch: bool):
    def codegen(context, builder, sig, args):
        k_t, _, qs_t, scores_t, _ = sig.args
        k, first, qs, scores, j = args
        fma = _fma(builder)
        accs = [cgutils.alloca_once_value(builder, const(F32, LANES, 0.0)) for _ in range(KEYS)]
        d = builder.extract_value(context.make_array(qs_t)(context, builder, qs).shape, 0)
        with _chunks(context, builder, k_t, k, first, d, prefetch) as (c, keys):
            q = load(context, builder, qs_t, qs, c, F32, LANES)
            for key, acc in zip(keys, accs):
                builder.store(builder.call(fma, [q, key, builder.load(acc)]), acc)
        _store(context, builder, scores_t, scores, j, _lane_sums(builder, [builder.load(a) for a in accs]))
        return context.get_dummy_value()
    return codegen


def _value_sums(prefetch: bool):
    def codegen(context, builder, sig, args):
        v_t, _, probs_t, _, acc_t = sig.args
        v, first, probs, j, acc = args
        fma = _fma(builder)
        p = load(context, builder, probs_t, probs, j, F32, KEYS)
        ps = [broadcast(builder, builder.extract_element(p, ir.Constant(I32, m)), LANES) for m in range(KEYS)]
        d = builder.extract_value(context.make_array(acc_t)(context, builder, acc).shape, 0)
        with _chunks(context, builder, v_t, v, first, d, prefetch) as (c, values):
            total = load(context, builder, acc_t, acc, c, F32, LANES)
            for pm, value in zip(ps, values):
                total = builder.call(fma, [pm, value, total])
            _store(context, builder, acc_t, acc, c, total)
        return context.get_dummy_value()
    return codegen


def _intrinsic(name: str, codegen_for, prefetch: bool, doc: str):
    """An intrinsic (array, first, vector, vector, j) over a float32 or float16 (uint16) array in C order."""
    def typer(typingctx, array, first, a, b, c):
        if getattr(array, "layout", None) == "C" and array.dtype in (types.float32, types.uint16):
            return types.none(array, first, a, b, c), codegen_for(prefetch)
    typer.__name__ = typer.__qualname__ = name
    typer.__doc__ = doc
    return intrinsic(typer)


key_scores = _intrinsic("key_scores", _key_scores, True, """key_scores(k, first, qs, scores, j):
    scores[j + m] = Σ_i qs[i] · k.flat[first + m · d + i] for m < KEYS, d = len(qs).""")
value_sums = _intrinsic("value_sums", _value_sums, True, """value_sums(v, first, probs, j, acc):
    acc[i] += Σ_m probs[j + m] · v.flat[first + m · d + i] for m < KEYS, d = len(acc).""")
# The same for keys and values already near the core (a prompt's chunk, read again for every query
# of its tile), where asking for the next rows only spends instructions.
cached_key_scores = _intrinsic("cached_key_scores", _key_scores, False, key_scores.__doc__)
cached_value_sums = _intrinsic("cached_value_sums", _value_sums, False, value_sums.__doc__)
