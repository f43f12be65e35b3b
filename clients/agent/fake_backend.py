"""The fake GPU backend: one JSON file per node, in the shape the NVML backend reads.

The file (`FakeNode`) holds GPU readings, events (injected Xids and the like), and an
optional InfiniBand section. The agent reads it every check; `inject` (the CLI's
`autoclusters inject`) changes it so that the named fault kind appears exactly as it would
from NVML or sysfs: an Xid event, an uncorrected ECC count, a lost GPU, a port going DOWN.

Writes are atomic (temporary file, fsync, rename) and serialised by an flock on
`<file>.lock`, so an agent reading concurrently sees the old or the new file, never half of
one, and two injections never lose each other. Events are numbered (`seq`); the backend
delivers each once per process. An agent restarted within `event_latch_s` sees recent
events again and keeps their faults firing, which its persisted state does not re-report.

Like NVML's event thread, the backend wakes the agent the moment an event lands: while the
agent's loop runs (`set_wake`), a watcher thread looks at the file's stat every `watch_s`
(0.2 s) and, when it changed, wakes the agent if the file brings what NVML would deliver
as an event: a new event (an Xid, a recovery action, a GPU lost), a GPU or the node newly
lost. It also wakes it for a new boot id: a real machine's agent starts again with the
machine and checks at once, where the sandbox's agent process lives through the "boot".
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, Field

from autoclusters.clients.agent.backend import read_boot_id
from autoclusters.clients.agent.fake_live import IDLE_TEMP_C, animate_gpus, animate_ib
from autoclusters.clients.agent.readings import (
    FabricReading,
    GpuEvent,
    GpuReading,
    GpuReadings,
    IbPortReading,
    IbReadings,
    NvLinkReading,
    RemappedRows,
)
from autoclusters.clients.agent.reporter import write_atomic

GPUS_PER_NODE = 8
NVLINKS_PER_GPU = 18  # H100/H200 SXM
HCAS_PER_NODE = 8
IB_RATE = "400 Gb/sec (4X NDR)"
IB_COUNTERS = ("link_downed", "symbol_error", "link_error_recovery", "port_rcv_errors")
NVLINK_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data")  # NVML_NVLINK_ERROR_DL_*
XID_FAULT = re.compile(r"^XID_(\d{1,3})$")
# The watcher's look at the file: one stat call; the file is read on a change. A fifth of a
# second is at once beside the agent's 10 s interval; every 0.05 s, the thread's wake-ups
# were a third of an idle sandbox agent's CPU.
WATCH_S = 0.2

log = logging.getLogger(__name__)


class FakeNode(BaseModel):
    gpus: GpuReadings
    events: list[GpuEvent] = Field(default_factory=list)
    last_seq: int = 0  # event numbers are never reused, even after a reset
    infiniband: IbReadings | None = None
    # This boot of the machine (None: the agent's own /proc value); `boot` sets a new one.
    boot_id: str | None = None
    # What only an active diagnostic finds (clients/agent/diag.py; DCGM diag's memory and
    # stress tests): a marginal GPU reads healthy through NVML until it is loaded.
    diag_failures: list[str] = Field(default_factory=list)
    # What the healthy node has, so a reset restores exactly that.
    shape: dict[str, int] = Field(
        default_factory=lambda: {
            "gpus": GPUS_PER_NODE,
            "nvlinks": NVLINKS_PER_GPU,
            "hcas": HCAS_PER_NODE,
        }
    )


class UnknownFault(ValueError):
    """A fault kind `inject` cannot produce; the message says which it can."""


def healthy_node(
    *, gpus: int = GPUS_PER_NODE, nvlinks: int = NVLINKS_PER_GPU, hcas: int = HCAS_PER_NODE
) -> FakeNode:
    """A node with nothing wrong: H200-like GPUs on an NVSwitch fabric, NDR InfiniBand."""
    readings = GpuReadings(backend="fake", driver_version="fake", device_count=gpus)
    for i in range(gpus):
        readings.gpus.append(
            GpuReading(
                index=i,
                uuid=f"GPU-fake-{i:04d}",
                pci_bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0",
                ecc_uncorrected_volatile=0,
                ecc_corrected_volatile=0,
                remapped_rows=RemappedRows(),
                nvlinks={
                    n: NvLinkReading(active=True, errors=dict.fromkeys(NVLINK_COUNTERS, 0))
                    for n in range(nvlinks)
                },
                recovery_action=0,
                fabric=FabricReading(state=3, status=0, health_summary=1),
                clock_event_reasons=0,
                temperature_c=IDLE_TEMP_C,
                slowdown_temp_c=87,
                pcie_replay_counter=0,
            )
        )
    ib = IbReadings(hcas=[f"mlx5_{n}" for n in range(hcas)])
    for hca in ib.hcas:
        ib.ports.append(
            IbPortReading(
                hca=hca, port=1, state="4: ACTIVE", phys_state="5: LinkUp", rate=IB_RATE,
                link_layer="InfiniBand", counters=dict.fromkeys(IB_COUNTERS, 0),
            )
        )  # fmt: skip
    shape = {"gpus": gpus, "nvlinks": nvlinks, "hcas": hcas}
    return FakeNode(gpus=readings, infiniband=ib if hcas else None, shape=shape)


def read_node(path: Path) -> FakeNode:
    return FakeNode.model_validate_json(Path(path).read_bytes())


def write_node(path: Path, node: FakeNode) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, node.model_dump_json(indent=1).encode())


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def update_node(
    path: Path, change: Callable[[FakeNode], None], *, gpus: int = GPUS_PER_NODE
) -> FakeNode:
    """Read (or start healthy, with `gpus`), change, write back atomically, under the lock."""
    path = Path(path)
    with _locked(path):
        node = read_node(path) if path.exists() else healthy_node(gpus=gpus)
        change(node)
        write_node(path, node)
        return node


def reset(path: Path) -> FakeNode:
    """A healthy node again (what a repair leaves); earlier event numbers are not reused."""

    def change(node: FakeNode) -> None:
        fresh = healthy_node(**node.shape)
        node.gpus, node.infiniband, node.events = fresh.gpus, fresh.infiniband, []
        node.diag_failures = []

    return update_node(path, change)


def boot(path: Path, *, healthy: bool, still_broken: Sequence[str] = ()) -> FakeNode:
    """The machine booted again (a reboot, or a new machine): a new boot id; healthy
    hardware if the repair fixed everything, else what is still broken shows again: an Xid
    fault raises its Xid anew once the machine is up (conditions stay in the file)."""
    at = datetime.now(UTC)

    def change(node: FakeNode) -> None:
        if healthy:
            fresh = healthy_node(**node.shape)
            node.gpus, node.infiniband, node.events = fresh.gpus, fresh.infiniband, []
            node.diag_failures = []
        else:
            for fault in still_broken:
                if m := XID_FAULT.match(fault):
                    gpu = next((e.gpu for e in node.events if e.code == int(m.group(1))), 0)
                    _event(node, "xid", int(m.group(1)), gpu, at)
        node.boot_id = str(uuid.uuid4())

    return update_node(path, change)


def inject(
    path: Path, *, fault: str, gpu: int = 0, hca: str | None = None, now: datetime | None = None
) -> FakeNode:
    """Make `fault` appear in the fake file as the real backend would read it."""
    at = now or datetime.now(UTC)
    apply = _injector(fault, gpu=gpu, hca=hca, at=at)
    return update_node(path, apply)


def injectable() -> list[str]:
    return ["XID_<n>", *sorted(_INJECTORS)]


def _injector(fault: str, *, gpu: int, hca: str | None, at: datetime) -> Callable[[FakeNode], None]:
    if m := XID_FAULT.match(fault):
        code = int(m.group(1))
        return lambda node: _event(node, "xid", code, gpu, at)
    if fault in LATENT_FAULTS:
        what = LATENT_FAULTS[fault]
        return lambda node: node.diag_failures.append(f"GPU {gpu}: {what}")
    if fault not in _INJECTORS:
        raise UnknownFault(
            f"cannot inject {fault!r}: the agent does not detect it on the node "
            f"(injectable: {', '.join(injectable())})"
        )
    fn = _INJECTORS[fault]
    return lambda node: fn(node, gpu, hca, at)


def _event(node: FakeNode, kind: str, code: int, gpu: int | None, at: datetime) -> None:
    node.last_seq += 1
    uuid = next((g.uuid for g in node.gpus.gpus if g.index == gpu), "")
    node.events.append(
        GpuEvent(kind=kind, code=code, gpu=gpu, uuid=uuid, at=at, seq=node.last_seq)  # type: ignore[arg-type]
    )


def _gpu(node: FakeNode, index: int) -> GpuReading:
    for g in node.gpus.gpus:
        if g.index == index:
            return g
    raise UnknownFault(f"the fake node has no GPU {index}")


def _port(node: FakeNode, hca: str | None) -> IbPortReading:
    if node.infiniband is None or not node.infiniband.ports:
        raise UnknownFault("the fake node has no InfiniBand ports")
    for p in node.infiniband.ports:
        if hca is None or p.hca == hca:
            return p
    raise UnknownFault(f"the fake node has no HCA {hca}")


def _fell_off(node: FakeNode, gpu: int, _hca: str | None, _at: datetime) -> None:
    _gpu(node, gpu).lost = True


def _count_low(node: FakeNode, gpu: int, _hca: str | None, _at: datetime) -> None:
    node.gpus.gpus = [g for g in node.gpus.gpus if g.index != gpu]
    node.gpus.device_count = len(node.gpus.gpus)


def _ecc(node: FakeNode, gpu: int, _hca: str | None, _at: datetime) -> None:
    g = _gpu(node, gpu)
    g.ecc_uncorrected_volatile = (g.ecc_uncorrected_volatile or 0) + 1


def _remap(failure: bool) -> Callable[[FakeNode, int, str | None, datetime], None]:
    def change(node: FakeNode, gpu: int, _hca: str | None, _at: datetime) -> None:
        g = _gpu(node, gpu)
        rows = g.remapped_rows or RemappedRows()
        rows.uncorrectable += 1
        rows.pending = rows.pending or not failure
        rows.failure = rows.failure or failure
        g.remapped_rows = rows

    return change


def _nvlink(node: FakeNode, gpu: int, _hca: str | None, _at: datetime) -> None:
    g = _gpu(node, gpu)
    g.nvlinks[0] = NvLinkReading(active=False)


def _recovery(node: FakeNode, gpu: int, _hca: str | None, _at: datetime) -> None:
    _gpu(node, gpu).recovery_action = 2  # NVML_GPU_RECOVERY_ACTION_NODE_REBOOT


def _fabric(node: FakeNode, gpu: int, _hca: str | None, _at: datetime) -> None:
    _gpu(node, gpu).fabric = FabricReading(state=3, status=999, health_summary=2)


def _thermal(node: FakeNode, gpu: int, _hca: str | None, _at: datetime) -> None:
    g = _gpu(node, gpu)
    g.clock_event_reasons = (g.clock_event_reasons or 0) | 0x40  # HwThermalSlowdown
    g.temperature_c = g.slowdown_temp_c or 90


def _hung(node: FakeNode, _gpu: int, _hca: str | None, _at: datetime) -> None:
    node.gpus.hung_calls = ["nvmlDeviceGetCount"]


def _nvlink_errors(node: FakeNode, gpu: int, _hca: str | None, _at: datetime) -> None:
    link = _gpu(node, gpu).nvlinks.setdefault(0, NvLinkReading(active=True))
    link.errors["replay"] = link.errors.get("replay", 0) + 100_000


def _pcie(node: FakeNode, gpu: int, _hca: str | None, _at: datetime) -> None:
    g = _gpu(node, gpu)
    g.pcie_replay_counter = (g.pcie_replay_counter or 0) + 100_000


def _ib_down(node: FakeNode, _gpu: int, hca: str | None, _at: datetime) -> None:
    p = _port(node, hca)
    p.state, p.phys_state = "1: DOWN", "3: Disabled"


def _ib_degraded(node: FakeNode, _gpu: int, hca: str | None, _at: datetime) -> None:
    p = _port(node, hca)
    p.counters["link_downed"] = p.counters.get("link_downed", 0) + 1


def _hca_gone(node: FakeNode, _gpu: int, hca: str | None, _at: datetime) -> None:
    ib = node.infiniband
    name = _port(node, hca).hca
    assert ib is not None
    ib.hcas = [h for h in ib.hcas if h != name]
    ib.ports = [p for p in ib.ports if p.hca != name]


_INJECTORS: dict[str, Callable[[FakeNode, int, str | None, datetime], None]] = {
    "GPU_FELL_OFF_BUS": _fell_off,
    "GPU_COUNT_LOW": _count_low,
    "ECC_DBE": _ecc,
    "ROW_REMAP_PENDING": _remap(failure=False),
    "ROW_REMAP_FAILURE": _remap(failure=True),
    "NVLINK_DOWN": _nvlink,
    "GPU_RECOVERY_ACTION": _recovery,
    "FABRIC_NOT_READY": _fabric,
    "THERMAL": _thermal,
    "GPU_DRIVER_UNRESPONSIVE": _hung,
    "NVLINK_ERRORS": _nvlink_errors,
    "PCIE_ERRORS": _pcie,
    "IB_LINK_DOWN": _ib_down,
    "IB_LINK_DEGRADED": _ib_degraded,
    "HCA_FELL_OFF_BUS": _hca_gone,
}


# Faults no passive read shows (the agent never reports them, the health gate passes):
# only the active diagnostic of a burn-in screen finds them. Injected like the others.
LATENT_FAULTS: dict[str, str] = {
    "GPU_MARGINAL": "memory stress test failed (marginal HBM)",
}


@dataclass(frozen=True)
class _Marks:
    """What the watcher compares between two versions of the file."""

    stat: tuple[int, int, int] | None  # inode, mtime, size: a write replaces the file
    seq: int = 0  # the newest event's number
    lost: frozenset[int] = frozenset()  # GPUs NVML would answer GPU_IS_LOST for
    node_lost: bool = False
    boot_id: str | None = None

    @classmethod
    def of(cls, stat: tuple[int, int, int] | None, node: FakeNode) -> _Marks:
        return cls(
            stat=stat,
            seq=max((e.seq for e in node.events), default=0),
            lost=frozenset(g.index for g in node.gpus.gpus if g.lost),
            node_lost=node.gpus.lost,
            boot_id=node.boot_id,
        )

    def wakes(self, before: _Marks) -> bool:
        """What NVML would deliver as an event (or a restarted agent check at once)."""
        return (
            self.seq > before.seq
            or bool(self.lost - before.lost)
            or (self.node_lost and not before.node_lost)
            or self.boot_id != before.boot_id
        )


def _stat(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


class FakeBackend:
    """Reads the fake file; a missing file is written healthy first, so inject has a base."""

    name = "fake"

    def __init__(
        self,
        path: Path,
        *,
        gpus: int = GPUS_PER_NODE,
        clock: Callable[[], float] = time.time,
        watch_s: float = WATCH_S,
    ) -> None:
        self.path = Path(path)
        self._gpus = gpus  # for a file this backend has to create
        self._clock = clock  # drives the live values (fake_live)
        self._since = clock()  # their counters count from here
        self._delivered = 0  # the highest event seq handed out
        self._node: FakeNode | None = None
        self._boot_id: str | None = None
        self._watch_s = watch_s
        self._wake: Callable[[], None] | None = None
        self._watcher: threading.Thread | None = None
        self._watch_stop = threading.Event()

    def open(self) -> None:
        if not self.path.exists():
            update_node(self.path, lambda node: None, gpus=self._gpus)

    def _load(self) -> FakeNode:
        self._node = read_node(self.path)
        self._boot_id = self._node.boot_id
        return self._node

    def boot_id(self) -> str:
        """The fake machine's boot id as of the last read (the real one when it has none)."""
        return self._boot_id or read_boot_id()

    def read(self) -> GpuReadings:
        readings = self._load().gpus
        readings.backend = self.name
        animate_gpus(readings, self._clock(), self._since)
        return readings

    def events(self) -> list[GpuEvent]:
        node = self._node or self._load()
        self._node = None
        new = [e for e in node.events if e.seq > self._delivered]
        self._delivered = max([self._delivered, *(e.seq for e in new)])
        return new

    def set_wake(self, wake: Callable[[], None] | None) -> None:
        """Start the watcher (what is in the file now wakes nothing: the agent's own check
        reads it), or stop it (None)."""
        self._wake = wake
        if wake is None:
            self._stop_watching()
            return
        if self._watcher is not None:
            return
        stat = _stat(self.path)
        try:
            seen = _Marks.of(stat, read_node(self.path))
        except (OSError, ValueError):
            seen = _Marks(stat=None)  # no file yet: the first one is compared with nothing
        self._watch_stop = threading.Event()
        self._watcher = threading.Thread(
            target=self._watch, args=(self._watch_stop, seen), name="fake-events", daemon=True
        )
        self._watcher.start()

    def close(self) -> None:
        self._stop_watching()

    def _stop_watching(self) -> None:
        self._watch_stop.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=self._watch_s + 5)
        self._watcher = None

    def _watch(self, stop: threading.Event, seen: _Marks) -> None:
        while not stop.wait(self._watch_s):
            stat = _stat(self.path)
            if stat is None or stat == seen.stat:
                continue
            try:
                now = _Marks.of(stat, read_node(self.path))
            except (OSError, ValueError):
                continue  # unreadable: the agent's next check says so
            news, seen = now.wakes(seen), now
            wake = self._wake
            if news and wake is not None and not stop.is_set():
                try:
                    wake()
                except Exception:
                    log.exception("the agent's wake-up failed; the event waits for the next check")


class FakeInfiniband:
    """The fake file's InfiniBand section, for an agent run without a sysfs root.

    The link watch reads it every second (link_watch.py): the file is parsed again only
    when its stat changed (a write replaces it), as the events' watcher does."""

    def __init__(self, path: Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self._clock = clock
        self._since = clock()
        self._parsed: tuple[tuple[int, int, int], IbReadings | None] | None = None

    def read(self) -> IbReadings | None:
        stat = _stat(self.path)
        if stat is None or self._parsed is None or self._parsed[0] != stat:
            parsed = read_node(self.path).infiniband
            if stat is not None:
                self._parsed = (stat, parsed)
        else:
            parsed = self._parsed[1]
        ib = parsed.model_copy(deep=True) if parsed is not None else None
        animate_ib(ib, self._clock(), self._since)
        return ib
