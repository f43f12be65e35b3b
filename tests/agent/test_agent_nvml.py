"""The NVML backend's logic, with a stand-in for the `pynvml` module passed in (the real
one needs a driver; tests/agent/test_agent_cli.py checks the real one fails cleanly here):

- readings: UUIDs as bytes or str, ECC, remapped rows, NVLinks (non-existent links asked
  once), the recovery-action field, fabric info, clock reasons, temperature, PCIe replays;
- NVML_ERROR_GPU_IS_LOST on a GPU or on the device count; RESET_REQUIRED; other errors
  are kept per call;
- an older pynvml without the newer functions and constants still reads what it can;
- Xid and recovery-action events arrive through the event thread; a lost GPU on the wait;
- a hung call is reported, later calls fail fast while it is stuck, and it recovers;
- nvmlInit failing (no library, no driver, hung) is BackendUnavailable with one line.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from autoclusters.clients.agent.agent import Agent
from autoclusters.clients.agent.backend import BackendUnavailable
from autoclusters.clients.agent.nvml_backend import NvmlBackend
from autoclusters.clients.agent.settings import AgentSettings
from autoclusters.clients.agent.watchdog import Hung, Watchdog
from autoclusters.core.node_report import NodeReport
from tests.fakes.systems import ReportSink


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class Handle:
    def __init__(self, index: int) -> None:
        self.index = index


class FakeNvml:
    """The pynvml calls the backend makes, over a little model of `n` GPUs."""

    NVMLError = NVMLError
    NVML_NVLINK_MAX_LINKS = 4
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
    nvmlEventTypeXidCriticalError = 0x8
    nvmlEventTypeGpuRecoveryAction = 0x8000

    def __init__(self, n: int = 2, *, init_error: int | None = None) -> None:
        self.n = n
        self.init_error = init_error
        self.handles = [Handle(i) for i in range(n)]
        self.ecc = [0] * n
        self.rows = [(0, 0, 0, 0)] * n
        self.links_up = [{0: 1, 1: 1} for _ in range(n)]  # links 2, 3 do not exist
        self.recovery = [0] * n
        self.fabric = [(3, 0)] * n
        self.reasons = [0] * n
        self.errors: dict[tuple[str, int], int] = {}  # (call, gpu) -> NVML error
        self.count_error: int | None = None
        self.calls: list[str] = []
        self.block: dict[str, threading.Event] = {}  # call -> released when set
        self.events: queue.Queue[Any] = queue.Queue()
        self.registered: list[tuple[int, int]] = []

    def _enter(self, name: str, h: Handle | None = None) -> None:
        self.calls.append(name)
        if name in self.block:
            self.block[name].wait()
        if h is not None and (name, h.index) in self.errors:
            raise NVMLError(self.errors[(name, h.index)])

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if self.init_error is not None:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"570.124.06"

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        if self.count_error is not None:
            raise NVMLError(self.count_error)
        return self.n

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Handle:
        return self.handles[i]

    def nvmlDeviceGetUUID(self, h: Handle) -> bytes:
        return f"GPU-{h.index:04d}".encode()  # bytes, as older pynvml returns

    def nvmlDeviceGetPciInfo_v3(self, h: Handle) -> Any:
        return SimpleNamespace(busId=f"00000000:{h.index:02X}:00.0")

    def nvmlDeviceGetTotalEccErrors(self, h: Handle, kind: int, counter: int) -> int:
        self._enter("nvmlDeviceGetTotalEccErrors", h)
        return self.ecc[h.index] if kind == 1 else 0

    def nvmlDeviceGetRemappedRows(self, h: Handle) -> tuple[int, int, int, int]:
        self._enter("nvmlDeviceGetRemappedRows", h)
        return self.rows[h.index]

    def nvmlDeviceGetNvLinkState(self, h: Handle, link: int) -> int:
        self._enter(f"nvmlDeviceGetNvLinkState[{link}]", h)
        if link not in self.links_up[h.index]:
            raise NVMLError(2)  # INVALID_ARGUMENT: no such link
        return self.links_up[h.index][link]

    def nvmlDeviceGetNvLinkErrorCounter(self, h: Handle, link: int, counter: int) -> int:
        return 0

    def nvmlDeviceGetFieldValues(self, h: Handle, ids: list[int]) -> list[Any]:
        self._enter("nvmlDeviceGetFieldValues", h)
        assert ids == [230]
        value = SimpleNamespace(uiVal=self.recovery[h.index])
        return [SimpleNamespace(nvmlReturn=0, valueType=1, value=value)]

    class c_nvmlGpuFabricInfo_v3_t:  # noqa: N801 (pynvml's name)
        state = status = healthMask = healthSummary = 0

    def nvmlDeviceGetGpuFabricInfoV(self, h: Handle, info: Any) -> int:
        info.state, info.status = self.fabric[h.index]
        info.healthSummary = 1
        return 0

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Handle) -> int:
        return self.reasons[h.index]

    def nvmlDeviceGetTemperature(self, h: Handle, sensor: int) -> int:
        return 45

    def nvmlDeviceGetTemperatureThreshold(self, h: Handle, kind: int) -> int:
        self._enter("nvmlDeviceGetTemperatureThreshold", h)
        return 87

    def nvmlDeviceGetPcieReplayCounter(self, h: Handle) -> int:
        return 0

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceGetSupportedEventTypes(self, h: Handle) -> int:
        return 0xFFFF

    def nvmlDeviceRegisterEvents(self, h: Handle, mask: int, es: str) -> None:
        self.registered.append((h.index, mask))

    def nvmlEventSetWait_v2(self, es: str, ms: int) -> Any:
        try:
            item = self.events.get(timeout=ms / 1000)
        except queue.Empty:
            raise NVMLError(10) from None  # TIMEOUT
        if isinstance(item, int):
            raise NVMLError(item)
        return item

    def nvmlEventSetFree(self, es: str) -> None:
        self._enter("nvmlEventSetFree")


def old_pynvml(nvml: FakeNvml) -> SimpleNamespace:
    """What a 12.x-era pynvml offers: no field values, fabric, event reasons or link count."""
    names = [n for n in dir(nvml) if n.startswith(("nvml", "NVMLError"))]
    drop = {
        "nvmlDeviceGetFieldValues", "nvmlDeviceGetGpuFabricInfoV",
        "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetPciInfo_v3",
        "nvmlEventTypeGpuRecoveryAction",
    }  # fmt: skip
    mod = SimpleNamespace(**{n: getattr(nvml, n) for n in names if n not in drop})
    mod.nvmlDeviceGetCurrentClocksThrottleReasons = nvml.nvmlDeviceGetCurrentClocksEventReasons
    return mod


@pytest.fixture
def nvml() -> FakeNvml:
    return FakeNvml()


@pytest.fixture
def backend(nvml: FakeNvml) -> Iterator[NvmlBackend]:
    b = NvmlBackend(nvml=nvml, timeout_s=0.5, event_wait_ms=50)
    b.open()
    yield b
    for ev in nvml.block.values():
        ev.set()
    b.close()


def eventually(check: Callable[[], Any], what: str, timeout_s: float = 5) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if got := check():
            return got
        threading.Event().wait(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def agent(backend: NvmlBackend) -> Agent:
    settings = AgentSettings(hold_checks=1, clear_checks=1, hold_checks_by_fault={})
    return Agent(
        node="gpu-09", settings=settings, backend=backend, infiniband=None, sink=ReportSink()
    )


def test_healthy_readings(backend: NvmlBackend, nvml: FakeNvml) -> None:
    r = backend.read()
    assert (r.backend, r.driver_version, r.device_count, r.lost, r.hung_calls) == (
        "nvml", "570.124.06", 2, False, [],
    )  # fmt: skip
    g = r.gpus[1]
    assert (g.uuid, g.pci_bus_id, g.ecc_uncorrected_volatile) == ("GPU-0001", "00000000:01:00.0", 0)
    assert sorted(g.nvlinks) == [0, 1] and all(link.active for link in g.nvlinks.values())
    assert g.recovery_action == 0 and g.fabric is not None and g.fabric.state == 3
    assert (g.temperature_c, g.slowdown_temp_c, g.pcie_replay_counter, g.errors) == (45, 87, 0, {})
    nvml.calls.clear()
    backend.read()
    assert "nvmlDeviceGetNvLinkState[2]" not in nvml.calls  # missing links asked once
    assert "nvmlDeviceGetTemperatureThreshold" not in nvml.calls  # a constant: cached
    assert agent(backend).check().findings == {}


def test_faults_read_through_nvml(backend: NvmlBackend, nvml: FakeNvml) -> None:
    a = agent(backend)
    a.check()  # links seen up
    nvml.ecc[0] = 3
    nvml.rows = [(0, 1, 1, 0), (0, 0, 0, 1)]
    nvml.links_up[1][1] = 0
    nvml.recovery[1] = 1
    nvml.fabric = [(3, 0), (3, 999)]
    nvml.reasons[0] = 0x80
    got = {r.fault for r in a.check().reports}
    assert got == {
        "ECC_DBE", "ROW_REMAP_PENDING", "ROW_REMAP_FAILURE", "NVLINK_DOWN",
        "GPU_RECOVERY_ACTION", "FABRIC_NOT_READY", "THERMAL",
    }  # fmt: skip


def test_gpu_lost_and_reset_required(backend: NvmlBackend, nvml: FakeNvml) -> None:
    nvml.errors[("nvmlDeviceGetTotalEccErrors", 1)] = 15
    nvml.errors[("nvmlDeviceGetRemappedRows", 0)] = 16
    nvml.errors[("nvmlDeviceGetFieldValues", 0)] = 999
    r = backend.read()
    assert r.gpus[1].lost and not r.gpus[0].lost
    assert r.gpus[0].reset_required
    assert r.gpus[0].errors.keys() == {"nvmlDeviceGetRemappedRows", "nvmlDeviceGetFieldValues"}
    a = agent(backend)
    assert {x.fault for x in a.check().reports} == {"GPU_FELL_OFF_BUS", "GPU_RECOVERY_ACTION"}
    nvml.count_error = 15
    assert backend.read().lost


def test_an_older_pynvml_reads_what_it_can(nvml: FakeNvml) -> None:
    b = NvmlBackend(nvml=old_pynvml(nvml), timeout_s=0.5, event_wait_ms=50)
    b.open()
    try:
        g = b.read().gpus[0]
        assert g.recovery_action is None and g.fabric is None and g.pci_bus_id == ""
        assert g.clock_event_reasons == 0 and sorted(g.nvlinks) == [0, 1]
        assert nvml.registered == [(0, 0x8), (1, 0x8)]  # Xids only: no recovery events
    finally:
        b.close()


def test_events_arrive_through_the_wait_thread(backend: NvmlBackend, nvml: FakeNvml) -> None:
    assert nvml.registered == [(0, 0x8008), (1, 0x8008)]
    nvml.events.put(SimpleNamespace(device=nvml.handles[1], eventType=0x8, eventData=79))
    nvml.events.put(SimpleNamespace(device=nvml.handles[0], eventType=0x8000, eventData=2))
    nvml.events.put(15)  # the wait itself: GPU is lost
    got: list[Any] = []

    def three() -> bool:
        got.extend(backend.events())
        return len(got) >= 3

    eventually(three, "three events")
    assert [(e.kind, e.code, e.gpu, e.uuid) for e in got] == [
        ("xid", 79, 1, "GPU-0001"),
        ("recovery_action", 2, 0, "GPU-0000"),
        ("gpu_lost", 0, None, ""),
    ]


def test_a_hung_call_is_reported_and_recovers(backend: NvmlBackend, nvml: FakeNvml) -> None:
    a = agent(backend)
    a.check()
    release = nvml.block["nvmlDeviceGetRemappedRows"] = threading.Event()
    r = backend.read()
    assert r.hung_calls == ["nvmlDeviceGetRemappedRows"]
    started = time.monotonic()
    r = backend.read()  # still stuck: fails fast, names the stuck call
    assert time.monotonic() - started < 0.4
    assert r.hung_calls == ["nvmlDeviceGetRemappedRows"]
    assert {x.fault for x in a.check().reports} == {"GPU_DRIVER_UNRESPONSIVE"}
    del nvml.block["nvmlDeviceGetRemappedRows"]
    release.set()
    eventually(lambda: backend.read().hung_calls == [], "the stuck call to return")


def test_watchdog_passes_results_and_errors() -> None:
    w = Watchdog(timeout_s=1)
    assert w.call("add", lambda a, b: a + b, 2, 3) == 5
    with pytest.raises(ZeroDivisionError):
        w.call("div", lambda: 1 / 0)
    gate = threading.Event()
    with pytest.raises(Hung, match="stuck did not return"):
        Watchdog(timeout_s=0.05).call("stuck", gate.wait)
    gate.set()


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (12, "NVML unavailable: driver not loaded (libnvidia-ml.so.1 not found)"),
        (9, "NVML unavailable: the NVIDIA kernel driver is not loaded (nvmlInit)"),
        (4, "NVML unavailable: no permission to use the NVIDIA devices (nvmlInit)"),
        (999, "NVML unavailable: nvmlInit failed: NVML error 999"),
    ],
)
def test_init_failures_are_one_line(code: int, message: str) -> None:
    with pytest.raises(BackendUnavailable) as e:
        NvmlBackend(nvml=FakeNvml(init_error=code)).open()
    assert str(e.value) == message


def test_a_hung_init_is_unavailable() -> None:
    nvml = FakeNvml()
    gate = nvml.block["nvmlInit"] = threading.Event()
    with pytest.raises(BackendUnavailable, match="nvmlInit did not return within 0.1 s"):
        NvmlBackend(nvml=nvml, timeout_s=0.1).open()
    gate.set()


def test_the_event_thread_wakes_the_agent_with_the_event_queued(
    backend: NvmlBackend, nvml: FakeNvml
) -> None:
    woke: queue.Queue[list[Any]] = queue.Queue()
    backend.set_wake(lambda: woke.put(backend.events()))  # what the wake-up's check reads
    nvml.events.put(SimpleNamespace(device=nvml.handles[1], eventType=0x8, eventData=79))
    [xid] = woke.get(timeout=5)
    assert (xid.kind, xid.code, xid.gpu) == ("xid", 79, 1)
    nvml.events.put(SimpleNamespace(device=nvml.handles[0], eventType=0x8000, eventData=2))
    [action] = woke.get(timeout=5)
    assert (action.kind, action.code, action.gpu) == ("recovery_action", 2, 0)
    nvml.events.put(15)  # the wait itself: GPU is lost
    [lost] = woke.get(timeout=5)
    assert lost.kind == "gpu_lost"
    backend.set_wake(None)  # the agent's loop ended: events queue for a later check only
    nvml.events.put(SimpleNamespace(device=nvml.handles[0], eventType=0x8, eventData=48))
    [late] = eventually(backend.events, "the Xid queued")
    assert late.code == 48 and woke.empty()


def test_an_xid_through_nvml_is_reported_without_waiting_for_the_interval(
    backend: NvmlBackend, nvml: FakeNvml
) -> None:
    class Sink:
        def __init__(self) -> None:
            self.cv = threading.Condition()
            self.reports: list[tuple[float, NodeReport]] = []
            self.flushes = 0

        def submit(self, reports: list[NodeReport]) -> None:
            with self.cv:
                self.reports += [(time.monotonic(), r) for r in reports]

        def flush(self) -> None:
            with self.cv:
                self.flushes += 1
                self.cv.notify_all()

    sink = Sink()
    settings = AgentSettings(interval_s=60, hold_checks=3, hold_checks_by_fault={})
    a = Agent(node="gpu-09", settings=settings, backend=backend, infiniband=None, sink=sink)
    stop = threading.Event()
    loop = threading.Thread(target=a.run, args=(stop,))
    loop.start()
    try:
        with sink.cv:
            assert sink.cv.wait_for(lambda: sink.flushes >= 1, 5)  # the first check ran
        put = time.monotonic()
        nvml.events.put(SimpleNamespace(device=nvml.handles[0], eventType=0x8, eventData=79))
        with sink.cv:
            assert sink.cv.wait_for(lambda: sink.reports, 5)
    finally:
        stop.set()
        a.wake()
        loop.join(timeout=5)
    assert not loop.is_alive()
    [(at, report)] = sink.reports
    assert (report.fault, report.state.value) == ("XID_79", "firing")
    assert at - put < 2.0  # a few ms here; the interval is 60 s
