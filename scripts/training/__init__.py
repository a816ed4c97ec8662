"""Training and test-fixture code: the torch drafter, the bundled demo pair's training, the tiny test target.

Not part of the installed package: it imports ``laguna_dflash`` like any user would, and runs
from ``scripts/`` (a script's own folder is on ``sys.path``) or from the tests (``pythonpath``
in pyproject.toml).
"""
