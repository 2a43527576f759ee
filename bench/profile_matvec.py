"""The one-token product kernels alone on a GPU, for tuning them: each weight type and number of
rows a warp (cuda_matmul.rows_per_warp) on Llama-3.1-8B's ffn_up shape, timed over 1, 4 and 8
copies of the matrix taken in turn (one copy stays in the 50 MB L2; eight stream from memory).
With --launches N each variant is only launched N times, for Nsight Compute:

    ncu --clock-control none -k regex:matvec --section SpeedOfLight --section WarpStateStats \\
        python3 bench/profile_matvec.py --launches 1
"""

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np
from bench_cuda import copy_bandwidth, median_gpu_ms  # beside this script
from gguf import GGMLQuantizationType as Q
from synthetic import RandomBytes, random_matrix

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llogos_cli.backends.cuda import cuda_matmul  # noqa: E402
from llogos_cli.backends.cuda.cuda_backend import CudaBackend  # noqa: E402

TYPES = (Q.Q4_K, Q.Q6_K, Q.Q4_1, Q.Q8_0, Q.F16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launches", type=int, default=0, help="only launch each variant this many times")
    parser.add_argument("--rows", type=int, default=14336)
    parser.add_argument("--cols", type=int, default=4096)
    args = parser.parse_args()
    import cupy

    b, src = CudaBackend(), RandomBytes(1)
    bandwidth = 0.0 if args.launches else copy_bandwidth(cupy)
    if not args.launches:
        print(f"copy bandwidth {bandwidth:.0f} GB/s; {args.rows} x {args.cols}; us a launch (GB/s) over 1, 4, 8 copies\n")
        print("| type | rows a warp | 1 copy | 4 copies | 8 copies |\n|---|---|---|---|---|")
    for qtype in TYPES:
        first = b.matrix(random_matrix(src, qtype, args.rows, args.cols), qtype, True)
        copies = [first] + [dataclasses.replace(first, raw=first.raw.copy()) for _ in range(7)]
        x = cupy.asarray(src.rng.standard_normal((1, args.cols), np.float32))
        y = cupy.empty((1, args.rows), np.float32)
        for per_warp in (1, 2):
            def run(i, n=len(copies)):
                cuda_matmul.matvec(b.kernels, x, copies[i % n], y, rows_per_warp=lambda _: per_warp)
            if args.launches:
                for i in range(args.launches):
                    run(i)
                cupy.cuda.get_current_stream().synchronize()
                continue
            cells = []
            for n in (1, 4, 8):
                ms = median_gpu_ms(lambda i: run(i, n), 60, warmup=2 * n)
                cells.append(f"{1e3 * ms:.1f} ({first.raw.nbytes / ms / 1e6:.0f})")
            print(f"| {qtype.name} | {per_warp} | " + " | ".join(cells) + " |", flush=True)
        copies = first = None
        cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
