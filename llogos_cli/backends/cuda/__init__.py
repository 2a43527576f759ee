"""The CUDA backend: CuPy arrays and the hand-written kernels of cuda/*.cu; ggml's ggml-cuda."""
