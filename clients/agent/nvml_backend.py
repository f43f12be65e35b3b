"""The real GPU backend: NVML through `pynvml` (the nvidia-ml-py package).

Every NVML call goes through a `watchdog.Watchdog`: a call that hangs is abandoned and
shows up as `GpuReadings.hung_calls` (the classifier makes GPU_DRIVER_UNRESPONSIVE of it).
NVML_ERROR_GPU_IS_LOST marks the GPU (or the node, for the device count) lost; NOT_SUPPORTED
leaves a reading None; any other error is kept in `GpuReading.errors`.

Xids arrive on an NVML event set (nvmlEventSetCreate / nvmlDeviceRegisterEvents /
nvmlEventSetWait_v2) waited on by a daemon thread; its heartbeat going stale is reported
as a hung nvmlEventSetWait_v2. The thread queues each event for `events()` and calls the
agent's wake-up (`set_wake`) at once, so the agent checks now, not at its next interval.

pynvml versions differ (12.x vs 13.x): functions and constants that may be missing are
looked up with getattr and their checks skipped when absent.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from autoclusters.clients.agent.backend import BackendUnavailable, read_boot_id
from autoclusters.clients.agent.readings import (
    FabricReading,
    GpuEvent,
    GpuReading,
    GpuReadings,
    NvLinkReading,
    RemappedRows,
)
from autoclusters.clients.agent.watchdog import Hung, Watchdog

log = logging.getLogger(__name__)

# NVML return codes, the same in every pynvml version (nvml.h).
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_INVALID_ARGUMENT = 2
ERROR_DRIVER_NOT_LOADED = 9
ERROR_TIMEOUT = 10
ERROR_LIBRARY_NOT_FOUND = 12
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_GPU_IS_LOST = 15
ERROR_RESET_REQUIRED = 16
ERROR_ARGUMENT_VERSION_MISMATCH = 25
# Event bits and field ids (pynvml names, with the values nvml.h gives them).
EVENT_XID = 0x8
EVENT_RECOVERY_ACTION = 0x8000
FI_RECOVERY_ACTION = 230
NVLINK_COUNTERS = {"replay": 0, "recovery": 1, "crc_flit": 2, "crc_data": 3}
FALLBACK_MAX_LINKS = 18
MIB = 1024 * 1024
# nvmlValueType_t -> the c_nvmlValue_t member holding it.
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}


class _GpuLost(Exception):
    pass


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def unavailable_message(e: BaseException, nvml: Any | None = None) -> str:
    """One line saying why NVML cannot be used here."""
    if isinstance(e, ImportError):
        return "NVML unavailable: the nvidia-ml-py package (import pynvml) is not installed"
    if isinstance(e, Hung):
        return f"NVML unavailable: {e} (driver unresponsive)"
    value = getattr(e, "value", None)
    if value == ERROR_LIBRARY_NOT_FOUND:
        return "NVML unavailable: driver not loaded (libnvidia-ml.so.1 not found)"
    if value == ERROR_DRIVER_NOT_LOADED:
        return "NVML unavailable: the NVIDIA kernel driver is not loaded (nvmlInit)"
    if value == ERROR_NO_PERMISSION:
        return "NVML unavailable: no permission to use the NVIDIA devices (nvmlInit)"
    return f"NVML unavailable: nvmlInit failed: {_text(e) or type(e).__name__}"


class NvmlBackend:
    """NVML readings and events; `open()` raises BackendUnavailable without a driver."""

    name = "nvml"

    def __init__(
        self,
        *,
        timeout_s: float = 10.0,
        event_wait_ms: int = 1000,
        nvml: Any | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._nvml: Any = nvml
        self._watchdog = Watchdog(timeout_s=timeout_s)
        self._wait_ms = event_wait_ms
        self._clock = clock
        self._events: list[GpuEvent] = []
        self._lock = threading.Lock()
        self._wake: Callable[[], None] | None = None  # the agent's, while its loop runs
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: Any = None
        self._heartbeat = time.monotonic()
        self._handle_index: dict[Any, tuple[int, str]] = {}
        self._no_links: dict[str, set[int]] = {}  # GPU -> links that do not exist
        self._slowdown: dict[str, int | None] = {}
        self._names: dict[str, str] = {}  # GPU -> model name
        self._driver = ""

    # --- lifecycle ---------------------------------------------------------------------

    def open(self) -> None:
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            self._call("nvmlInit", self._nvml.nvmlInit)
        except BaseException as e:
            if isinstance(e, ImportError | Hung) or self._is_nvml_error(e):
                raise BackendUnavailable(unavailable_message(e)) from None
            raise
        driver = self._fn("nvmlSystemGetDriverVersion")
        try:
            self._driver = _text(self._call("nvmlSystemGetDriverVersion", driver)) if driver else ""
        except Exception:
            self._driver = ""
        self._start_events()

    def boot_id(self) -> str:
        return read_boot_id()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._wait_ms / 1000 + 2)
        n = self._nvml
        if n is None:
            return
        for name, args in (("nvmlEventSetFree", (self._event_set,)), ("nvmlShutdown", ())):
            if name == "nvmlEventSetFree" and self._event_set is None:
                continue
            try:
                self._call(name, getattr(n, name), *args)
            except Exception as e:
                log.debug("%s: %s", name, e)

    # --- readings ----------------------------------------------------------------------

    def read(self) -> GpuReadings:
        out = GpuReadings(backend=self.name, driver_version=self._driver)
        try:
            self._read_into(out)
        except Hung as e:
            out.hung_calls.append(e.call)
        if self._thread is not None and self._thread.is_alive():
            stale = time.monotonic() - self._heartbeat
            if stale > self._wait_ms / 1000 + self._watchdog.timeout_s:
                out.hung_calls.append("nvmlEventSetWait_v2")
        return out

    def events(self) -> list[GpuEvent]:
        with self._lock:
            got, self._events = self._events, []
        return got

    def set_wake(self, wake: Callable[[], None] | None) -> None:
        self._wake = wake

    def _read_into(self, out: GpuReadings) -> None:
        n = self._nvml
        try:
            count = int(self._call("nvmlDeviceGetCount", n.nvmlDeviceGetCount))
        except Hung:
            raise
        except Exception as e:
            if getattr(e, "value", None) == ERROR_GPU_IS_LOST:
                out.lost = True
                return
            raise
        out.device_count = count
        for i in range(count):
            g = GpuReading(index=i)
            out.gpus.append(g)
            try:
                self._read_gpu(i, g)
            except _GpuLost:
                g.lost = True

    def _read_gpu(self, i: int, g: GpuReading) -> None:
        h = self._opt(g, "nvmlDeviceGetHandleByIndex", i)
        if h is None:
            return
        g.uuid = _text(self._opt(g, "nvmlDeviceGetUUID", h) or "")
        self._handle_index[_handle_key(h)] = (i, g.uuid)
        pci = self._opt(g, "nvmlDeviceGetPciInfo_v3", h, alt="nvmlDeviceGetPciInfo")
        g.pci_bus_id = _text(getattr(pci, "busId", "") or "")
        key = g.uuid or str(i)
        vol = self._const("NVML_VOLATILE_ECC", 0)
        for attr, kind in (
            ("ecc_uncorrected_volatile", self._const("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)),
            ("ecc_corrected_volatile", self._const("NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)),
        ):
            setattr(g, attr, self._opt(g, "nvmlDeviceGetTotalEccErrors", h, kind, vol))
        rows = self._opt(g, "nvmlDeviceGetRemappedRows", h)
        if rows is not None:
            c, u, p, f = (int(x) for x in tuple(rows)[:4])
            g.remapped_rows = RemappedRows(
                correctable=c, uncorrectable=u, pending=bool(p), failure=bool(f)
            )
        self._read_nvlinks(g, h, key)
        g.recovery_action = self._recovery_action(g, h)
        g.fabric = self._fabric(g, h)
        g.clock_event_reasons = self._opt(
            g, "nvmlDeviceGetCurrentClocksEventReasons", h,
            alt="nvmlDeviceGetCurrentClocksThrottleReasons",
        )  # fmt: skip
        g.temperature_c = self._opt(
            g, "nvmlDeviceGetTemperature", h, self._const("NVML_TEMPERATURE_GPU", 0)
        )
        if key not in self._slowdown:
            slowdown = self._const("NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", 1)
            self._slowdown[key] = self._opt(g, "nvmlDeviceGetTemperatureThreshold", h, slowdown)
        g.slowdown_temp_c = self._slowdown.get(key)
        g.pcie_replay_counter = self._opt(g, "nvmlDeviceGetPcieReplayCounter", h)
        self._read_usage(g, h, key)

    def _read_usage(self, g: GpuReading, h: Any, key: str) -> None:
        """What dcgm-exporter's default series show; each call left out when unsupported."""
        if not self._names.get(key):  # constant per GPU: asked until it answers once
            self._names[key] = _text(self._opt(g, "nvmlDeviceGetName", h) or "")
        g.name = self._names[key]
        util = self._opt(g, "nvmlDeviceGetUtilizationRates", h)
        g.utilization_gpu = int(util.gpu) if util is not None else None
        milliwatts = self._opt(g, "nvmlDeviceGetPowerUsage", h)
        g.power_w = int(milliwatts) / 1000 if milliwatts is not None else None
        energy = self._opt(g, "nvmlDeviceGetTotalEnergyConsumption", h)
        g.energy_mj = int(energy) if energy is not None else None
        mem = self._opt(g, "nvmlDeviceGetMemoryInfo", h)
        if mem is not None:
            g.fb_used_mib, g.fb_free_mib = int(mem.used) // MIB, int(mem.free) // MIB
        g.nvlink_bandwidth_kib = self._nvlink_throughput(g, h)

    def _nvlink_throughput(self, g: GpuReading, h: Any) -> int | None:
        """NVML's NVLink data throughput fields (KiB, cumulative), summed over active links."""
        tx = getattr(self._nvml, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", None)
        rx = getattr(self._nvml, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", None)
        fn = self._fn("nvmlDeviceGetFieldValues")
        links = sorted(link for link, r in g.nvlinks.items() if r.active)
        if tx is None or rx is None or fn is None or not links:
            return None  # an older pynvml, or no NVLink: the series is left out
        ids = [(field, link) for link in links for field in (tx, rx)]
        values = self._get(g, "nvmlDeviceGetFieldValues[nvlink_throughput]", fn, h, ids)
        answered = [v for v in values or [] if getattr(v, "nvmlReturn", 0) == 0]
        if not answered:
            return None
        return sum(
            int(getattr(v.value, _VALUE_MEMBER.get(int(getattr(v, "valueType", 3)), "ullVal")))
            for v in answered
        )

    def _read_nvlinks(self, g: GpuReading, h: Any, key: str) -> None:
        state_fn, err_fn = (
            self._fn("nvmlDeviceGetNvLinkState"),
            self._fn("nvmlDeviceGetNvLinkErrorCounter"),
        )
        if state_fn is None:
            return
        missing = self._no_links.setdefault(key, set())
        for link in range(int(self._const("NVML_NVLINK_MAX_LINKS", FALLBACK_MAX_LINKS))):
            if link in missing:
                continue
            try:
                active = self._call("nvmlDeviceGetNvLinkState", state_fn, h, link)
            except (Hung, _GpuLost):
                raise
            except Exception as e:
                code = self._code(e)
                if code == ERROR_GPU_IS_LOST:
                    raise _GpuLost from None
                if code in (ERROR_NOT_SUPPORTED, ERROR_INVALID_ARGUMENT):
                    missing.add(link)  # no such link on this GPU: not asked again
                else:
                    g.errors[f"nvmlDeviceGetNvLinkState[{link}]"] = _text(e)
                continue
            reading = NvLinkReading(active=bool(active))
            if reading.active and err_fn is not None:
                for name, counter in NVLINK_COUNTERS.items():
                    v = self._get(
                        g, f"nvmlDeviceGetNvLinkErrorCounter[{link}]", err_fn, h, link, counter
                    )
                    if v is not None:
                        reading.errors[name] = int(v)
            g.nvlinks[link] = reading

    def _recovery_action(self, g: GpuReading, h: Any) -> int | None:
        field = getattr(self._nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        fn = self._fn("nvmlDeviceGetFieldValues")
        if field is None or fn is None:
            return None  # pynvml older than 12.575: no recovery-action field
        values = self._get(g, "nvmlDeviceGetFieldValues", fn, h, [field])
        if not values:
            return None
        v = values[0]
        if getattr(v, "nvmlReturn", 0) != 0:
            return None
        member = _VALUE_MEMBER.get(int(getattr(v, "valueType", 1)), "uiVal")
        return int(getattr(v.value, member))

    def _fabric(self, g: GpuReading, h: Any) -> FabricReading | None:
        n = self._nvml
        attempts: list[tuple[str, str]] = [
            ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfo_v3_t"),
            ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfo_v2_t"),
            ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"),
        ]
        for fn_name, struct_name in attempts:
            fn, struct = self._fn(fn_name), getattr(n, struct_name, None)
            if fn is None or struct is None:
                continue
            info = struct()
            try:
                self._call(fn_name, fn, h, _byref(info))
            except (Hung, _GpuLost):
                raise
            except Exception as e:
                code = self._code(e)
                if code == ERROR_GPU_IS_LOST:
                    raise _GpuLost from None
                if code in (
                    ERROR_NOT_SUPPORTED, ERROR_FUNCTION_NOT_FOUND, ERROR_INVALID_ARGUMENT,
                    ERROR_ARGUMENT_VERSION_MISMATCH,
                ):  # fmt: skip
                    continue  # an older driver or struct version: try the next one
                g.errors[fn_name] = _text(e)
                return None
            summary = getattr(info, "healthSummary", None)
            return FabricReading(
                state=int(info.state), status=int(info.status),
                health_summary=int(summary) if summary is not None else None,
            )  # fmt: skip
        return None

    # --- events ------------------------------------------------------------------------

    def _start_events(self) -> None:
        n = self._nvml
        create, register = self._fn("nvmlEventSetCreate"), self._fn("nvmlDeviceRegisterEvents")
        wait = self._fn("nvmlEventSetWait_v2") or self._fn("nvmlEventSetWait")
        if create is None or register is None or wait is None:
            log.warning("this pynvml has no event API: Xids are not watched")
            return
        try:
            self._event_set = self._call("nvmlEventSetCreate", create)
            count = int(self._call("nvmlDeviceGetCount", n.nvmlDeviceGetCount))
        except Exception as e:
            log.warning("cannot watch NVML events: %s", e)
            return
        wanted = int(getattr(n, "nvmlEventTypeXidCriticalError", EVENT_XID)) | int(
            getattr(n, "nvmlEventTypeGpuRecoveryAction", 0)
        )
        for i in range(count):
            try:
                h = self._call("nvmlDeviceGetHandleByIndex", n.nvmlDeviceGetHandleByIndex, i)
                uuid = _text(self._call("nvmlDeviceGetUUID", n.nvmlDeviceGetUUID, h))
                self._handle_index[_handle_key(h)] = (i, uuid)
                supported_fn = self._fn("nvmlDeviceGetSupportedEventTypes")
                mask = wanted
                if supported_fn is not None:
                    mask &= int(self._call("nvmlDeviceGetSupportedEventTypes", supported_fn, h))
                if mask:
                    self._call("nvmlDeviceRegisterEvents", register, h, mask, self._event_set)
            except Exception as e:
                log.warning("GPU %d: cannot register for events: %s", i, e)
        self._heartbeat = time.monotonic()
        self._thread = threading.Thread(
            target=self._wait_loop, args=(wait,), name="nvml-events", daemon=True
        )
        self._thread.start()

    def _wait_loop(self, wait: Callable[[Any, int], Any]) -> None:
        while not self._stop.is_set():
            try:
                data = wait(self._event_set, self._wait_ms)
            except Exception as e:
                self._heartbeat = time.monotonic()
                code = self._code(e)
                if code == ERROR_TIMEOUT:
                    continue
                if code == ERROR_GPU_IS_LOST:
                    self._push(GpuEvent(kind="gpu_lost", at=self._now()))
                else:
                    log.warning("nvmlEventSetWait_v2: %s", e)
                self._stop.wait(1.0)  # an error that repeats at once must not spin
                continue
            self._heartbeat = time.monotonic()
            self._on_event(data)

    def _on_event(self, data: Any) -> None:
        gpu, uuid = self._handle_index.get(_handle_key(data.device), (None, ""))
        etype, code = int(data.eventType), int(data.eventData)
        if etype & int(getattr(self._nvml, "nvmlEventTypeXidCriticalError", EVENT_XID)):
            self._push(GpuEvent(kind="xid", code=code, gpu=gpu, uuid=uuid, at=self._now()))
        elif etype & EVENT_RECOVERY_ACTION:
            self._push(
                GpuEvent(kind="recovery_action", code=code, gpu=gpu, uuid=uuid, at=self._now())
            )

    def _push(self, event: GpuEvent) -> None:
        with self._lock:
            self._events.append(event)
        wake = self._wake
        if wake is not None:
            try:
                wake()  # queued first: the check it causes finds the event
            except Exception:
                log.exception("the agent's wake-up failed; the event waits for the next check")

    # --- plumbing ----------------------------------------------------------------------

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self._clock(), UTC)

    def _call(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        return self._watchdog.call(name, fn, *args)

    def _get(self, g: GpuReading, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """One per-GPU call: None when unsupported; GPU lost and hangs abort the GPU's read."""
        try:
            return self._call(name, fn, *args)
        except Hung:
            raise
        except Exception as e:
            code = self._code(e)
            if code == ERROR_GPU_IS_LOST:
                raise _GpuLost from None
            if code == ERROR_RESET_REQUIRED:
                g.reset_required = True
            if code not in (ERROR_NOT_SUPPORTED, ERROR_FUNCTION_NOT_FOUND):
                g.errors[name] = _text(e) or type(e).__name__
            return None

    def _opt(self, g: GpuReading, name: str, *args: Any, alt: str | None = None) -> Any:
        """`_get` of the function `name` (or `alt`); None when this pynvml has neither."""
        fn = self._fn(name) or (self._fn(alt) if alt else None)
        return None if fn is None else self._get(g, name, fn, *args)

    def _fn(self, name: str) -> Callable[..., Any] | None:
        fn = getattr(self._nvml, name, None)
        return fn if callable(fn) else None

    def _const(self, name: str, default: int) -> int:
        return int(getattr(self._nvml, name, default))

    def _code(self, e: BaseException) -> int | None:
        return getattr(e, "value", None) if self._is_nvml_error(e) else None

    def _is_nvml_error(self, e: BaseException) -> bool:
        err = getattr(self._nvml, "NVMLError", None)
        return isinstance(err, type) and isinstance(e, err)


def _handle_key(h: Any) -> Any:
    try:
        return ctypes.cast(h, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return h


def _byref(obj: Any) -> Any:
    try:
        return ctypes.byref(obj)
    except TypeError:
        return obj  # a test double's plain object
