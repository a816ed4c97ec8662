# laguna-dflash — see README.md
.PHONY: setup setup-test test demo demo-agent agent-clis test-agent-clis wheel-cuda check-cuda-build clean-cache

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

## The coding-agent CLIs docs/agents.md points at laguna-run serve, pinned, from the npm registry,
## into .agent-clis/ (not run by CI: see tests/test_agent_clis.py); then their end-to-end tests.
AGENT_CLIS = @anthropic-ai/claude-code@2.1.328 @openai/codex@0.169.0 opencode-ai@1.18.33
agent-clis:
	npm install --prefix .agent-clis --no-audit --no-fund --save-exact $(AGENT_CLIS)

test-agent-clis: setup-test agent-clis
	.venv/bin/python -m pytest -q tests/test_agent_clis.py

wheel-cuda:
	.venv/bin/laguna-run setup --cuda --no-install

## Compile-only check of the CUDA build (no GPU needed; cached): run it after changing patches/,
## the build flags or runtime/setup/wheel.py.
check-cuda-build: setup
	.venv/bin/python -m scripts.gpu.check_cuda_build

clean-cache:
	rm -rf $${LAGUNA_DFLASH_CACHE:-$$HOME/.cache/laguna-dflash}
