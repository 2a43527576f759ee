"""The CPU backend: NumPy arrays (numpy_*: the backend and its ops), with numba-compiled kernels
(cpu_*) where numba is loaded; ggml's ggml-cpu."""
