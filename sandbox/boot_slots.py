"""Sandboxes booting on one machine take turns: at most one boot more than CPU cores at once.

A boot is the sandbox's CPU peak (~10 s of CPU in ~30 s: Temporal, the emulators, the
worker, the API and every agent importing their libraries at once); a running sandbox idles
at a few percent of a core. Eight boots at once on a 2-core machine (parallel tests) took
each several times longer and starved whatever else ran, so a boot first takes one of
`os.cpu_count() + 1` slots (measured: a Kubernetes-mode boot spends ~16 s of CPU in ~27 s,
0.6 of a core, so one boot per core left a third of the machine idle while the parallel
tests' boots queued at the start of a run): an exclusive lock on a file in the machine's
temporary directory, released when the boot ends or its process dies (the kernel drops the lock).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SLOTS_DIR = Path(tempfile.gettempdir()) / "autoclusters-sandbox-boots"
POLL_S = 0.25


@contextmanager
def boot_slot(slots: int | None = None, directory: Path = SLOTS_DIR) -> Iterator[int]:
    """Hold one of `slots` boot slots (default: one more than the cores) for the `with`
    block; waits for one to be free. Yields the slot's number."""
    count = max(1, slots or (os.cpu_count() or 1) + 1)
    directory.mkdir(parents=True, exist_ok=True)
    while True:
        for slot in range(count):
            fd = os.open(directory / f"slot-{slot}", os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield slot
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
            return
        # Every slot is held: another boot ends within seconds. flock cannot wait for
        # "any one of" several files, so look again shortly.
        time.sleep(POLL_S)
