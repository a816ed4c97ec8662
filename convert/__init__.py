"""laguna-gguf: Poolside's Laguna DFlash drafter checkpoints to GGUF (the ik_llama.cpp layout)."""
