"""Training: the bundled demo and agent pairs, their curricula and evaluation.

Part of the lab (see ``scripts/__init__.py``); the torch drafter and the tiny target it builds
on are the tests' helpers (``tests/helpers/``).
"""
