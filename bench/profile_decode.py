"""One decode step of the CUDA backend for Nsight Systems: a synthetic shape loaded, its decode
graph captured and replayed a few times, then one graph replay and one eager step between
cudaProfilerStart and cudaProfilerStop, which is all `nsys profile --capture-range=cudaProfilerApi`
records (the eager step shows each kernel launch; the replay, the step as generation runs it).

    nsys profile --capture-range=cudaProfilerApi -o OUT python bench/profile_decode.py llama-1b [DIR]
"""

import os
import sys
from pathlib import Path

import numpy as np
from synthetic import SPECS, model_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llogos_cli.engine.decode_graph import decode_step  # noqa: E402
from llogos_cli.gguf.file import GGUFFile  # noqa: E402
from llogos_cli.model.forward import Model  # noqa: E402

DEPTH = 512   # cached tokens before the profiled step


def main() -> None:
    import cupy

    from llogos_cli.backends.cuda.cuda_backend import CudaBackend

    spec = SPECS[sys.argv[1]]
    folder = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(os.environ.get("TMPDIR", "/tmp")) / "llogos-bench"
    folder.mkdir(parents=True, exist_ok=True)
    backend = CudaBackend()
    model = Model(GGUFFile(model_file(spec, folder)), backend)
    ctx = model.new_context(DEPTH + 16, "f16", "f16")
    model.forward_seq(ctx, np.arange(DEPTH, dtype=np.int32) % spec.n_vocab)
    step, slot, token = decode_step(model, ctx.cache), np.zeros(1, np.int32), np.array([1], np.int32)
    for _ in range(4):   # capture, then replays with every kernel compiled and loaded
        step(token, slot, np.array([ctx.n_past], np.int32))
    backend.synchronize()
    cupy.cuda.profiler.start()
    step(token, slot, np.array([ctx.n_past], np.int32))
    model.forward_seq(ctx, token)
    backend.synchronize()
    cupy.cuda.profiler.stop()
    print(f"{spec.name}: one decode step at depth {DEPTH} profiled (graph replay, then eager)", file=sys.stderr)


if __name__ == "__main__":
    main()
