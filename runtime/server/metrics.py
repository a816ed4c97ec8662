"""Server metrics in Prometheus' text exposition format (``GET /metrics``)."""

from __future__ import annotations

import threading

# name -> (type, help); every metric the server exports, in the order it prints them
METRICS = {
    "laguna_requests_total": ("counter", "Generation requests by endpoint and outcome "
                              "(ok, cancelled, error, queue_full, bad_request)."),
    "laguna_prompt_tokens_total": ("counter", "Prompt tokens of finished generations."),
    "laguna_prompt_tokens_cached_total": ("counter", "Prompt tokens taken from the prompt cache (not prefilled)."),
    "laguna_prompt_checkpoints_restored_total": ("counter", "Prompts whose cached prefix was restored from a "
                                                 "context checkpoint (--ctx-checkpoints)."),
    "laguna_generated_tokens_total": ("counter", "Tokens generated."),
    "laguna_rounds_total": ("counter", "Speculative rounds (a plain decoding step is a round of depth 0)."),
    "laguna_drafted_tokens_total": ("counter", "Tokens drafted by the drafter."),
    "laguna_accepted_tokens_total": ("counter", "Drafted tokens the target accepted."),
    "laguna_drafted_at_position_total": ("counter", "Rounds that drafted a token at this draft position (1-based)."),
    "laguna_accepted_at_position_total": ("counter", "Rounds whose draft at this position was accepted."),
    "laguna_acceptance_by_position": ("gauge", "Accepted / drafted at each draft position, since start."),
    "laguna_accepted_per_round": ("gauge", "Mean accepted drafts per drafting round, since start."),
    "laguna_phase_seconds_total": ("counter", "Wall time by phase: queue, prefill, draft, verify, host, policy."),
    "laguna_queue_depth": ("gauge", "Requests waiting for a slot."),
    "laguna_slots_busy": ("gauge", "Slots generating."),
    "laguna_slots": ("gauge", "Engine slots (--parallel)."),
    "laguna_slot_busy": ("gauge", "1 while this slot runs a request."),
}


LABELLED = {"laguna_requests_total", "laguna_drafted_at_position_total", "laguna_accepted_at_position_total",
            "laguna_acceptance_by_position", "laguna_phase_seconds_total"}


def _series_order(item: tuple[str, float]):
    # position="10" after position="9"
    import re

    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", item[0])]


def _labels(labels: dict) -> str:
    if not labels:
        return ""
    esc = {k: str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for k, v in labels.items()}
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(esc.items())) + "}"


class Metrics:
    """Counters and gauges keyed by name and labels; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[tuple[str, str], float] = {}

    def inc(self, name: str, value: float = 1.0, **labels) -> None:
        key = (name, _labels(labels))
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + value

    def set_gauge(self, name: str, value: float, **labels) -> None:
        with self._lock:
            self._values[(name, _labels(labels))] = float(value)

    def get(self, name: str, **labels) -> float:
        with self._lock:
            return self._values.get((name, _labels(labels)), 0.0)

    def observe_generation(self, stats, queue_s: float) -> None:
        """Add one finished generation's Stats."""
        self.inc("laguna_prompt_tokens_total", stats.n_prompt)
        self.inc("laguna_prompt_tokens_cached_total", stats.n_cached)
        self.inc("laguna_prompt_checkpoints_restored_total", int(stats.checkpoint))
        self.inc("laguna_generated_tokens_total", stats.n_generated)
        self.inc("laguna_rounds_total", stats.rounds)
        self.inc("laguna_drafted_tokens_total", stats.drafted)
        self.inc("laguna_accepted_tokens_total", stats.accepted)
        for i, (d, a) in enumerate(zip(stats.drafted_at, stats.accepted_at)):
            self.inc("laguna_drafted_at_position_total", d, position=i + 1)
            self.inc("laguna_accepted_at_position_total", a, position=i + 1)
        for phase, t in (("queue", queue_s), ("prefill", stats.t_prefill), ("draft", stats.t_draft),
                         ("verify", stats.t_verify), ("host", stats.t_host), ("policy", stats.t_policy)):
            self.inc("laguna_phase_seconds_total", t, phase=phase)
        self._derive()

    def _derive(self) -> None:
        with self._lock:
            drafted = {k[1]: v for k, v in self._values.items() if k[0] == "laguna_drafted_at_position_total"}
            for lab, d in drafted.items():
                a = self._values.get(("laguna_accepted_at_position_total", lab), 0.0)
                self._values[("laguna_acceptance_by_position", lab)] = a / d if d else 0.0
            rounds_drafting = drafted.get(_labels({"position": 1}), 0.0)
            acc = self._values.get(("laguna_accepted_tokens_total", ""), 0.0)
            self._values[("laguna_accepted_per_round", "")] = acc / rounds_drafting if rounds_drafting else 0.0

    def render(self) -> str:
        with self._lock:
            values = dict(self._values)
        lines = []
        for name, (kind, help_text) in METRICS.items():
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            series = sorted(((lab, v) for (n, lab), v in values.items() if n == name), key=_series_order)
            if not series and name not in LABELLED:  # an unlabelled series reads 0 before any request
                series = [("", 0.0)]
            for lab, v in series:
                lines.append(f"{name}{lab} {_number(v)}")
        return "\n".join(lines) + "\n"


def _number(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))
