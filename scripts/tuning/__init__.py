"""Tuner research: the XS 2.1 cost model of a round at each depth.

Part of the lab (see ``scripts/__init__.py``; ``laguna-run`` needs only
``laguna_dflash.runtime.tuner``); the replay of recorded rounds that judges depth policies is a
test helper (``tests/helpers/depth_replay.py``).
"""
