"""Benchmarks: each script measures one question and writes its result (JSON, PNG) for a page in docs/.

Run as scripts (``python scripts/bench/<name>.py``); each puts ``scripts/`` on ``sys.path`` for the
shared helpers (``recorded.py``) and the other folders. See scripts/README.md for the index.
"""
