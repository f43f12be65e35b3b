"""A sandbox an xdist worker shares between its tests: booted at the first test that uses it,
stopped (by its recorded PIDs) as soon as the worker's next test does not, and booted again
if a later one does. Not at the end of the session: a sandbox standing by costs ~0.05-0.08 of
a core, and the session's end would stop the workers' sandboxes one after the other while
the run waits.

pytest knows the next test of a worker in `pytest_runtest_teardown(item, nextitem)` (xdist
runs a test once it knows the next, or knows there is none); tests/conftest.py calls
`stop_after` from there for each of these.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from autoclusters.sandbox import cluster
from autoclusters.sandbox.runtime.config import SandboxConfig


class WorkerSandbox:
    """`cfg`'s sandbox for the tests that use `fixture`: `prepare` runs after each boot,
    `down` stops it (cluster.down, or one that also checks what it left)."""

    def __init__(
        self,
        fixture: str,
        cfg: SandboxConfig,
        prepare: Callable[[SandboxConfig], object] = lambda cfg: None,
        down: Callable[[SandboxConfig], object] = cluster.down,
    ) -> None:
        self.fixture, self.cfg, self._prepare, self._down = fixture, cfg, prepare, down
        self.up = False

    def get(self) -> SandboxConfig:
        """The worker's sandbox, booted now if it is not up."""
        if not self.up:
            cluster.up(self.cfg)
            self._prepare(self.cfg)
            self.up = True
        return self.cfg

    def stop_after(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        """After a test that used it, when the worker's next test does not: down."""
        if self.fixture not in getattr(item, "fixturenames", ()):
            return
        if nextitem is not None and self.fixture in getattr(nextitem, "fixturenames", ()):
            return
        self.stop()

    def stop(self) -> None:
        if self.up:
            self.up = False
            self._down(self.cfg)
