"""The link watch: a thread that reads the InfiniBand ports every `link_watch_s` and wakes
the agent when a port's state changes, so a port going down is checked within a second,
not at the next periodic check.

It reads with the agent's own InfiniBand source (sysfs on a node, the fake file in the
sandbox), and compares only what a link check judges: the adapters present and each
port's `state` and `phys_state`. A read costs no NVML call and no classification; the
agent's link check (agent.py) classifies and debounces what changed, holding a link
fault `link_hold_s` seconds (debounce.py).

A read that fails (it raises, or a port's state, or the adapters' list, could not be
read) is unknown, not a change: it is logged once per run of failures and wakes nothing, so
it can neither fire nor resolve a fault. The next good read is compared with the last good
one. A counter that could not be read does not matter here (some HCAs refuse some
counters); an adapter whose ports vanished mid-read is gone (HCA_FELL_OFF_BUS's case).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from autoclusters.clients.agent.backend import IbSource
from autoclusters.clients.agent.readings import IbReadings

log = logging.getLogger(__name__)

# What a link check looks at: the adapters, and (hca, port, state, phys_state) per port.
Links = tuple[tuple[str, ...], tuple[tuple[str, int, str, str], ...]]


STATE_FILES = ("state", "phys_state")


def unreadable(ib: IbReadings | None) -> dict[str, str]:
    """The errors of `ib` that leave a port's state unknown: a state file, or the adapters'
    directory itself (sysfs's `IbReadings.errors` paths)."""
    if ib is None:
        return {}
    return {
        path: error
        for path, error in ib.errors.items()
        if path.rsplit("/", 1)[-1] in STATE_FILES or path.endswith("class/infiniband")
    }


def links_of(ib: IbReadings | None) -> Links:
    if ib is None:  # no InfiniBand class on this machine
        return (), ()
    ports = sorted((p.hca, p.port, p.state, p.phys_state) for p in ib.ports)
    return tuple(sorted(ib.hcas)), tuple(ports)


class LinkWatch:
    def __init__(self, source: IbSource, *, every_s: float, wake: Callable[[], None]) -> None:
        self.source = source
        self.every_s = every_s
        self.wake = wake
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False  # the last read failed (logged once until one succeeds)

    def start(self) -> None:
        """Read the ports now (the baseline: the agent's first check reads them too), then
        every `every_s` on the watch's thread."""
        if self._thread is not None:
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(self._stop, self.read()), name="link-watch", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.every_s + 5)
        self._thread = None

    def read(self) -> Links | None:
        """The ports as read now; None when the read failed (logged)."""
        try:
            ib = self.source.read()
        except Exception as e:  # whatever the source raises: unknown, not a change
            self._failed(f"{type(e).__name__}: {e}")
            return None
        if errors := unreadable(ib):
            path, error = min(errors.items())
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            self._failed(f"{path}: {error}{more}")
            return None
        if self._failing:
            log.info("link watch: the ports read again")
            self._failing = False
        return links_of(ib)

    def _failed(self, why: str) -> None:
        if not self._failing:
            log.warning("link watch: the ports could not be read (%s); no change assumed", why)
        self._failing = True

    def _run(self, stop: threading.Event, seen: Links | None) -> None:
        while not stop.wait(self.every_s):
            now = self.read()
            if now is None:
                continue
            changed, seen = seen is not None and now != seen, now
            if changed and not stop.is_set():
                try:
                    self.wake()
                except Exception:
                    log.exception("the agent's wake-up failed; the link waits for the next check")
