#!/usr/bin/env bash
# Download here the Python packages the GPU machine lacks into .whl/ (ignored), which
# bench/gpu_session.sh installs there without a network. The machine's python3 (3.12) already has
# numpy, numba, CuPy, click, rich, jinja2, tokenizers, threadpoolctl and pytest; llogos needs gguf
# (pure Python) and llguidance (a compiled abi3 wheel) besides, each taken at the version this
# checkout's .venv runs.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
for package in gguf llguidance; do
    version=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('$package'))")
    rm -f .whl/"$package"-*.whl   # one version of each package: two stop the install there
    .venv/bin/python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 \
        --platform manylinux2014_x86_64 -d .whl "$package==$version"
done
ls -l .whl
