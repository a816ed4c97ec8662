"""Checks of the CUDA build, run here (no GPU needed): part of the lab (see ``scripts/__init__.py``)."""
