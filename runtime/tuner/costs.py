"""What the tuner believes about time: the wall time of a round at each depth (0: a plain step).

Rules:

* A round's time belongs to the context it was taken at: samples are kept per context band
  (a doubling of the context length, :func:`context_band`). A plain step, a 5-row verify and
  the ratio between them all move with the context (on the bundled pair a depth-4 round costs
  3.0 plain steps at 512 tokens, 2.6 at 2k, 2.0 at 8k, 1.9 at 32k): within a doubling the
  ratio moves by about a tenth at most, as much as the margin a switch needs, across 32x it
  moves by a third. Without context reports (:meth:`CostModel.set_context` never called)
  every sample is in one band and the rules below are those of a single context. Where
  timing a depth costs switches (a GPU's replayed graphs: ``AutoDepth``) a band spans
  ``band_doublings`` = 3 doublings, so that a short request's prompt and its output mostly
  share one, and long contexts still get bands of their own.
* A depth's own cost is the lower median of its last ``window`` timed rounds in the current
  band: one stall of a shared machine moves it by one rank at most, and of two samples it
  takes the one not stalled.
* A depth timed only in other bands is projected from the nearest of them: its cost there
  times how the cost of a reference depth timed in both bands changed between them (the
  reference: the depth nearest to it, of those the one with the most rounds in the current
  band; the incumbent is timed every round). The projection keeps the ratio between the two
  depths, which is what goes stale (between plain decoding and depth 4 it moved by a third
  over 32x; between neighbouring drafting depths, which differ by a row, much less), so a
  projected cost weighs as PROJECTED_WEIGHT samples only and the policy re-times such depths
  soon (``AutoDepth``); without a reference the cost is taken over unchanged.
* A drafting round's time grows about linearly with its depth (one more verify row, one more
  draft row), so every timed drafting depth also informs the least-squares line through them
  all (slope never negative). A timed depth's estimate leans on that line as on LINE_WEIGHT
  samples against its own median's ``len(samples)``; an untimed depth takes the line.
* Costs can jump instead (a GPU switches kernels past some verify batch size), so an untimed
  depth between timed ones is estimated no dearer than its lower timed neighbour plus the
  gentlest growth measured between timed depths.
* When a depth timed MISFIT_MIN_SAMPLES times or more sits more than MISFIT off the line, the
  costs are not a line: every depth then leans on the segment between its nearest timed
  neighbours instead (past the ends, the last segment's slope, never falling).
"""

from __future__ import annotations

from bisect import bisect_left, insort

#: Samples' worth of weight a cost projected from another context band gets (in the line, and
#: against it): no round in this band stands behind it.
PROJECTED_WEIGHT = 1
#: Samples' worth of weight the line (or the neighbours' segment) gets against a depth's own median.
LINE_WEIGHT = 3.0
#: A timed depth this far off the line (relative to its own cost) means the costs are not a line ...
MISFIT = 0.35
#: ... once it has at least this many timed rounds.
MISFIT_MIN_SAMPLES = 3

_INF = float("inf")


def context_band(n_past: int, doublings: int = 1) -> int:
    """The band of a context length: contexts within ``doublings`` doublings of each other
    share or neighbour one."""
    return n_past.bit_length() // doublings


def band_end(n_past: int, doublings: int = 1) -> int:
    """The shortest context length past ``n_past``'s band (:func:`context_band`)."""
    return 1 << ((context_band(n_past, doublings) + 1) * doublings - 1)


