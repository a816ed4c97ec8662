#!/usr/bin/env bash
# The README's main command after setup: convert the bundled drafter (cached after the first
# run) and let laguna-run continue a Python prompt with 4-token drafts, printing text and stats;
# then one line: speculative against plain decoding of the same prompt, measured in this run.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/laguna-gguf inspect "$(.venv/bin/python -c 'from laguna_dflash.runtime.assets import converted_tiny_drafter as c; print(c())')" \
    --target runtime/data/laguna-tiny/Laguna-Tiny-target-Q8_0.gguf
.venv/bin/laguna-run -f runtime/data/prompts/demo.py -n 200 --n-max 4 "$@"
echo
.venv/bin/python -m scripts.demo_summary -f runtime/data/prompts/demo.py -n 200 --n-max 4 "$@"
