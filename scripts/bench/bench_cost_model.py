#!/usr/bin/env python3
"""Cost model of DFlash speculation for a Laguna XS 2.1 pair on this CPU: see tuning/cost_model.py.

    .venv/bin/python -m scripts.bench.bench_cost_model [--threads 1 --repeats 12 --png docs/results/cost-model/cost-model.png]
"""

from scripts.tuning.cost_model import main

if __name__ == "__main__":
    raise SystemExit(main())
