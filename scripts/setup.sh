#!/usr/bin/env bash
# Set up .venv with the patched llama-cpp-python and this project.
#   scripts/setup.sh           runtime only (convert, run, serve, the agent example's client)
#   scripts/setup.sh --test    also the test and training dependencies (torch CPU, transformers)
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
# build requirements of the llama-cpp-python sdist (built without isolation, so the cache key is ours)
quiet "$VPY" -m pip install -q "scikit-build-core>=0.9.2" numpy
"$VPY" scripts/build_wheel.py ${LAGUNA_CUDA:+--cuda}
# the wheel goes in with --no-deps (so a rebuild never reinstalls numpy); its own needs:
quiet "$VPY" -m pip install -q "typing-extensions>=4.5.0" "diskcache>=5.6.1" "jinja2>=2.11.3"
if [[ $want_test == 1 ]]; then
    # the CPU torch wheel on local disk; a bare `torch` would pull a multi-GB CUDA build
    quiet "$VPY" -m pip install -q "torch==2.13.0"
    quiet "$VPY" -m pip install -q -e ".[test,server,agent,upload,plot,suites]"
else
    quiet "$VPY" -m pip install -q -e ".[server,agent,upload,plot,suites]"
fi
"$VPY" -c "import laguna_dflash.runtime.bindings as b; b.lib(); print('[setup] patched llama-cpp-python OK')"
