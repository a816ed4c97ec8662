"""The slots of one batched engine over one loaded model pair, and the FIFO queue in front of them.

The slots are the sequences of one :class:`~runtime.batch.BatchEngine` (one target context,
each slot with its own KV stream, drafter context and prompt cache), run by one worker thread
that decodes every running slot's rows in one pass per round (in lanes, one pass per lane, all at
once: runtime/lanes.py); the asyncio side only submits jobs and reads their events, so it never
waits on llama.cpp. At most ``len(slots) + max_queue`` jobs are in flight: one per busy slot and
``max_queue`` waiting, first in first out; one more is refused (:class:`QueueFull`, the server's
503). A waiting job runs on the idle slot whose prompt cache holds the longest prefix of its
prompt (in lanes: of the slots in the lane with the fewest busy ones, so that requests at once
run in different lanes). Cancelling a job (its client went away) drops it from the queue, or ends
its generation at the next round boundary (``GenerateOptions.should_stop``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections import deque
from pathlib import Path

from ..batch import BatchEngine, Finished
from ..lanes import LanedEngine, make_engine
from ..engine import EngineConfig, GenerateOptions
from ..llama import Model
from ..open_pair import PairFiles, build_on_own_models, resolve_pair
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
    """A slot of the batched engine and the job running there."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.job: Job | None = None
        self.pending: list[str] = []  # streamed text not yet handed over
        self.last_put = 0.0


