"""The CUDA backend's encoder ops and embeddings with its kernels run by the CPU emulator (tests/emu),
against the NumPy backend: the checks shared with the GPU tests (emu/encoder_suite.py), and which
kernels an encoder's forward pass launches."""

import numpy as np
import pytest

from llogos_cli.backends.cuda import cuda_attention
from llogos_cli.backends.cuda.cuda_backend import CudaBackend
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model.batch import Batch
from llogos_cli.model.forward import Model
from tests.emu.emulator import EmuKernels
from tests.emu.encoder_suite import *  # noqa: F401,F403 (the shared encoder tests)
from tests.test_embeddings import HERE


@pytest.fixture(scope="module")
def backend():
    return CudaBackend(EmuKernels(), "float")


@pytest.mark.parametrize("n_tok, attention", [(5, "attention_f32_f32"),
                                              (cuda_attention.FUSED_MAX_TOKENS + 1, "softmax_lengths_f32")])
def test_an_encoder_runs_on_the_encoder_kernels(backend, n_tok, attention):
    """BERT's layers: LayerNorm and GELU kernels, keys and values stored without rotation, attention on the
    path the run's length picks; nothing of a decoder's (RMSNorm, RoPE, gated units)."""
    gpu = Model(GGUFFile(HERE / "tiny-bert-embed-f32.gguf"), backend)
    backend.kernels.launched.clear()
    batch = Batch.run(np.arange(n_tok, dtype=np.int32) + 3, 0, 0, np.arange(n_tok))
    assert backend.to_host(gpu.hidden(gpu.new_cache(1, 32, "f32", "f32"), batch)).shape == (n_tok, gpu.cfg.n_embd)
    launched = backend.kernels.launched
    n_layer = gpu.cfg.n_layer
    assert launched.count("layernorm_f32") == 1 + 2 * n_layer and launched.count("gelu_f32") == n_layer
    assert launched.count("kv_store_f32") == 2 * n_layer and launched.count(attention) == n_layer   # keys, values
    assert not [name for name in launched if name.startswith(("rmsnorm", "rope", "swiglu", "geglu"))]
