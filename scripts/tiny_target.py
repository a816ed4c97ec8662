#!/usr/bin/env python3
"""Write the tiny Laguna test target (HF checkpoint, GGUF, reference outputs): see training/tiny_target.py.

    python scripts/tiny_target.py OUT_DIR
"""

from training.tiny_target import main

if __name__ == "__main__":
    raise SystemExit(main())
