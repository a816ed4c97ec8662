"""Investigations: yes/no questions about the patched llama.cpp (row invariance, interop with ik_llama.cpp).

Run as scripts (``python scripts/investigate/<name>.py``); the tests import some of them as
``investigate.<name>``. See scripts/README.md for the index.
"""