class SlotPool:
    """The slots of one :class:`~runtime.batch.BatchEngine` and a bounded FIFO queue (see the
    module docstring)."""

    def __init__(self, engine: BatchEngine | LanedEngine, max_queue: int, metrics: Metrics | None = None,
                 history: int = 64) -> None:
        if max_queue < 0:
            raise ValueError(f"max_queue: expected >= 0, found {max_queue}")
        self.batch = engine
        self.max_queue = max_queue
        self.metrics = metrics or Metrics()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._closed = False
        self._waiting: deque[Job] = deque()
        self._starting: list[tuple[Slot, Job]] = []  # assigned, not yet started by the worker
        self.slots = [Slot(i) for i in range(engine.n_seq)]
        self._idle = list(self.slots)
        self.finished: deque[Job] = deque(maxlen=history)  # the last jobs done (tests, debugging)
        self._owned_models: list[Model] = []
        self.backend_lost: str | None = None  # why no slot can generate any more (an RPC server lost)
        self._states: dict[int, str] = {}  # running slots' states as of the last round
        self.metrics.set_gauge("laguna_slots", len(self.slots))
        self._update_gauges()
        self.thread = threading.Thread(target=self._work, name="laguna-batch", daemon=True)
        self.thread.start()

    @property
    def engine(self) -> BatchEngine | LanedEngine:
        """The engine (for what the slots share: tokenizer, limits, drafter spec)."""
        return self.batch

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
                self._wake.notify()
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
            return {"slots": len(self.slots), "slots_idle": len(self._idle), "queue": len(self._waiting),
                    "slot_states": [self._slot_state(s) for s in self.slots]}

    def _slot_state(self, slot: Slot) -> dict:  # under the lock
        where = {"slot": slot.index}
        if self.batch.n_lanes > 1:
            where["lane"] = self.batch.lane_of(slot.index)
        job = slot.job
        if job is None:
            return {**where, "state": "idle"}
        state = "starting" if job.t_start is None else self._states.get(slot.index, "decoding")
        return {**where, "state": state, "endpoint": job.endpoint, "n_prompt": len(job.tokens),
                "rounds": job.rounds}

    # -- internals (under self._lock where noted)

    def _cut(self, waiting: list[Job], running: list[Job]) -> None:
        """``waiting`` (already taken off the queue) ends with PoolClosed; ``running`` stops at its next round."""
        for job in waiting:
            job.cancel()
            self._finish(job, "cancelled")
            job._put(("error", PoolClosed()))
        for job in running:
            job.cancel()
        with self._lock:
            self._wake.notify()

    def _best_idle(self, job: Job) -> Slot:  # under the lock: idle slots are not running
        lane = self.batch.lane_of
        busy = [lane(s.index) for s in self.slots if s.job is not None]
        return max(self._idle, key=lambda s: (-busy.count(lane(s.index)),
                                              self.batch.cached_prefix(s.index, job.tokens), -s.index))

    def _assign(self, slot: Slot, job: Job) -> None:  # under the lock
        self._idle.remove(slot)
        slot.job = job
        job.slot = slot.index
        self._starting.append((slot, job))
        self._wake.notify()

    def _release(self, slot: Slot) -> None:
        with self._lock:
            slot.job = None
            slot.pending.clear()
            self._idle.append(slot)
            self._states.pop(slot.index, None)
            while self._waiting and not self._closed:
                job = self._waiting.popleft()
                if not job.cancelled.is_set():
                    self._assign(slot, job)
                    break
            self._update_gauges()

    def _update_gauges(self) -> None:  # under the lock
        self.metrics.set_gauge("laguna_queue_depth", len(self._waiting))
        self.metrics.set_gauge("laguna_slots_busy", len(self.slots) - len(self._idle))
        busy = {s.index for s in self.slots if s.job is not None}
        for s in self.slots:
            self.metrics.set_gauge("laguna_slot_busy", float(s.index in busy), slot=str(s.index))

    def _work(self) -> None:
        """The one worker: starts assigned jobs, runs rounds while any slot is running, hands
        each job its text and its end."""
        batch = self.batch
        while True:
            with self._lock:
                while not self._starting and not batch.running and not self._closed:
                    self._wake.wait()
                if self._closed and not batch.running and not self._starting:
                    return
                starting, self._starting = self._starting, []
            for slot, job in starting:
                self._start(slot, job)
            if not batch.running:
                continue
            try:
                ended = batch.step()
            except Exception as e:  # the engine itself failed (closed under us): every job ends
                ended = [Finished(s.index, [], error=e) for s in self.slots if batch.busy(s.index)]
                for f in ended:
                    batch.cancel(f.slot)
            now = time.perf_counter()
            ended_slots = {f.slot for f in ended}
            with self._lock:
                self._states = {st["slot"]: st["state"] for st in batch.slot_states() if st["state"] != "idle"}
            for slot in self.slots:
                if slot.job is not None and slot.index not in ended_slots and batch.busy(slot.index):
                    self._hand_text(slot, now)
            for fin in ended:
                self._end(self.slots[fin.slot], fin)

    def _start(self, slot: Slot, job: Job) -> None:
        job.t_start = time.perf_counter()
        if job.cancelled.is_set():
            self._finish(job, "cancelled")
            self._release(slot)
            return
        opts = dataclasses.replace(job.options, should_stop=job.should_stop)
        try:
            self.batch.start(slot.index, job.tokens, opts)
        except Exception as e:  # a refused value: the request's error
            self._fail(slot, job, e)
            return
        slot.last_put = 0.0  # the first text goes out at once

    def _hand_text(self, slot: Slot, now: float) -> None:
        text = self.batch.take_text(slot.index)
        if not slot.job.stream or not text:
            if text:
                slot.pending.append(text)
            return
        slot.pending.append(text)
        if now - slot.last_put >= STREAM_INTERVAL_S:
            slot.job._put(("text", "".join(slot.pending)))
            slot.pending.clear()
            slot.last_put = now

    def _end(self, slot: Slot, fin: Finished) -> None:
        job = slot.job
        rest = self.batch.take_text(slot.index)
        if rest:
            slot.pending.append(rest)
        if fin.error is not None:
            self._fail(slot, job, fin.error)
            return
        if job.stream:
            if slot.pending:
                job._put(("text", "".join(slot.pending)))
            outcome = Outcome(tokens=[], text="", stats=fin.stats, stop_reason=fin.stop_reason)
        else:
            outcome = Outcome(tokens=list(fin.tokens), text="".join(slot.pending), stats=fin.stats,
                              stop_reason=fin.stop_reason)
        self.metrics.observe_generation(outcome.stats, job.queue_s)
        self._finish(job, "cancelled" if outcome.stop_reason == "interrupted" else "ok")
        self._release(slot)
        job._put(("done", outcome))

    def _fail(self, slot: Slot, job: Job, e: BaseException) -> None:
        if isinstance(e, RpcError):
            self._lose_backend(str(e))
            e = BackendLost(self.backend_lost)
        self._finish(job, "error")
        self._release(slot)
        job._put(("error", e))

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
        """Cancel every job, stop the worker, free the engine (and the models loaded by
        :func:`load_pool`)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            waiting = list(self._waiting)
            self._waiting.clear()
            running = [s.job for s in self.slots if s.job is not None]
            self._wake.notify()
        self._cut(waiting, running)
        self.thread.join(timeout)
        if self.thread.is_alive():  # a generation that does not stop: leave its contexts alone
            return
        self.batch.close()
        for m in self._owned_models:
            m.close()


def load_pool(target_path: str | Path, drafter_path: str | Path | None, config: EngineConfig,
              parallel: int = 1, max_queue: int = 16, metrics: Metrics | None = None,
              pair: PairFiles | None = None, lanes: int = 1) -> SlotPool:
    """Load the target and the drafter once and make a ``parallel``-slot engine over them, in
    ``lanes`` lanes (runtime/lanes.py; ``pair``: already resolved by the caller, runtime/open_pair.py)."""
    if parallel < 1:
        raise ValueError(f"parallel: expected >= 1, found {parallel}")
    pair = pair or resolve_pair(target_path, drafter_path)
    # RPC servers: probed before any model loads
    engine, models = build_on_own_models(pair, config, lambda t, d: make_engine(t, pair, config, parallel, lanes, d))
    pool = SlotPool(engine, max_queue, metrics)
    pool._owned_models = models
    return pool
