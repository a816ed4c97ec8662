"""laguna-run setup: the patched llama-cpp-python this runtime needs, built (or reused from the
cache) and installed into the running environment (wheel.py), and what is installed (report.py)."""
