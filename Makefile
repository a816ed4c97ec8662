# laguna-dflash — see README.md
.PHONY: setup setup-test test demo demo-agent wheel-cuda check-cuda-build clean-cache

setup:
	scripts/setup.sh

setup-test:
	scripts/setup.sh --test

## The test command CI runs: sets everything up (venv, patched wheel, fixtures), then pytest.
test: setup-test
	.venv/bin/python -m pytest -q

## The main job: convert the bundled drafter and run speculative decoding on a Python prompt.
demo: setup
	scripts/demo.sh

## The agent pair: laguna-run serve on it, and examples/agent.py solving its held-out tool tasks.
demo-agent: setup
	scripts/demo_agent.sh

wheel-cuda:
	.venv/bin/laguna-run setup --cuda --no-install

## Compile-only check of the CUDA build (no GPU needed; cached): run it after changing patches/,
## the build flags or runtime/setup/wheel.py.
check-cuda-build: setup
	.venv/bin/python -m scripts.gpu.check_cuda_build

clean-cache:
	rm -rf $${LAGUNA_DFLASH_CACHE:-$$HOME/.cache/laguna-dflash}
