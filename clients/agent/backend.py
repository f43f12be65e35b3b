"""The interface between the agent and what it reads: a GPU backend and an InfiniBand source.

A GPU backend gives the device count and per-device readings (`read`) and the events that
arrived since the last call (`events`: Xids, recovery-action changes, GPU lost). Two
implement it: `nvml_backend.NvmlBackend` (real NVML through pynvml) and
`fake_backend.FakeBackend` (a JSON file that `autoclusters inject` writes).

An event must not wait for the agent's next periodic check: the agent hands the backend a
wake-up (`set_wake`), which the backend calls, from whatever thread receives the event, the
moment one arrives; the agent then checks at once (agent.py).

An InfiniBand source gives the adapters and ports (`infiniband.SysfsInfiniband`, or the
fake file's `infiniband` section); None means the node has no InfiniBand to check.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from autoclusters.clients.agent.readings import GpuEvent, GpuReadings, IbReadings

BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")


def read_boot_id(path: Path = BOOT_ID_FILE) -> str:
    """This boot of the machine: a reboot or a new machine changes it ("" if unreadable).
    A backend may say otherwise (`boot_id()`: the fake backend's file carries its own)."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


class BackendUnavailable(RuntimeError):
    """The backend cannot run on this machine; the message is one line for the operator."""


class GpuBackend(Protocol):
    name: str

    def open(self) -> None:
        """Connect (nvmlInit, event registration); raises BackendUnavailable."""
        ...

    def read(self) -> GpuReadings:
        """One reading of every GPU. Never raises for a GPU fault: faults are readings."""
        ...

    def events(self) -> list[GpuEvent]:
        """The events that arrived since the last call, oldest first."""
        ...

    def set_wake(self, wake: Callable[[], None] | None) -> None:
        """Call `wake` (from any thread; it must not block) as soon as an event arrives
        (an Xid, a recovery action, a GPU lost); None: stop calling it."""
        ...

    def close(self) -> None: ...


class IbSource(Protocol):
    def read(self) -> IbReadings | None:
        """The node's adapters and ports; None when it has no InfiniBand at all."""
        ...
