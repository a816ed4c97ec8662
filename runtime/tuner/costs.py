"""What the tuner believes about time: the wall time of a round at each depth (0: a plain step).

Rules:

* A depth's own cost is the lower median of its last ``window`` timed rounds: one stall of a
  shared machine moves it by one rank at most, and of two samples it takes the one not stalled.
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

#: Samples' worth of weight the line (or the neighbours' segment) gets against a depth's own median.
LINE_WEIGHT = 3.0
#: A timed depth this far off the line (relative to its own cost) means the costs are not a line ...
MISFIT = 0.35
#: ... once it has at least this many timed rounds.
MISFIT_MIN_SAMPLES = 3

_INF = float("inf")


class CostModel:
    def __init__(self, max_depth: int, window: int = 31) -> None:
        self.max_depth = max_depth
        self.window = window
        self.cost: dict[int, float] = {}  # the lower median of each timed depth's recent rounds
        self._times: dict[int, list[float]] = {}  # recent round times per depth (a ring)
        self._ring_pos: dict[int, int] = {}
        self._dirty: set[int] = set()

    def add(self, depth: int, seconds: float) -> None:
        """One timed round at ``depth``."""
        ring = self._times.setdefault(depth, [])
        if len(ring) < self.window:
            ring.append(seconds)
        else:
            ring[self._ring_pos.get(depth, 0)] = seconds
            self._ring_pos[depth] = (self._ring_pos.get(depth, 0) + 1) % self.window
        self._dirty.add(depth)

    def medians(self) -> dict[int, float]:
        """Each timed depth's own cost (the lower median of its ring)."""
        for d in self._dirty:
            ring = sorted(self._times[d])
            self.cost[d] = ring[(len(ring) - 1) // 2]
        self._dirty.clear()
        return self.cost

    def samples(self, depth: int) -> int:
        return len(self._times.get(depth, ()))

    def estimates(self) -> list[float]:
        """The cost of a round at each depth 0..max_depth (inf: plain decoding never timed)."""
        self.medians()
        timed = [(k, c, len(self._times[k])) for k, c in self.cost.items() if k > 0]
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
        w = len(self._times[k])
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
