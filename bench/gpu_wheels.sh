#!/usr/bin/env bash
# Download here the Python packages the GPU machine lacks into .whl/ (ignored), which
# bench/gpu_session.sh installs there without a network. The machine's python3 (3.12) already has
# numpy, CuPy, click, rich, jinja2, tokenizers, pyyaml, tqdm, requests and pytest; llogos needs gguf
# besides, a pure-Python wheel, taken at the version this checkout's .venv runs.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("gguf"))')
mkdir -p .whl
rm -f .whl/gguf-*.whl   # one version of each package: two stop the install there
.venv/bin/python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl "gguf==$version"
ls -l .whl
