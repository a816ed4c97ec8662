#!/usr/bin/env bash
# Pack what scripts/gpu_check.sh needs on a GPU machine that reaches no package registry:
#   llama_cpp_cuda.tar.xz  the CUDA wheel's llama_cpp package, one copy of each library (the
#                          wheel itself holds six of libggml-cuda's 60 MB, too big to carry)
#   *.whl                  the dependencies that machine's image lacks (gguf, diskcache; llguidance
#                          built for its Python, 3.12)
#   fixtures/              the tiny target fixture (its converter comes from the sdist)
# and OUT_DIR-parts/part0, part1, ...: the same bundle as one tar in pieces. A device call carries
# at most 64 MiB, the tree's tracked files (about 53 MB) included, so the pieces are what the tree
# leaves, and the bundle travels one piece a call into /tmp/laguna-gpu-parts there;
# gpu_check.sh puts it back together.
# Usage: scripts/gpu_bundle.sh [OUT_DIR]   (default .gpu, ignored by git; CUDA arch: $LAGUNA_CUDA_ARCH, default 90)
# Then scripts/gpu/check_bundle.py checks the bundle as reassembled from its pieces and runs
# gpu_check.sh on it up to the GPU.
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
# a platform wheel, for the GPU machine's Python rather than this one's
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: -d "$out" --python-version 3.12 --implementation cp \
    $(for n in 17 28 31 34; do echo --platform "manylinux_2_${n}_x86_64"; done) \
    "llguidance==$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("llguidance"))')"
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
# a piece and the tree that travels with it (tracked files, 2 MB spare) fit one call's 64 MiB
tree=$(git ls-files -z | xargs -0 du -cb | tail -n 1 | cut -f1)
piece=$((64 * 1024 * 1024 - tree - 2000000))
(( piece > 4000000 )) || { echo "the tracked tree ($tree bytes) leaves no room for a bundle piece" >&2; exit 1; }
rm -rf "$out-parts" && mkdir -p "$out-parts"
tar -C "$out" -cf - . | split -b "$piece" -d -a 1 - "$out-parts/part"
ls -l "$out-parts"
# check what travels: the bundle as gpu_check.sh reassembles it from the pieces
mkdir -p "$tmp/reassembled" && cat "$out-parts"/part* | tar -C "$tmp/reassembled" -xf -
LAGUNA_CUDA_ARCH=$arch PYTHON=.venv/bin/python .venv/bin/python -m scripts.gpu.check_bundle "$tmp/reassembled"
