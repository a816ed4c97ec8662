"""Slots in lanes: several batched engines over one loaded pair, each running its rounds in a
thread of its own.

    engine = LanedEngine(target, pair, EngineConfig(n_threads=2), n_seq=4, lanes=2, drafter_model=drafter)

A :class:`~runtime.batch.BatchEngine` decodes all its slots' rows in one pass, each operation
of it split over the context's threads. On a small target (the bundled pairs: hidden width 128)
an operation lasts about as long as the barrier the threads meet at after it, so a pass on two
threads is barely faster than on one, while two passes on one thread each, at once, take two
cores. Lanes split the slots into groups, each a BatchEngine of its own target context (each
sequence still with its own KV stream) on an equal share of the threads, and each lane runs
its rounds back to back in its own thread, never waiting for another lane's round: a lane's
``auto`` then times and plans its own passes, which cost what they cost whatever the other
lanes draft. On a target whose operations are large enough to split (real Laguna widths), one
lane of all the threads is faster: lanes are the server's ``--lanes``, 1 on a CPU unless
asked for (:func:`default_lanes`: one per slot on a GPU).

Slot ``g`` lives in lane ``g % lanes``, so slots taken lowest first spread over the lanes. A
sequence's greedy output does not depend on its lane (each lane is a BatchEngine, whose
sequences compute as alone). :meth:`start` and :meth:`cancel` wait for the slot's lane to end
its round (at most one round); :meth:`step` returns the sequences that ended since the last call,
once any lane ends a round.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading

from .batch import BatchEngine, Finished
from .cores import threads_for_run
from .engine import EngineConfig, GenerationResult, refuse_closed
from .llama import Model
from .open_pair import PairFiles, build_on_own_models
from .request import GenerateOptions, PairLimits

__all__ = ["LanedEngine", "default_lanes", "lane_threads", "make_engine"]


def default_lanes(parallel: int, target_device: str) -> int:
    """The server's lanes unless asked: one per slot for a target on a GPU, else 1.

    On a GPU the host launches a pass's kernels one by one, from one thread per context, and
    a batched pass of several sequences changes shape from round to round, so it runs without
    the CUDA graph a steady shape replays; lanes of one slot each keep one shape per lane
    (measured on an H100: the bundled pair at depth 4, 4 streams 2.6x one stream in 4 lanes
    against about 1.1x in one; the XS-width target, plain, alike either way:
    docs/results/gpu/README.md, run 8)."""
    return parallel if target_device == "cuda" else 1


def lane_threads(n_threads: int, lanes: int) -> list[int]:
    """Each lane's threads: ``n_threads`` shared as evenly as they go, at least 1 each."""
    if lanes < 1:
        raise ValueError(f"lanes: expected >= 1, found {lanes}")
    base, extra = divmod(n_threads, lanes)
    return [max(1, base + (i < extra)) for i in range(lanes)]


