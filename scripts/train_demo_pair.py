#!/usr/bin/env python3
"""Train the bundled demo pair (runtime/data/laguna-tiny/): see training/demo_pair.py.

    python scripts/train_demo_pair.py [--reuse-target] [--threads 2]
"""

from training.demo_pair import main

if __name__ == "__main__":
    raise SystemExit(main())
