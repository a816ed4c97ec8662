#!/usr/bin/env python3
"""Train the bundled agent pair (runtime/data/laguna-tiny-agent/): see training/agent_pair.py.

    python -m scripts.train_agent_pair [--reuse-target] [--threads 2]
"""

from scripts.training.agent_pair import main

if __name__ == "__main__":
    raise SystemExit(main())