class CostModel:
    def __init__(self, max_depth: int, window: int = 31, band_doublings: int = 1, recent_rounds: int = 0) -> None:
        """``recent_rounds``: a count of last rounds whose median :meth:`recent` gives without a
        sort (the policy asks it of the incumbent every round)."""
        self.max_depth = max_depth
        self.window = window
        self.band_doublings = band_doublings
        self.recent_rounds = recent_rounds if 0 < recent_rounds < window else 0
        self.band = 0  # the context band of the rounds now being timed
        self.cost: dict[int, float] = {}  # each depth's cost in the current band: own median or projected
        self._weight: dict[int, int] = {}  # the rounds behind each entry of ``cost``
        self._times: dict[tuple[int, int], list[float]] = {}  # recent round times per (depth, band), a ring
        self._ring_pos: dict[tuple[int, int], int] = {}
        # the same times kept sorted, all of them and the last ``recent_rounds``, so that a median
        # is an index (Python after a target's pass runs on cold caches: a sort a round showed)
        self._sorted: dict[tuple[int, int], list[float]] = {}
        self._sorted_recent: dict[tuple[int, int], list[float]] = {}
        self._median: dict[tuple[int, int], float] = {}
        self._dirty: set[tuple[int, int]] = set()
        self._stale = False  # whether ``cost`` must be rebuilt from ``_median``

    def set_context(self, n_past: int) -> None:
        """The context length of the rounds to come."""
        band = self.band_of(n_past)
        if band != self.band:
            self.band, self._stale = band, True

    def band_of(self, n_past: int) -> int:
        return context_band(n_past, self.band_doublings)

    def add(self, depth: int, seconds: float) -> None:
        """One timed round at ``depth`` (in the current context band)."""
        key = (depth, self.band)
        ring = self._times.setdefault(key, [])
        ordered = self._sorted.setdefault(key, [])
        n, pos = len(ring), self._ring_pos.get(key, 0)
        if self.recent_rounds:  # the round that leaves the last recent_rounds: that many rounds back
            last = self._sorted_recent.setdefault(key, [])
            if n >= self.recent_rounds:
                del last[bisect_left(last, ring[(pos if n == self.window else n) - self.recent_rounds])]
            insort(last, seconds)
        if n < self.window:
            ring.append(seconds)
        else:
            del ordered[bisect_left(ordered, ring[pos])]
            ring[pos] = seconds
            self._ring_pos[key] = (pos + 1) % self.window
        insort(ordered, seconds)
        self._dirty.add(key)

    def rounds_here(self, depth: int) -> int:
        """How many rounds of ``depth`` in the current band its cost stands on (up to ``window``)."""
        return len(self._times.get((depth, self.band), ()))

    def recent(self, depth: int, rounds: int) -> float | None:
        """The lower median of ``depth``'s last ``rounds`` rounds in the current band (None while
        it has fewer). With ``rounds`` = :meth:`rounds_here`, the depth's own cost, without
        rebuilding every depth's."""
        key = (depth, self.band)
        ring = self._times.get(key, [])
        if len(ring) < rounds or rounds <= 0:
            return None
        if rounds == len(ring):
            return self._sorted[key][(rounds - 1) // 2]
        if rounds == self.recent_rounds:
            return self._sorted_recent[key][(rounds - 1) // 2]
        if rounds < len(ring):
            pos = self._ring_pos.get(key, 0) if len(ring) == self.window else len(ring)
            ring = (ring[pos:] + ring[:pos])[-rounds:] if pos < len(ring) else ring[-rounds:]
        return sorted(ring)[(rounds - 1) // 2]

    def forget(self, depth: int) -> None:
        """Drop ``depth``'s rounds in the current band (they ran at another pace)."""
        key = (depth, self.band)
        for store in (self._times, self._ring_pos, self._median, self._sorted, self._sorted_recent):
            store.pop(key, None)
        self._dirty.discard(key)
        self._stale = True

    def medians(self) -> dict[int, float]:
        """Each timed depth's cost in the current band (its own lower median, or projected)."""
        if not self._dirty and not self._stale:
            return self.cost
        for key in self._dirty:
            ring = self._sorted[key]
            self._median[key] = ring[(len(ring) - 1) // 2]
        self._dirty.clear()
        self._stale = False
        band, cost, weight = self.band, self.cost, self._weight
        cost.clear()
        weight.clear()
        elsewhere: dict[int, int] = {}  # depth -> the nearest other band it was timed in
        for d, b in self._median:
            if b == band:
                cost[d], weight[d] = self._median[d, b], len(self._times[d, b])
            elif d not in elsewhere or (abs(b - band), -b) < (abs(elsewhere[d] - band), -elsewhere[d]):
                elsewhere[d] = b
        for d, b in elsewhere.items():
            if d not in cost:
                cost[d], weight[d] = self._median[d, b] * self._band_ratio(d, b), PROJECTED_WEIGHT
        return cost

    def _band_ratio(self, depth: int, other: int) -> float:
        """How much dearer a round at ``depth`` is in the current band than in ``other``, going by
        the nearest depth timed in both (1 when none is)."""
        both = [d for d, b in self._median if b == self.band and (d, other) in self._median]
        if not both:
            return 1.0
        ref = min(both, key=lambda d: (abs(d - depth), -len(self._times[d, self.band])))
        return self._median[ref, self.band] / self._median[ref, other]

    def samples(self, depth: int) -> int:
        """Rounds behind ``depth``'s cost in the current band (those of the band projected from)."""
        self.medians()
        return self._weight.get(depth, 0)

    def timed_here(self, depth: int, reach: int = 0) -> bool:
        """Whether ``depth`` has rounds of its own in the current context band (or one at most
        ``reach`` bands from it)."""
        return any((depth, b) in self._times for b in range(self.band - reach, self.band + reach + 1))

    def estimates(self) -> list[float]:
        """The cost of a round at each depth 0..max_depth (inf: plain decoding never timed)."""
        self.medians()
        timed = [(k, c, self._weight[k]) for k, c in self.cost.items() if k > 0]
        slope, mx, my = 0.0, 0.0, _INF
        if timed:
            n = sum(w for _, _, w in timed)
            mx = sum(k * w for k, _, w in timed) / n
            my = sum(c * w for _, c, w in timed) / n
            sxx = sum(w * (k - mx) ** 2 for k, _, w in timed)
            if sxx > 0:
                slope = max(0.0, sum(w * (k - mx) * (c - my) for k, c, w in timed) / sxx)
        pts = sorted((k, c) for k, c, _ in timed)
        if any(w >= MISFIT_MIN_SAMPLES and abs(c - my - slope * (k - mx)) > MISFIT * c for k, c, w in timed):
            return self._piecewise(pts)
        est = [self.cost.get(0, _INF)]
        gentlest = min((max(0.0, (c1 - c0) / (k1 - k0)) for (k0, c0), (k1, c1) in zip(pts, pts[1:])), default=None)
        for k in range(1, self.max_depth + 1):
            line = my + slope * (k - mx)
            if k in self.cost:
                line = self._lean(k, line)
            elif gentlest is not None and pts[0][0] < k < pts[-1][0]:
                k0, c0 = max(p for p in pts if p[0] < k)
                line = min(line, c0 + gentlest * (k - k0))
            est.append(line)
        return est

    def _lean(self, k: int, ref: float) -> float:
        """A timed depth's median, weighted by its samples, against ``ref`` weighted LINE_WEIGHT."""
        w = self._weight[k]
        return (w * self.cost[k] + LINE_WEIGHT * ref) / (w + LINE_WEIGHT)

    def _piecewise(self, timed: list[tuple[int, float]]) -> list[float]:
        def between(k: int, pts: list[tuple[int, float]]) -> float:
            below = [p for p in pts if p[0] < k]
            above = [p for p in pts if p[0] > k]
            if below and above:
                (k0, c0), (k1, c1) = below[-1], above[0]
                return c0 + (c1 - c0) * (k - k0) / (k1 - k0)
            end = below[-2:] if below else above[:2]
            if len(end) < 2:
                return end[0][1] if end else _INF
            (k0, c0), (k1, c1) = end
            slope = max(0.0, (c1 - c0) / (k1 - k0))
            k_ref, c_ref = end[-1] if below else end[0]
            return max(0.0, c_ref + slope * (k - k_ref))

        est = [self.cost.get(0, _INF)]
        for k in range(1, self.max_depth + 1):
            if k not in self.cost:
                est.append(between(k, timed))
                continue
            seg = between(k, [p for p in timed if p[0] != k])
            est.append(self.cost[k] if seg == _INF else self._lean(k, seg))
        return est
