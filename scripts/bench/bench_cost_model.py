#!/usr/bin/env python3
"""Cost model of DFlash speculation for a Laguna XS 2.1 pair on this CPU: see tuning/cost_model.py.

    .venv/bin/python scripts/bench/bench_cost_model.py [--threads 1 --repeats 12 --png docs/results/cost-model/cost-model.png]
"""

import sys
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # scripts/: recorded.py and every folder's modules
from tuning.cost_model import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
