"""Readings -> findings: which fault kinds hold on this node now, with their evidence.

A finding is one fault kind (the policy's names, see core/policies/default.yaml)
with the subjects it holds for (a GPU, a link, a port) and what was read for each. Kinds:

- events, reported at once and held for `event_latch_s` after the last one (within one
  boot of the machine: a new boot id forgets them): XID_<n>,
  GPU_RECOVERY_ACTION (the driver's recovery-action event), GPU_FELL_OFF_BUS (GPU lost);
- GPU conditions: GPU_FELL_OFF_BUS (NVML_ERROR_GPU_IS_LOST, at once), GPU_COUNT_LOW,
  ECC_DBE, ROW_REMAP_PENDING, ROW_REMAP_FAILURE, NVLINK_DOWN, GPU_RECOVERY_ACTION,
  FABRIC_NOT_READY, THERMAL (thermal or power-brake slowdown, or near the slowdown
  temperature), and three the default policy does not name yet: GPU_DRIVER_UNRESPONSIVE
  (an NVML call hung), NVLINK_ERRORS and PCIE_ERRORS (error counters rising too fast);
- InfiniBand: IB_LINK_DOWN, IB_LINK_DEGRADED (rate below expected, link_downed increase,
  symbol errors, link retrains), HCA_FELL_OFF_BUS (an expected adapter is gone).

Baselines the agent learns (the most GPUs seen, adapters seen, NVLinks seen active) and
recent events live in `ClassifierMemory`, which the agent persists across restarts.
Counter windows are not persisted: after a restart they start from a new baseline.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field

from autoclusters.clients.agent.counters import Counters
from autoclusters.clients.agent.readings import (
    GpuEvent,
    GpuReading,
    GpuReadings,
    IbPortReading,
    IbReadings,
    rate_gbps,
    state_number,
)
from autoclusters.clients.agent.settings import AgentSettings

POLICY_KINDS = (
    "GPU_FELL_OFF_BUS", "GPU_COUNT_LOW", "ECC_DBE", "ROW_REMAP_PENDING", "ROW_REMAP_FAILURE",
    "NVLINK_DOWN", "GPU_RECOVERY_ACTION", "FABRIC_NOT_READY", "THERMAL", "IB_LINK_DOWN",
    "IB_LINK_DEGRADED", "HCA_FELL_OFF_BUS",
)  # fmt: skip
# Kinds the agent reports that the shipped policy does not list (its default rule applies).
EXTRA_KINDS = ("GPU_DRIVER_UNRESPONSIVE", "NVLINK_ERRORS", "PCIE_ERRORS")

RECOVERY_ACTIONS = {
    0: "NONE", 1: "GPU_RESET", 2: "NODE_REBOOT", 3: "DRAIN_P2P", 4: "DRAIN_AND_RESET",
    5: "RECOVER_IMEX_DOMAIN", 6: "BUS_RESET", 7: "SYSTEM_REBOOT",
}  # fmt: skip
FABRIC_STATES = {0: "NOT_SUPPORTED", 1: "NOT_STARTED", 2: "IN_PROGRESS", 3: "COMPLETED"}
FABRIC_COMPLETED, FABRIC_UNHEALTHY = 3, 2
# nvmlClocksEventReason* bits that mean heat or power trouble (SwPowerCap is normal load).
SLOWDOWN_REASONS = {
    0x8: "HwSlowdown", 0x20: "SwThermalSlowdown", 0x40: "HwThermalSlowdown",
    0x80: "HwPowerBrakeSlowdown",
}  # fmt: skip
REMAP_RMA_ROWS = 512  # uncorrectable remapped rows: NVIDIA's and Azure's RMA threshold
IB_ACTIVE, IB_LINK_UP = 4, 5
SATURATED = (0xFFFF, 0xFFFFFFFF)  # 16-bit and 32-bit IBTA counters stop, not wrap
_MAX_EVENTS = 20  # per fault kind, in memory and evidence


@dataclass
class Finding:
    fault: str
    immediate: bool = False
    subjects: list[dict[str, Any]] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    # What a job-progress finding is about: one entry per job run (job/restart/generation).
    # Another run is another fault, never the old one still firing (debounce.py).
    episodes: list[str] = field(default_factory=list)
    # The earliest event behind it, at the time the backend stamped it (epoch s): when the
    # fault began, before the check that saw it. None: a condition, seen at the check.
    started_at: float | None = None

    @property
    def message(self) -> str:
        shown = "; ".join(self.messages[:3])
        more = len(self.messages) - 3
        return f"{shown} (and {more} more)" if more > 0 else shown

    def evidence(self) -> dict[str, Any]:
        return {"subjects": self.subjects}


class EventMemo(BaseModel):
    at: float
    subject: dict[str, Any]
    message: str


class ClassifierMemory(BaseModel):
    max_gpu_count: int = 0
    hcas_seen: list[str] = Field(default_factory=list)
    nvlinks_seen: dict[str, list[int]] = Field(default_factory=dict)
    events: dict[str, list[EventMemo]] = Field(default_factory=dict)
    fabric_not_ready_since: dict[str, float] = Field(default_factory=dict)
    # The machine's boot id the latched events belong to: a new boot forgets them (the
    # machine was rebooted or replaced; what it still has raises new events).
    boot: str | None = None


class Classifier:
    def __init__(self, settings: AgentSettings, memory: ClassifierMemory | None = None) -> None:
        self.settings = settings
        self.memory = memory or ClassifierMemory()
        self.counters = Counters()
        self._found: dict[str, Finding] = {}

    def on_boot(self, boot: str) -> None:
        """The machine's boot id at this check: the last boot's latched events are over."""
        if self.memory.boot is not None and self.memory.boot != boot:
            self.memory.events.clear()
        self.memory.boot = boot

    def classify(
        self,
        *,
        now: float,
        gpus: GpuReadings | None,
        events: list[GpuEvent],
        ib: IbReadings | None,
        check_ib: bool = True,
    ) -> dict[str, Finding]:
        """Every fault kind that holds now. `gpus` None: no GPU backend on this node."""
        self._found = {}
        self._events(now, events)
        if gpus is not None:
            self._gpus(now, gpus)
        if check_ib:
            self._infiniband(now, ib)
        return self._found

    def classify_events(
        self, *, now: float, gpus: GpuReadings | None, events: list[GpuEvent]
    ) -> dict[str, Finding]:
        """Only what is reported at once: the events (latched, as in `classify`) and a lost
        GPU. For a check the backend's event asked for: counters get no extra sample and the
        learnt baselines do not move, so the periodic checks keep their meaning."""
        self._found = {}
        self._events(now, events)
        if gpus is not None:
            self._lost(gpus)
        return self._found

    def classify_links(self, ib: IbReadings | None) -> dict[str, Finding]:
        """Only the ports' state (IB_LINK_DOWN), for the link watch's check: no counter gets
        a sample and no adapter is learnt, so the periodic checks keep their meaning."""
        self._found = {}
        for port in ib.ports if ib is not None else []:
            if not self._ignored(port.hca, port.port):
                self._link_down(port)
        return self._found

    def _add(
        self,
        fault: str,
        subject: dict[str, Any],
        message: str,
        *,
        now: bool = False,
        at: float | None = None,
    ) -> None:
        f = self._found.setdefault(fault, Finding(fault))
        f.immediate = f.immediate or now
        if at is not None:
            f.started_at = at if f.started_at is None else min(f.started_at, at)
        f.subjects.append(subject)
        f.messages.append(message)

    # --- events --------------------------------------------------------------------------

    def _events(self, now: float, events: list[GpuEvent]) -> None:
        for e in events:
            subject: dict[str, Any] = {"gpu": e.gpu, "uuid": e.uuid, "at": e.at.isoformat()}
            where = f"GPU {e.gpu}" if e.gpu is not None else "a GPU"
            if e.kind == "xid":
                if e.code in self.settings.ignored_xids or not 0 < e.code < 1000:
                    continue
                fault, msg = f"XID_{e.code}", f"{where}: Xid {e.code}"
                subject["xid"] = e.code
            elif e.kind == "recovery_action":
                if e.code == 0:
                    continue
                name = RECOVERY_ACTIONS.get(e.code, str(e.code))
                fault, msg = "GPU_RECOVERY_ACTION", f"{where}: driver asks for {name}"
                subject |= {"recovery_action": e.code, "action": name, "source": "event"}
            else:
                fault, msg = "GPU_FELL_OFF_BUS", "NVML event wait: GPU is lost"
                subject["source"] = "nvmlEventSetWait_v2"
            memos = self.memory.events.setdefault(fault, [])
            memos.append(EventMemo(at=e.at.timestamp(), subject=subject, message=msg))
            del memos[:-_MAX_EVENTS]
        for fault, memos in list(self.memory.events.items()):
            memos[:] = [m for m in memos if now - m.at < self.settings.event_latch_s]
            if not memos:
                del self.memory.events[fault]
            for m in memos:
                self._add(fault, m.subject, m.message, now=True, at=m.at)

    # --- GPUs ----------------------------------------------------------------------------

    def _gpus(self, now: float, r: GpuReadings) -> None:
        s = self.settings
        if r.hung_calls:
            calls = ", ".join(r.hung_calls)
            self._add(
                "GPU_DRIVER_UNRESPONSIVE",
                {"hung_calls": r.hung_calls, "timeout_s": s.nvml_timeout_s},
                f"NVML did not answer within {s.nvml_timeout_s:g} s: {calls}",
            )
        self._lost(r)
        if r.device_count is not None:
            m = self.memory
            m.max_gpu_count = max(m.max_gpu_count, r.device_count)
            expected = s.expected_gpus if s.expected_gpus is not None else m.max_gpu_count
            if r.device_count < expected:
                self._add(
                    "GPU_COUNT_LOW",
                    {"device_count": r.device_count, "expected": expected},
                    f"{r.device_count} of {expected} GPUs visible to NVML",
                )
        for g in r.gpus:
            if not g.lost:
                self._gpu(now, g)

    def _lost(self, r: GpuReadings) -> None:
        """GPU_FELL_OFF_BUS at once: the node's device count, or a GPU, answered GPU_IS_LOST."""
        if r.lost:
            subject = {"source": "nvmlDeviceGetCount"}
            self._add("GPU_FELL_OFF_BUS", subject, "NVML: GPU is lost", now=True)
        for g in r.gpus:
            if g.lost:
                base = {"gpu": g.index, "uuid": g.uuid, "pci_bus_id": g.pci_bus_id}
                who = f"GPU {g.index}" + (f" ({g.uuid})" if g.uuid else "")
                self._add("GPU_FELL_OFF_BUS", base, f"{who}: NVML says the GPU is lost", now=True)

    def _gpu(self, now: float, g: GpuReading) -> None:
        s, key = self.settings, g.uuid or str(g.index)
        base: dict[str, Any] = {"gpu": g.index, "uuid": g.uuid, "pci_bus_id": g.pci_bus_id}
        who = f"GPU {g.index}" + (f" ({g.uuid})" if g.uuid else "")
        if g.reset_required:
            subject = base | {"action": "GPU_RESET", "source": "NVML_ERROR_RESET_REQUIRED"}
            self._add("GPU_RECOVERY_ACTION", subject, f"{who}: NVML says reset required")
        if g.ecc_uncorrected_volatile:
            n = g.ecc_uncorrected_volatile
            subject = base | {"ecc_uncorrected_volatile": n}
            self._add("ECC_DBE", subject, f"{who}: {n} uncorrected volatile ECC errors")
        if (rows := g.remapped_rows) is not None:
            subject = base | rows.model_dump()
            if rows.pending:
                self._add("ROW_REMAP_PENDING", subject, f"{who}: row remap pending (reset)")
            if rows.failure or rows.uncorrectable >= REMAP_RMA_ROWS:
                what = "failure" if rows.failure else f"{rows.uncorrectable} uncorrectable rows"
                self._add("ROW_REMAP_FAILURE", subject, f"{who}: row remap {what}")
        self._nvlinks(now, g, key, base, who)
        if g.recovery_action:
            name = RECOVERY_ACTIONS.get(g.recovery_action, str(g.recovery_action))
            subject = base | {"recovery_action": g.recovery_action, "action": name}
            self._add("GPU_RECOVERY_ACTION", subject, f"{who}: driver asks for {name}")
        self._fabric(now, g, key, base, who)
        reasons = g.clock_event_reasons or 0
        named = [n for bit, n in SLOWDOWN_REASONS.items() if reasons & bit]
        if named:
            subject = base | {"clock_event_reasons": hex(reasons), "reasons": named}
            self._add("THERMAL", subject, f"{who}: clocks slowed by {', '.join(named)}")
        if g.temperature_c is not None and g.slowdown_temp_c:
            if g.temperature_c >= g.slowdown_temp_c - s.thermal_margin_c:
                t, limit = g.temperature_c, g.slowdown_temp_c
                subject = base | {"temperature_c": t, "slowdown_temp_c": limit}
                self._add("THERMAL", subject, f"{who}: {t} C, slowdown at {limit} C")
        if g.pcie_replay_counter is not None:
            w = self.counters.add(
                f"pcie:{key}", now, g.pcie_replay_counter, window_s=s.pcie_window_s
            )
            if w.increase() > s.pcie_replay_per_min * s.pcie_window_s / 60:
                subject = base | {"pcie_replay_increase": w.increase(), "window_s": w.window_s}
                self._add("PCIE_ERRORS", subject, f"{who}: {w.increase()} PCIe replays")

    def _nvlinks(self, now: float, g: GpuReading, key: str, base: dict[str, Any], who: str) -> None:
        s = self.settings
        seen = set(self.memory.nvlinks_seen.get(key, []))
        seen |= {link for link, r in g.nvlinks.items() if r.active}
        if seen:
            self.memory.nvlinks_seen[key] = sorted(seen)
        expected = s.expected_nvlinks or 0
        down = sorted(
            link
            for link, r in g.nvlinks.items()
            if not r.active and (link in seen or link < expected)
        )
        if down:
            subject = base | {"links_down": down, "links_seen_active": sorted(seen)}
            self._add("NVLINK_DOWN", subject, f"{who}: NVLink {down} inactive")
        rising: dict[str, int] = {}
        for link, r in g.nvlinks.items():
            if r.active and r.errors:
                w = self.counters.add(
                    f"nvlink:{key}:{link}", now, sum(r.errors.values()), window_s=s.nvlink_window_s
                )
                if w.increase():
                    rising[str(link)] = w.increase()
        if sum(rising.values()) > s.nvlink_errors_per_min * s.nvlink_window_s / 60:
            subject = base | {"error_increase_by_link": rising, "window_s": s.nvlink_window_s}
            self._add("NVLINK_ERRORS", subject, f"{who}: {sum(rising.values())} NVLink errors")

    def _fabric(self, now: float, g: GpuReading, key: str, base: dict[str, Any], who: str) -> None:
        f, since = g.fabric, self.memory.fabric_not_ready_since
        if f is None or f.state == 0:
            since.pop(key, None)
            return
        subject: dict[str, Any] = base | {
            "fabric_state": FABRIC_STATES.get(f.state, str(f.state)),
            "fabric_status": f.status,
            "health_summary": f.health_summary,
        }
        if f.state == FABRIC_COMPLETED:
            since.pop(key, None)
            if f.status != 0:
                self._add("FABRIC_NOT_READY", subject, f"{who}: fabric status {f.status}")
            elif f.health_summary == FABRIC_UNHEALTHY:
                self._add("FABRIC_NOT_READY", subject, f"{who}: fabric unhealthy")
            return
        started = since.setdefault(key, now)
        if now - started >= self.settings.fabric_grace_s:
            waited = now - started
            subject["not_ready_s"] = round(waited)
            state = subject["fabric_state"]
            self._add("FABRIC_NOT_READY", subject, f"{who}: fabric {state} for {waited:.0f} s")

    # --- InfiniBand ----------------------------------------------------------------------

    def _infiniband(self, now: float, ib: IbReadings | None) -> None:
        s, m = self.settings, self.memory
        present = set(ib.hcas) if ib is not None else set()
        m.hcas_seen = sorted(set(m.hcas_seen) | present)
        expected = s.expected_hcas or m.hcas_seen
        for hca in sorted(set(expected) - present):
            if not self._ignored(hca):
                subject = {"hca": hca, "present": sorted(present)}
                self._add("HCA_FELL_OFF_BUS", subject, f"{hca}: adapter gone from sysfs")
        for port in ib.ports if ib is not None else []:
            if not self._ignored(port.hca, port.port):
                self._port(now, port)

    def _port(self, now: float, p: IbPortReading) -> None:
        s = self.settings
        who = f"{p.hca} port {p.port}"
        base: dict[str, Any] = {"hca": p.hca, "port": p.port}
        windows = {
            "link_downed": s.ib_event_window_s,
            "symbol_error": 3600.0,
            "link_error_recovery": 60.0,
        }
        inc: dict[str, int] = {}
        for name, window in windows.items():
            if name in p.counters:
                w = self.counters.add(
                    f"ib:{p.hca}:{p.port}:{name}", now, p.counters[name], window_s=window
                )
                inc[name] = w.increase()
                if name == "symbol_error" and w.last_rate_per_s() > s.ib_symbol_errors_per_s:
                    inc["symbol_error_burst"] = int(w.last_rate_per_s())
        if self._link_down(p):
            return
        why: list[str] = []
        rate = rate_gbps(p.rate)
        if s.expected_ib_rate_gbps and rate is not None and rate < s.expected_ib_rate_gbps:
            why.append(f"rate {p.rate} below {s.expected_ib_rate_gbps:g} Gb/s")
        if inc.get("link_downed", 0) > 0:
            why.append(f"link_downed +{inc['link_downed']}")
        if inc.get("symbol_error", 0) > s.ib_symbol_errors_per_hour:
            why.append(f"symbol_error +{inc['symbol_error']} in the last hour")
        if "symbol_error_burst" in inc:
            why.append(f"symbol_error {inc['symbol_error_burst']}/s")
        if p.counters.get("symbol_error") in SATURATED:
            why.append("symbol_error counter saturated")
        if inc.get("link_error_recovery", 0) > s.ib_link_error_recovery_per_min:
            why.append(f"link_error_recovery +{inc['link_error_recovery']} in a minute")
        if why:
            subject = base | {"rate": p.rate, "counter_increase": inc, "counters": p.counters}
            self._add("IB_LINK_DEGRADED", subject, f"{who}: {', '.join(why)}")

    def _link_down(self, p: IbPortReading) -> bool:
        """IB_LINK_DOWN when the port is not ACTIVE / LinkUp; whether it is."""
        if state_number(p.state) == IB_ACTIVE and state_number(p.phys_state) == IB_LINK_UP:
            return False
        subject = {"hca": p.hca, "port": p.port, "state": p.state, "phys_state": p.phys_state}
        message = f"{p.hca} port {p.port}: {p.state or '?'} / {p.phys_state or '?'}"
        self._add("IB_LINK_DOWN", subject, message)
        return True

    def _ignored(self, hca: str, port: int | None = None) -> bool:
        names = [hca] if port is None else [hca, f"{hca}/{port}"]
        return any(fnmatch.fnmatch(n, pat) for n in names for pat in self.settings.ib_ignore)
