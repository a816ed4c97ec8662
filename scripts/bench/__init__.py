"""Benchmarks: each script measures one question and writes its result (JSON, PNG) for a page in docs/.

Part of the lab (see ``scripts/__init__.py``): run as ``python -m scripts.bench.<name>`` from the
repository root. See scripts/README.md for the index.
"""
