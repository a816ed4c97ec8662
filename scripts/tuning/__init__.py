"""Tuner research: the replay of recorded rounds that judges depth policies, and the XS 2.1 cost model.

Not part of the installed package (``laguna-run`` needs only ``laguna_dflash.runtime.tuner``);
it imports ``laguna_dflash`` like any user would.
"""
