#!/usr/bin/env bash
# GPU checks on a CUDA machine that reaches no package registry, from the bundle that
# scripts/gpu_bundle.sh packs (the CUDA build of the patched wheel and two pure-Python wheels):
#   1 load      the CUDA build loads and sees a GPU (stops here otherwise)
#   2 cuda      tests/test_cuda.py: capture, drafter graph and greedy exactness on the GPU
#   3 offload   what llama.cpp's op offload does to a CPU-placed model's prompt rows
#   4 invariance  scripts/investigate/batch_invariance.py: a row's logits alone vs in a batch, on the GPU
#   5 capture   scripts/bench/bench_capture.py: a plain step with and without hidden-state capture
#   6 concurrency  scripts/bench/bench_concurrency.py on the GPU: batched slots against one at a time
#   7 xs        the same with the XS-width target (built there), plain decoding
#   8 profile   scripts/investigate/profile_rounds.py: where a batched round's time goes, 1, 2 and 4 streams
#   9 suite     the whole test suite against the CUDA build
#  10 sweep     laguna-run bench --sweep with both models on the GPU (JSON + PNG)
#  11 record    scripts/bench/record_acceptance.py: the GPU's clock for the tuner replay
#  12 autotune  scripts/bench/bench_autotune.py on the GPU (code and the degraded drafter)
# Each stage's log, and the JSON and PNG files, go to $OUT (default gpu-out/); summary.txt
# holds each stage's exit status and seconds. Stages start only while the deadline allows,
# and only those GPU_CHECK_STAGES names (default: all).
#   GPU_BUNDLE=.gpu OUT=gpu-out GPU_CHECK_SECONDS=480 GPU_CHECK_STAGES="cuda suite" scripts/gpu_check.sh
# Where the bundle travelled in pieces (gpu_bundle.sh's .gpu-parts, one device call each, copied
# into $GPU_PARTS, default /tmp/laguna-gpu-parts), it is put back together into $GPU_BUNDLE first.
# scripts/gpu/check_bundle.py runs it here, on a machine without a GPU, as far as the load stage.
set -uo pipefail
cd "$(dirname "$0")/.."
bundle=${GPU_BUNDLE:-.gpu}
out=${OUT:-gpu-out}
py=${PYTHON:-python3}
deadline=$((SECONDS + ${GPU_CHECK_SECONDS:-480}))
stages=" ${GPU_CHECK_STAGES:-cuda offload invariance capture concurrency xs profile suite sweep record autotune} "
mkdir -p "$out"
export PYTHONUNBUFFERED=1 LAGUNA_DFLASH_CACHE=${LAGUNA_DFLASH_CACHE:-/tmp/laguna-dflash-cache}

parts=${GPU_PARTS:-/tmp/laguna-gpu-parts}
if [[ ! -f $bundle/llama_cpp_cuda.tar.xz && -d $parts ]]; then
    mkdir -p "$bundle" && cat "$parts"/part* | tar -C "$bundle" -xf - || exit 1
fi
site=${GPU_SITE:-/tmp/laguna-dflash-site}
rm -rf "$site" && mkdir -p "$site"
tar -C "$site" -xJf "$bundle/llama_cpp_cuda.tar.xz" || exit 1
"$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$bundle"/*.whl || exit 1
# the package as it installs (laguna_dflash.convert, laguna_dflash.runtime), from this tree
mkdir -p "$site/laguna_dflash" && ln -s "$PWD/convert" "$site/laguna_dflash/convert" && ln -s "$PWD/runtime" "$site/laguna_dflash/runtime"
# the lab runs as python -m scripts.<...> from here; the heredocs below reach the tests' helpers
export PYTHONPATH="$site:$PWD/tests"
# the tiny target fixture: it is made with llama.cpp's converter from the sdist, which that
# machine cannot fetch
mkdir -p "$LAGUNA_DFLASH_CACHE/fixtures"
[[ -d "$bundle/fixtures" ]] && cp -r "$bundle/fixtures/." "$LAGUNA_DFLASH_CACHE/fixtures/"
# the CUDA runtime and cuBLAS: from the toolkit, or from the nvidia-* wheels beside torch;
# the driver, where the loader's cache lacks it
libdirs=$("$py" - <<'EOF'
import glob, os, site
roots = ["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib", "/usr/local/nvidia/lib64"]
for sp in site.getsitepackages():
    roots += glob.glob(f"{sp}/nvidia/**/lib", recursive=True)
dirs = []
for name in ("libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13", "libcuda.so.1"):
    for r in roots:
        if os.path.exists(os.path.join(r, name)):
            dirs.append(r)
            break
print(":".join(dict.fromkeys(dirs)))
EOF
)
export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

