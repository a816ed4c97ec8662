"""What the tests share with the lab (scripts/): the tiny test target, synthetic drafter
checkpoints, the torch drafter, the scripted sampler, the kernel and ik_llama.cpp harnesses, the
tuner's replay, the standard-library corpus and the agent pair's tasks.

The tests import them as ``helpers.<module>`` (pytest's ``pythonpath`` holds tests/); the lab as
``tests.helpers.<module>``, run from the repository root. So a helper imports its siblings
relatively and never anything from scripts/.
"""
