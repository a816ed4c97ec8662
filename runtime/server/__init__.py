"""``laguna-run serve``: an OpenAI-compatible HTTP server over engine slots (the ``server`` extra).

- :mod:`.pool` — engine slots over one loaded model pair, the bounded FIFO queue, cancellation;
- :mod:`.app` — the FastAPI application (endpoints, errors in OpenAI's shape, the API key);
- :mod:`.schemas` — the request bodies (pydantic);
- :mod:`.metrics` — Prometheus text for ``GET /metrics``;
- the ``serve`` command itself is :mod:`runtime.cli.serve`.

Only :mod:`.pool` and :mod:`.metrics` work without the extra installed.
"""
