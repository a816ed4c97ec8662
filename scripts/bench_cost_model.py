#!/usr/bin/env python3
"""Cost model of DFlash speculation for a Laguna XS 2.1 pair on this CPU: see tuning/cost_model.py.

    .venv/bin/python scripts/bench_cost_model.py [--threads 1 --repeats 12 --png docs/cost-model.png]
"""

from tuning.cost_model import main

if __name__ == "__main__":
    raise SystemExit(main())
