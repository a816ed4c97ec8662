"""The lab: benchmarks, investigations, training and tuner research around the installed package.

Not part of the product: its modules import ``laguna_dflash`` like any user would. It has one
import root, the repository root: run a script from there as a module (``python -m
scripts.bench.bench_peer``), and its modules import each other as ``scripts.<folder>.<module>``,
the helpers they share with the tests as ``tests.helpers.<module>`` and the example agent as
``examples.<module>``. See scripts/README.md.
"""
