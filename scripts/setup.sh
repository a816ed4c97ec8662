#!/usr/bin/env bash
# Set up .venv with this project and the patched llama-cpp-python, as a user would with pip:
# `pip install` of the project, then `laguna-run setup` (which reuses the cached wheel when it can).
#   scripts/setup.sh           runtime only (convert, run, serve, the agent example's client)
#   scripts/setup.sh --test    also the test and training dependencies (torch CPU, transformers)
#   LAGUNA_CUDA=1 scripts/setup.sh    the CUDA build of llama-cpp-python
set -euo pipefail
cd "$(dirname "$0")/.."
want_test=0
[[ "${1:-}" == "--test" ]] && want_test=1

PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
    "$PY" -m venv .venv
fi
VPY=.venv/bin/python
quiet() { "$@" 2>&1 | grep -v -e '^WARNING: Location' -e '^\s*$' || true; }

"$VPY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if [[ $want_test == 1 ]]; then
    # the CPU torch wheel on local disk; a bare `torch` would pull a multi-GB CUDA build
    quiet "$VPY" -m pip install -q "torch==2.13.0"
    quiet "$VPY" -m pip install -q -e ".[test,server,agent,upload,plot,suites]"
else
    quiet "$VPY" -m pip install -q -e ".[server,agent,upload,plot,suites]"
fi
# builds llama.cpp only when the cache has no wheel of these patches and flags; ends with --check
.venv/bin/laguna-run setup ${LAGUNA_CUDA:+--cuda}