class LanedEngine:
    """``n_seq`` slots in ``lanes`` BatchEngines over one loaded pair (see the module
    docstring). Offers what runtime/server/pool.py reads of a BatchEngine; one thread starts
    sequences and calls :meth:`step`, as there."""

    def __init__(self, target: Model, pair: PairFiles, config: EngineConfig | None = None, n_seq: int = 2,
                 lanes: int = 2, drafter_model: Model | None = None) -> None:
        cfg = self.config = config or EngineConfig()
        if not 1 <= lanes <= n_seq:
            raise ValueError(f"lanes: expected 1..{n_seq} (one slot at least in each), found {lanes}")
        self.target, self.pair, self.n_seq, self.n_lanes = target, pair, n_seq, lanes
        self._owned: list[Model] = []
        self._closed = False
        self._changed = threading.Condition()  # a lane ended a round, a sequence started, or closing
        self._ended: list[Finished] = []  # ended in the lanes, not yet returned by step()
        self._rounds = 0  # rounds ended in all lanes
        self._error: BaseException | None = None  # what stopped a lane's thread
        self._round_locks = [threading.Lock() for _ in range(lanes)]  # held by a lane through its round
        self._waiting = [0] * lanes  # callers waiting for a lane to end its round (_between_rounds)
        self._threads: list[threading.Thread] = []
        threads = lane_threads(threads_for_run(cfg.n_threads), lanes)
        self.lanes: list[BatchEngine] = []
        try:
            for k, n in enumerate(threads):
                lane_cfg = dataclasses.replace(cfg, n_threads=n)
                size = len(range(k, n_seq, lanes))
                self.lanes.append(BatchEngine(target, pair, lane_cfg, n_seq=size, drafter_model=drafter_model))
        except BaseException:
            self.close()
            raise
        for k in range(lanes):
            t = threading.Thread(target=self._run_lane, args=(k,), name=f"laguna-lane-{k}", daemon=True)
            t.start()
            self._threads.append(t)

    @classmethod
    def open(cls, pair: PairFiles, config: EngineConfig | None = None, n_seq: int = 2,
             lanes: int = 2) -> "LanedEngine":
        """An engine over a resolved pair, with models of its own (closed with the engine)."""
        cfg = config or EngineConfig()
        engine, owned = build_on_own_models(pair, cfg, lambda t, d: cls(t, pair, cfg, n_seq, lanes, d))
        engine._owned = owned
        return engine

    def _where(self, slot: int) -> tuple[BatchEngine, int]:
        if not 0 <= slot < self.n_seq:
            raise IndexError(f"slot: expected 0..{self.n_seq - 1}, found {slot}")
        return self.lanes[slot % self.n_lanes], slot // self.n_lanes

    # ------------------------------------------------------------------ the lanes' threads

    def _run_lane(self, k: int) -> None:
        lane, lock = self.lanes[k], self._round_locks[k]
        while True:
            with self._changed:
                while not self._closed and (not lane.running or self._waiting[k]):
                    self._changed.wait()
                if self._closed:
                    return
            try:
                with lock:  # what ended is handed over before the lock goes: cancel() finds it
                    ended = lane.step()
                    with self._changed:
                        self._ended.extend(self._global(k, fin) for fin in ended)
                        self._rounds += 1
                        self._changed.notify_all()
            except BaseException as e:  # the engine itself failed (closed under it)
                with self._changed:
                    self._error = self._error or e
                    self._changed.notify_all()
                return

    def _slot(self, k: int, i: int) -> int:
        """The slot that is sequence ``i`` of lane ``k`` (the inverse of :meth:`_where`)."""
        return i * self.n_lanes + k

    def _global(self, k: int, fin: Finished) -> Finished:
        fin.slot = self._slot(k, fin.slot)
        return fin

    # ------------------------------------------------------------------ what a server reads

    @property
    def limits(self) -> PairLimits:
        return self.lanes[0].limits

    @property
    def drafter(self):
        return self.lanes[0].drafter

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        refuse_closed(self._closed, self.target)
        return self.lanes[0].tokenize(text, add_bos)

    def detokenize(self, tokens: list[int]) -> str:
        refuse_closed(self._closed, self.target)
        return self.lanes[0].detokenize(tokens)

    def cached_prefix(self, slot: int, tokens) -> int:
        lane, i = self._where(slot)
        return lane.cached_prefix(i, tokens)

    def lane_of(self, slot: int) -> int:
        """``slot``'s lane: a server gives a new request to the lane with the fewest busy slots."""
        self._where(slot)
        return slot % self.n_lanes

    def slot_states(self) -> list[dict]:
        states: list[dict] = [{}] * self.n_seq
        for k, lane in enumerate(self.lanes):  # each lane's states once (the pool reads them every round)
            for state in lane.slot_states():
                g = self._slot(k, state["slot"])
                states[g] = {**state, "slot": g, "lane": k}
        return states

    # ------------------------------------------------------------------ running sequences

    def busy(self, slot: int) -> bool:
        lane, i = self._where(slot)
        return lane.busy(i)

    @property
    def running(self) -> int:
        """Sequences running in the lanes, and those that ended there and :meth:`step` has not
        returned yet."""
        with self._changed:
            return sum(lane.running for lane in self.lanes) + len(self._ended)

    @contextlib.contextmanager
    def _between_rounds(self, k: int):
        """Hold lane ``k`` between two of its rounds. Its thread starts no round while a caller
        waits here: a lock alone lets the thread that releases it take it again first, and a
        lane's thread ran round after round while a start waited (a new sequence joined its lane
        only once the other one there had ended)."""
        with self._changed:
            self._waiting[k] += 1
        try:
            with self._round_locks[k]:
                yield
        finally:
            with self._changed:
                self._waiting[k] -= 1
                self._changed.notify_all()

    def start(self, slot: int, prompt: str | list[int], options: GenerateOptions | None = None) -> None:
        refuse_closed(self._closed, self.target)
        lane, i = self._where(slot)
        with self._between_rounds(slot % self.n_lanes):
            lane.start(i, prompt, options)

    def cancel(self, slot: int) -> Finished | None:
        """End a slot's generation now; None when it was idle. A generation that ended in a
        round :meth:`step` has not returned yet is returned here instead, and not by step()."""
        lane, i = self._where(slot)
        with self._between_rounds(slot % self.n_lanes):
            fin = lane.cancel(i)
            if fin is not None:
                return self._global(slot % self.n_lanes, fin)
            with self._changed:
                ended = next((f for f in self._ended if f.slot == slot), None)
                if ended is not None:
                    self._ended.remove(ended)
                return ended

    def take_text(self, slot: int) -> str:
        lane, i = self._where(slot)
        return lane.take_text(i)

    def step(self) -> list[Finished]:
        """Wait until a lane ends a round (or none runs), then return the sequences that ended
        since the last call (their text is still to take)."""
        refuse_closed(self._closed, self.target)
        with self._changed:
            seen = self._rounds
            while (not self._ended and self._rounds == seen and self._error is None and not self._closed
                   and any(lane.running for lane in self.lanes)):
                self._changed.wait()
            if self._error is not None:
                raise self._error
            ended, self._ended = self._ended, []
        return ended

    def generate_all(self, prompts: list, options: GenerateOptions | list[GenerateOptions] | None = None
                     ) -> list[GenerationResult]:
        """Run prompts to their ends, up to n_seq at a time, each on the first free slot."""
        return BatchEngine.generate_all(self, prompts, options)

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Stop the lanes' threads (each after its round) and free every lane's contexts (and the
        models :meth:`open` loaded). Closing twice is harmless."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        for t in self._threads:
            t.join()
        self._threads = []
        for lane in self.lanes:
            lane.close()
        self.lanes = []
        for m in self._owned:
            m.close()
        self._owned = []

    def __enter__(self) -> "LanedEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def make_engine(target: Model, pair: PairFiles, config: EngineConfig, n_seq: int, lanes: int = 1,
                drafter_model: Model | None = None) -> BatchEngine | LanedEngine:
    """The server's engine: one BatchEngine, or ``lanes`` of them where asked for."""
    if lanes == 1:
        return BatchEngine(target, pair, config, n_seq=n_seq, drafter_model=drafter_model)
    return LanedEngine(target, pair, config, n_seq=n_seq, lanes=lanes, drafter_model=drafter_model)
