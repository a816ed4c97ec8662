#!/usr/bin/env bash
# Pack what scripts/gpu_check.sh needs on a GPU machine that reaches no package registry:
#   llama_cpp_cuda.tar.xz  the CUDA wheel's llama_cpp package, one copy of each library (the
#                          wheel itself holds six of libggml-cuda's 60 MB, too big to carry)
#   *.whl                  the pure-Python dependencies that machine's image lacks
#   fixtures/              the tiny target fixture (its converter comes from the sdist)
# Usage: scripts/gpu_bundle.sh [OUT_DIR]   (default .gpu, ignored by git; CUDA arch: $LAGUNA_CUDA_ARCH, default 90)
# Then scripts/gpu/check_bundle.py checks the bundle and runs gpu_check.sh on it up to the GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.gpu}
arch=${LAGUNA_CUDA_ARCH:-90}
wheel=$(.venv/bin/python scripts/build_wheel.py --cuda --cuda-arch "$arch" --wheel-path | tail -n 1)
rm -rf "$out" && mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unzip -q "$wheel" 'llama_cpp/*' -d "$tmp"
# keep the names the loader asks for: libllama.so (llama_cpp opens it) and each SONAME
(cd "$tmp/llama_cpp/lib" && rm -f ./*.so.0.* libggml.so libggml-base.so libggml-cpu.so libggml-cuda.so libllama.so.0)
tar -C "$tmp" -cJf "$out/llama_cpp_cuda.tar.xz" llama_cpp
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: -d "$out" \
    "gguf==$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("gguf"))')" "diskcache>=5.6.1"
echo "$(basename "$wheel")" > "$out/WHEEL"
fixture=$(PYTHONPATH=tests .venv/bin/python -c "
import conftest
from helpers import tiny_target as gen
out = conftest.fixture_cache() / f'tiny-target-{gen.generator_fingerprint()}'
if not (out / 'fingerprint').exists():
    gen.build_all(out)
print(out)" | tail -n 1)
mkdir -p "$out/fixtures" && cp -r "$fixture" "$out/fixtures/"
du -sh "$out"/*
LAGUNA_CUDA_ARCH=$arch PYTHON=.venv/bin/python .venv/bin/python -m scripts.gpu.check_bundle "$out"
