# laguna-dflash — see README.md
.PHONY: setup setup-test test demo wheel-cuda clean-cache

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

wheel-cuda:
	.venv/bin/python scripts/build_wheel.py --cuda --no-install

clean-cache:
	rm -rf $${LAGUNA_DFLASH_CACHE:-$$HOME/.cache/laguna-dflash}
