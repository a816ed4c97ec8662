"""Engine slots over one loaded model pair, and the FIFO queue in front of them.

Each slot is an :class:`~runtime.engine.Engine` (its own target and drafter contexts, its own
prompt cache) driven by its own worker thread; the asyncio side only submits jobs and reads
their events, so it never waits on llama.cpp. At most ``len(slots) + max_queue`` jobs are in
flight: one per busy slot and ``max_queue`` waiting, first in first out; one more is refused
(:class:`QueueFull`, the server's 503). A waiting job runs on the idle slot whose prompt cache
holds the longest prefix of its prompt. Cancelling a job (its client went away) drops it from
the queue, or ends its generation at the next round boundary (``GenerateOptions.should_stop``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections import deque
from pathlib import Path

from ..engine import Engine, EngineConfig, GenerateOptions, GenerationResult
from ..llama import Model
from ..open_pair import PairFiles, open_models, resolve_pair
from ..rpc import RpcError
from .metrics import Metrics


#: a streamed job hands its text to the event loop at most this often (the first piece at once):
#: each hand-over wakes the loop thread, which then competes with generation for the GIL (on
#: the busy 2-core machine, streaming every round cost 2-3 points more of tokens/s than this)
STREAM_INTERVAL_S = 0.02


class QueueFull(Exception):
    """Every slot is busy and the queue holds max_queue jobs."""


class BackendLost(Exception):
    """An RPC server holding part of the target was lost: the loaded weights are gone with it, so
    no slot can generate again until the server is restarted and the model loaded anew."""


class PoolClosed(Exception):
    """The server is shutting down."""


@dataclasses.dataclass
class Outcome:
    """What a finished job reports: a GenerationResult's fields (text cut at the stop string)."""

    tokens: list[int]
    text: str
    stats: object
    stop_reason: str