stage() {  # stage NAME SECONDS COMMAND...: run with a time limit, log to $out/NAME.log
    local name=$1 limit=$2 t0=$SECONDS rc
    shift 2
    if [[ $name != load && $stages != *" $name "* ]]; then
        return 0
    fi
    if (( SECONDS + 20 > deadline )); then
        echo "$name skipped (deadline)" | tee -a "$out/summary.txt"
        return 1
    fi
    (( SECONDS + limit > deadline )) && limit=$((deadline - SECONDS))
    echo "== $name (limit ${limit}s)"
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    rc=$?
    tail -n 25 "$out/$name.log"
    echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$out/summary.txt"
    return $rc
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >> "$out/gpu.txt"
stage load 60 "$py" -c "
import laguna_dflash.runtime.bindings as b; b.lib()
from laguna_dflash.runtime.placement import gpu_available
import llama_cpp; print('llama_cpp', llama_cpp.__version__, 'gpu', gpu_available())
assert gpu_available(), 'the CUDA build sees no GPU'" || exit 1
stage cuda 200 "$py" -m pytest -q -s -rA -p no:cacheprovider tests/test_cuda.py
stage offload 45 "$py" - <<'EOF'
import os, sys
from pathlib import Path
import numpy as np
from helpers import tiny_target as gen
from laguna_dflash.runtime.llama import Context, ContextParams, Model
out = Path(os.environ["LAGUNA_DFLASH_CACHE"]) / "fixtures" / f"tiny-target-{gen.generator_fingerprint()}"
if not (out / "fingerprint").exists():
    gen.build_all(out)
ref = dict(np.load(out / "reference.npz"))
with Model(out / "tiny-laguna-f32.gguf") as m:
    slot = m.n_layer
    def rows(n_ubatch, offload):
        p = ContextParams(n_ctx=512, n_batch=512, n_ubatch=n_ubatch, kv_type="f32", op_offload=offload)
        with Context(m, p) as ctx:
            ctx.set_capture(slot)
            ctx.decode(ref["tokens"], np.arange(len(ref["tokens"])), logits="last")
            return ctx.capture(slot)
    for offload in (None, True):
        d = np.abs(rows(512, offload) - rows(7, offload)).max()
        print(f"CPU-placed model, op_offload={offload}: max |prompt rows (ubatch 512) - ubatch 7 rows| = {d:.3e}")
EOF
stage invariance 90 "$py" -m scripts.investigate.batch_invariance --device cuda --model runtime/data/laguna-tiny/Laguna-Tiny-target-Q8_0.gguf \
    --model "$(ls -d "$LAGUNA_DFLASH_CACHE"/fixtures/tiny-target-*/tiny-laguna-f32.gguf | head -n 1)" --json "$out/invariance-cuda.json"
stage capture 30 "$py" -m scripts.bench.bench_capture --device cuda --json "$out/capture-cuda.json"
stage concurrency 200 "$py" -m scripts.bench.bench_concurrency --device cuda ${CONCURRENCY_ARGS:-} \
    --json "$out/concurrency-cuda.json" --png "$out/concurrency-cuda.png"
# the XS-width target (real widths, 5 layers, Q4_K_M): built there (the files are GBs), plain decoding
stage xs 330 bash -c '"$1" -m scripts.bench.bench_cost_model --build-only --threads 0 && \
    "$1" -m scripts.bench.bench_concurrency --device cuda --depths 0 --streams 1,4 ${XS_ARGS:-} \
        --target "$(ls "$LAGUNA_DFLASH_CACHE"/costmodel/*/laguna-xs-shapes-L5-Q4_K_M.gguf | head -n 1)" \
        --json "$2/concurrency-xs-cuda.json" --png "$2/concurrency-xs-cuda.png"' xs "$py" "$out"
stage profile 90 bash -c 'for c in 1 2 4; do "$1" -m scripts.investigate.profile_rounds --device cuda --streams $c \
    --depth 4 --top 25 --json "$2/profile-c$c-d4.json" || exit; done' profile "$py" "$out"
stage suite 200 "$py" -m pytest -q -p no:cacheprovider tests
stage sweep 120 "$py" -m laguna_dflash.runtime.cli bench --sweep --device cuda -n 64 --json "$out/sweep-cuda.json" --png "$out/sweep-cuda.png"
stage record 150 "$py" -m scripts.bench.record_acceptance --device cuda --lengths-from tests/fixtures/recordings/replay.json \
    --out "$out/replay-cuda.json"
stage autotune 150 "$py" -m scripts.bench.bench_autotune --device cuda --workloads code,degraded --repeats 1 ${AUTOTUNE_ARGS:-} \
    --json "$out/autotune-cuda.json" --png "$out/autotune-cuda.png"
cat "$out/summary.txt"
