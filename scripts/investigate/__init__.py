"""Investigations: yes/no questions about the patched llama.cpp (row invariance, interop with ik_llama.cpp).

Part of the lab (see ``scripts/__init__.py``): run as ``python -m scripts.investigate.<name>``.
The harnesses the tests share (``tests/helpers/kernel_rows.py``, ``kernel_weights.py``,
``ik_interop.py``) hold the machinery; these modules ask the questions. See scripts/README.md.
"""
