"""laguna-run: speculative decoding for Laguna targets with their DFlash drafters on llama-cpp-python."""
