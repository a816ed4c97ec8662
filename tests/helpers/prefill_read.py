"""The drafter's prefill as it was before a prompt's rows waited for the first draft: each part's
visible rows read at once. Tests compare the queue against it; the lab times both."""

from __future__ import annotations


def read_at_prefill(drafter):
    """A stand-in for ``drafter.queue_visible`` that reads the rows now, leaving nothing queued."""
    def read_now(features, start_pos, next_query):
        drafter.flush_pending(next_query)
        drafter.inject_visible(features, start_pos, next_query)
    return read_now
