"""Both backends offer the interface of backends/backend.py, with the same parameter names: the
forward pass and the engine are written once against it."""

import inspect

import pytest

from llogos_cli.backends.backend import Backend, EncoderOps, GraphCapture
from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from llogos_cli.backends.cuda.cuda_backend import CudaBackend


def _members(protocol) -> dict:
    names = set(protocol.__annotations__) | {n for n, v in vars(protocol).items()
                                             if not n.startswith("_") and (callable(v) or isinstance(v, property))}
    return {n: vars(protocol).get(n) for n in names}


@pytest.mark.parametrize("backend", [NumpyBackend, CudaBackend], ids=lambda b: b.__name__)
def test_backends_offer_the_interface(backend):
    protocols = [Backend] + ([GraphCapture] if backend.graphs else []) + ([EncoderOps] if backend.encoders else [])
    for protocol in protocols:
        for name, member in _members(protocol).items():
            assert hasattr(backend, name), f"{backend.__name__} lacks {name}"
            if inspect.isfunction(member):
                want = list(inspect.signature(member).parameters)
                got = list(inspect.signature(getattr(backend, name)).parameters)
                assert got[:len(want)] == want, f"{backend.__name__}.{name}{got} against {want}"


def test_the_cpu_backend_captures_nothing():
    assert not NumpyBackend.graphs and not any(hasattr(NumpyBackend, n) for n in _members(GraphCapture))
