#!/usr/bin/env python3
"""Train the bundled demo pair (runtime/data/laguna-tiny/): see training/demo_pair.py.

    python -m scripts.train_demo_pair [--reuse-target] [--threads 2]
"""

from scripts.training.demo_pair import main

if __name__ == "__main__":
    raise SystemExit(main())
