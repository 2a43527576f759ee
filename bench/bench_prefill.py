"""Prompt products alone on the GPU: int8 tensor cores against dequantizing to f16 for cuBLAS.

    PYTHONPATH=. python bench/bench_prefill.py [--tokens 512,64] [--reps 20] [--json FILE]

For each weight type of cuda_matmul.INT8_TYPES and each of bench_cuda's PRODUCT_SHAPES (Llama-3.1-8B's
and Llama-3.2-1B's matrices), the median GPU time of one product of T tokens both ways a prompt can
take it: "int8", the activations quantized (quantize_q8) and multiplied against the GGUF blocks on
tensor cores (matmul_q8_mma); "f16", the matrix dequantized to float16 in row chunks and multiplied
by cuBLAS (with the activations' conversion), the path of the types without int8 products. Each
time covers the whole of its path. Prints a Markdown table for docs/PERF.md.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_cuda import PRODUCT_SHAPES, median_gpu_ms  # noqa: E402
from synthetic import RandomBytes, random_matrix  # noqa: E402

from llogos_cli.backends.cuda import cuda_matmul  # noqa: E402

TYPES = (Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.Q4_K, Q.Q6_K)
assert set(TYPES) == cuda_matmul.INT8_TYPES


def bench_prompt_products(tokens: tuple[int, ...] = (512, 64), shapes=PRODUCT_SHAPES, reps: int = 20,
                          backend=None) -> list[dict]:
    """One row per type, shape, token count and path: {type, rows, cols, tokens, path, us, TOPS}
    (TOPS: 2 * tokens * rows * cols operations per second, in 10^12)."""
    import cupy

    from llogos_cli.backends.cuda.cuda_backend import CudaBackend

    b, src = backend or CudaBackend(), RandomBytes(2)
    scratch = cuda_matmul.Scratch(b.xp)
    out = []
    for qtype in TYPES:
        for rows, cols in shapes:
            w = b.matrix(random_matrix(src, qtype, rows, cols), qtype, True)
            for n in tokens:
                x = cupy.asarray(src.rng.standard_normal((n, cols), np.float32))
                paths = {"int8": lambda i, x=x, w=w: cuda_matmul.matmul(b.kernels, x, w, scratch, cuda_matmul.quantize_q8(b.kernels, x)),
                         "f16": lambda i, x=x, w=w: cuda_matmul.matmul(b.kernels, x, w, scratch)}
                for path, run in paths.items():
                    ms = median_gpu_ms(run, reps, warmup=2)
                    out.append({"type": qtype.name, "rows": rows, "cols": cols, "tokens": n, "path": path,
                                "us": 1e3 * ms, "TOPS": 2 * n * rows * cols / ms / 1e9})
            w = None
            cupy.get_default_memory_pool().free_all_blocks()
    return out


def report(rows: list[dict]) -> None:
    print("| type | rows x cols | tokens | int8 tensor cores | f16 dequantize + cuBLAS | f16 / int8 |\n|---|---|---|---|---|---|")
    pairs = {}
    for r in rows:
        pairs.setdefault((r["type"], r["rows"], r["cols"], r["tokens"]), {})[r["path"]] = r
    for (qtype, n_rows, cols, n), p in pairs.items():
        i8, f16 = p["int8"], p["f16"]
        print(f"| {qtype} | {n_rows} x {cols} | {n} | {i8['us']:.1f} us, {i8['TOPS']:.0f} TOPS "
              f"| {f16['us']:.1f} us, {f16['TOPS']:.0f} TOPS | {f16['us'] / i8['us']:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="512,64", help="tokens a product (a prompt, a batch)")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    from llogos_cli.backends import cuda_available
    if not cuda_available():
        sys.exit("bench_prefill needs CuPy and a CUDA GPU")
    rows = bench_prompt_products(tuple(int(n) for n in args.tokens.split(",") if n), reps=args.reps)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    report(rows)


if __name__ == "__main__":
    main()
