"""Cumulative hardware counters turned into "how much in the last window".

A counter is sampled once per check. Its increase over a trailing window is what the
thresholds compare against (e.g. more than 120 symbol errors in an hour). The first sample
is only a baseline: counts from before the agent started never raise a fault. A counter
that goes down (reset by a driver reload or GPU reset, or a wrap) starts a new baseline.
"""

from __future__ import annotations

from collections import deque


class CounterWindow:
    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, t: float, value: int) -> None:
        if self._samples and value < self._samples[-1][1]:
            self._samples.clear()
        self._samples.append((t, value))
        cutoff = t - self.window_s
        # Keep the newest sample at or before the cutoff: the baseline for the whole window.
        while len(self._samples) >= 2 and self._samples[1][0] <= cutoff:
            self._samples.popleft()

    def increase(self) -> int:
        """The increase across the window (0 until there are two samples)."""
        if len(self._samples) < 2:
            return 0
        return self._samples[-1][1] - self._samples[0][1]

    def last_rate_per_s(self) -> float:
        """The rate between the last two samples."""
        if len(self._samples) < 2:
            return 0.0
        (t0, v0), (t1, v1) = self._samples[-2], self._samples[-1]
        return (v1 - v0) / (t1 - t0) if t1 > t0 else 0.0


class Counters:
    """Windows by key, created on first use."""

    def __init__(self) -> None:
        self._windows: dict[str, CounterWindow] = {}

    def add(self, key: str, t: float, value: int, *, window_s: float) -> CounterWindow:
        w = self._windows.get(key)
        if w is None or w.window_s != window_s:
            w = self._windows[key] = CounterWindow(window_s)
        w.add(t, value)
        return w