class Job:
    """One request's generation. Events reach ``events`` (an asyncio.Queue of the submitting
    loop) as ``("text", str)`` (streaming jobs), ``("done", Outcome)`` or ``("error", exc)``."""

    def __init__(self, tokens: list[int], options: GenerateOptions, *, stream: bool = False,
                 endpoint: str = "completions", loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.tokens = list(tokens)
        self.options = options
        self.stream = stream
        self.endpoint = endpoint
        self.loop = loop or asyncio.get_running_loop()
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()
        self.finished = False
        self.outcome_label: str | None = None
        self.slot: int | None = None
        self.t_submit = time.perf_counter()
        self.t_start: float | None = None
        self.t_end: float | None = None
        self.rounds = 0  # rounds begun (should_stop is asked once per round)
        self.rounds_at_cancel: int | None = None

    # -- the engine's side (worker thread)

    def should_stop(self) -> bool:
        if self.cancelled.is_set():
            return True
        self.rounds += 1
        return False

    def _put(self, item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    # -- the client's side

    def cancel(self) -> None:
        if not self.cancelled.is_set():
            self.rounds_at_cancel = self.rounds
            self.cancelled.set()

    @property
    def rounds_after_cancel(self) -> int | None:
        """Rounds the generation began after its cancel (the acceptance: at most one)."""
        return None if self.rounds_at_cancel is None else self.rounds - self.rounds_at_cancel

    @property
    def queue_s(self) -> float:
        return ((self.t_start or time.perf_counter()) - self.t_submit)


class Slot:
    def __init__(self, index: int, engine: Engine, pool: "SlotPool") -> None:
        self.index, self.engine, self.pool = index, engine, pool
        self.job: Job | None = None
        self._wake = threading.Condition(pool._lock)
        self.thread = threading.Thread(target=self._work, name=f"laguna-slot-{index}", daemon=True)

    def _work(self) -> None:
        pool = self.pool
        while True:
            with pool._lock:
                while self.job is None and not pool._closed:
                    self._wake.wait()
                job = self.job
                if job is None:  # closed and nothing assigned
                    return
            try:
                pool._execute(self, job)
            finally:
                pool._release(self)


class SlotPool:
    """N engine slots and a bounded FIFO queue (see the module docstring)."""

    def __init__(self, engines: list[Engine], max_queue: int, metrics: Metrics | None = None,
                 history: int = 64) -> None:
        if not engines:
            raise ValueError("a slot pool needs at least one engine")
        if max_queue < 0:
            raise ValueError(f"max_queue: expected >= 0, found {max_queue}")
        self.max_queue = max_queue
        self.metrics = metrics or Metrics()
        self._lock = threading.Lock()
        self._closed = False
        self._waiting: deque[Job] = deque()
        self.slots = [Slot(i, e, self) for i, e in enumerate(engines)]
        self._idle = list(self.slots)
        self.finished: deque[Job] = deque(maxlen=history)  # the last jobs done (tests, debugging)
        self._owned_models: list[Model] = []
        self.backend_lost: str | None = None  # why no slot can generate any more (an RPC server lost)
        self.metrics.set_gauge("laguna_slots", len(self.slots))
        self._update_gauges()
        for s in self.slots:
            s.thread.start()

    @property
    def engine(self) -> Engine:
        """One of the engines (for what all share: tokenizer, context size, drafter spec)."""
        return self.slots[0].engine

    # -- submission (event-loop side; never blocks on a generation)

    def submit(self, job: Job) -> None:
        with self._lock:
            if self._closed:
                raise PoolClosed()
            if self.backend_lost is not None:
                raise BackendLost(self.backend_lost)
            if self._idle:
                self._assign(self._best_idle(job), job)
            elif len(self._waiting) < self.max_queue:
                self._waiting.append(job)
            else:
                raise QueueFull()
            self._update_gauges()

    def cancel(self, job: Job) -> None:
        """The client is gone: drop the job from the queue, or stop it at its next round."""
        job.cancel()
        with self._lock:
            try:
                self._waiting.remove(job)
            except ValueError:
                return
            self._update_gauges()
        self._finish(job, "cancelled")

    def cut_all(self) -> int:
        """The server stops: every waiting job ends with PoolClosed, every running one at its next
        round (stop reason ``interrupted``); the slots stay open. Returns how many were cut."""
        with self._lock:
            waiting = list(self._waiting)
            self._waiting.clear()
            running = [s.job for s in self.slots if s.job is not None and not s.job.finished]
            self._update_gauges()
        self._cut(waiting, running)
        return len(waiting) + len(running)

    def status(self) -> dict:
        with self._lock:
            return {"slots": len(self.slots), "slots_idle": len(self._idle), "queue": len(self._waiting)}

    # -- internals (under self._lock where noted)

    def _cut(self, waiting: list[Job], running: list[Job]) -> None:
        """``waiting`` (already taken off the queue) ends with PoolClosed; ``running`` stops at its next round."""
        for job in waiting:
            job.cancel()
            self._finish(job, "cancelled")
            job._put(("error", PoolClosed()))
        for job in running:
            job.cancel()

    def _best_idle(self, job: Job) -> Slot:  # under the lock: idle engines are not running
        return max(self._idle, key=lambda s: (s.engine.cached_prefix(job.tokens), -s.index))

    def _assign(self, slot: Slot, job: Job) -> None:  # under the lock
        self._idle.remove(slot)
        slot.job = job
        job.slot = slot.index
        slot._wake.notify()

    def _release(self, slot: Slot) -> None:
        with self._lock:
            slot.job = None
            self._idle.append(slot)
            while self._waiting and not self._closed:
                job = self._waiting.popleft()
                if not job.cancelled.is_set():
                    self._assign(slot, job)
                    break
            self._update_gauges()

    def _update_gauges(self) -> None:
        self.metrics.set_gauge("laguna_queue_depth", len(self._waiting))
        self.metrics.set_gauge("laguna_slots_busy", len(self.slots) - len(self._idle))

    def _execute(self, slot: Slot, job: Job) -> None:
        job.t_start = time.perf_counter()
        if job.cancelled.is_set():
            self._finish(job, "cancelled")
            return
        opts = dataclasses.replace(job.options, should_stop=job.should_stop)
        engine = slot.engine
        try:
            if job.stream:
                pending: list[str] = []
                last = 0.0  # the first text goes out at once
                for piece in engine.stream(job.tokens, opts):  # cut at the stop string by the engine
                    pending.append(piece)
                    now = time.perf_counter()
                    if now - last >= STREAM_INTERVAL_S:
                        job._put(("text", "".join(pending)))
                        pending.clear()
                        last = now
                if pending:
                    job._put(("text", "".join(pending)))
                stats, reason = engine.last_stats, engine.last_stop_reason
                outcome = Outcome(tokens=[], text="", stats=stats, stop_reason=reason)
            else:
                res: GenerationResult = engine.generate(job.tokens, opts)
                outcome = Outcome(tokens=res.tokens, text=res.text, stats=res.stats, stop_reason=res.stop_reason)
        except Exception as e:  # a refused value or a llama.cpp failure: the request's error
            if isinstance(e, RpcError):
                self._lose_backend(str(e))
                e = BackendLost(self.backend_lost)
            self._finish(job, "error")
            job._put(("error", e))
            return
        self.metrics.observe_generation(outcome.stats, job.queue_s)
        self._finish(job, "cancelled" if outcome.stop_reason == "interrupted" else "ok")
        job._put(("done", outcome))

    def _lose_backend(self, why: str) -> None:
        """Every later request gets 503 with the reason; the waiting ones get it now."""
        with self._lock:
            if self.backend_lost is None:
                self.backend_lost = (f"{why}; the target's weights on it are gone: restart the RPC server(s), "
                                     "then laguna-run serve")
            waiting = list(self._waiting)
            self._waiting.clear()
            self._update_gauges()
        for job in waiting:
            self._finish(job, "error")
            job._put(("error", BackendLost(self.backend_lost)))

    def _finish(self, job: Job, label: str) -> None:
        job.t_end = time.perf_counter()
        job.finished = True
        job.outcome_label = label
        self.metrics.inc("laguna_requests_total", endpoint=job.endpoint, outcome=label)
        self.finished.append(job)

    # -- lifetime

    def close(self, timeout: float = 30.0) -> None:
        """Cancel every job, stop the workers, free the contexts (and the models loaded by
        :func:`load_pool`)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            waiting = list(self._waiting)
            self._waiting.clear()
            running = [s.job for s in self.slots if s.job is not None]
            for s in self.slots:
                s._wake.notify()
        self._cut(waiting, running)
        alive = False
        for s in self.slots:
            s.thread.join(timeout)
            alive = alive or s.thread.is_alive()
        if alive:  # a generation that does not stop: leave its contexts alone rather than free them under it
            return
        for s in self.slots:
            s.engine.close()
        for m in self._owned_models:
            m.close()


def load_pool(target_path: str | Path, drafter_path: str | Path | None, config: EngineConfig,
              parallel: int = 1, max_queue: int = 16, metrics: Metrics | None = None,
              pair: PairFiles | None = None) -> SlotPool:
    """Load the target and the drafter once and make ``parallel`` engines over them
    (``pair``: already resolved by the caller, runtime/open_pair.py)."""
    if parallel < 1:
        raise ValueError(f"parallel: expected >= 1, found {parallel}")
    pair = pair or resolve_pair(target_path, drafter_path)
    target, drafter_model = open_models(pair, config)  # RPC servers: probed before any model loads
    models = [m for m in (target, drafter_model) if m is not None]
    engines: list[Engine] = []
    try:
        for _ in range(parallel):
            engines.append(Engine(target, config=config, drafter_model=drafter_model, pair=pair))
    except BaseException:
        for e in engines:
            e.close()
        for m in models:
            m.close()
        raise
    pool = SlotPool(engines, max_queue, metrics)
    pool._owned_models = models
    return pool
