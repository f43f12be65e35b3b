"""The agent's /metrics, parsed as Prometheus parses it (prometheus_client.parser):

- the fake backend: every dcgm-exporter series for every GPU with dcgm-exporter's labels,
  node-exporter's InfiniBand series per port; plausible values that move between scrapes
  and counters that only grow;
- injected faults show: Xid 79 in DCGM_FI_DEV_XID_ERRORS (err_code) and in the windowed
  count, ECC and row-remap counters, NVLink errors, an InfiniBand port down, a lost GPU;
- the NVML backend (a stand-in pynvml): the new readings, an unsupported call left out;
- every DCGM_/node_infiniband_ series the shipped alert rules name is exported;
- the HTTP endpoint served by the agent's loop on a free loopback port.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from autoclusters.clients.agent import fake_backend
from autoclusters.clients.agent.agent import Agent
from autoclusters.clients.agent.dcgm_series import FIELDS, LABELS
from autoclusters.clients.agent.fake_backend import FakeBackend, FakeInfiniband
from autoclusters.clients.agent.metrics import AgentMetrics
from autoclusters.clients.agent.nvml_backend import NvmlBackend
from autoclusters.clients.agent.settings import AgentSettings
from autoclusters.integrations.metrics_http import MetricsServer, OpenMetricsRefused
from tests.agent.test_agent_nvml import FakeNvml, Handle, NVMLError, eventually
from tests.fakes.systems import ReportSink

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_760_000_000.0
NODE = "gpu-07"
GPU_SERIES = {name for name, *_ in FIELDS} | {"DCGM_FI_DEV_XID_ERRORS"}
IB_GAUGES = {
    "node_infiniband_state_id",
    "node_infiniband_physical_state_id",
    "node_infiniband_rate_bytes_per_second",
}
IB_COUNTERS = {
    "node_infiniband_link_downed_total",
    "node_infiniband_symbol_error_total",
    "node_infiniband_link_error_recovery_total",
    "node_infiniband_port_errors_received_total",
    "node_infiniband_port_data_transmitted_bytes_total",
    "node_infiniband_port_data_received_bytes_total",
    "node_infiniband_port_packets_transmitted_total",
    "node_infiniband_port_packets_received_total",
}


def scrape(text: str) -> dict[str, list[Sample]]:
    """Samples by series name, as Prometheus would store them."""
    out: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append(s)
    return out


def one(page: dict[str, list[Sample]], name: str, **labels: str) -> Sample:
    got = [s for s in page.get(name, []) if labels.items() <= s.labels.items()]
    assert len(got) == 1, f"{name}{labels}: {got}"
    return got[0]


class Rig:
    """An agent over a fake node file, with a clock the test moves."""

    def __init__(self, tmp_path: Path) -> None:
        self.t = T0
        self.path = tmp_path / f"{NODE}.json"
        clock: Callable[[], float] = lambda: self.t  # noqa: E731
        self.backend = FakeBackend(self.path, clock=clock)
        self.backend.open()
        self.metrics = AgentMetrics(NODE, xid_window_s=300)
        settings = AgentSettings(hold_checks=1, clear_checks=1, hold_checks_by_fault={})
        self.agent = Agent(
            node=NODE, settings=settings, backend=self.backend,
            infiniband=FakeInfiniband(self.path, clock=clock), sink=ReportSink(),
            clock=clock, metrics=self.metrics,
        )  # fmt: skip

    def check(self, after_s: float = 0) -> dict[str, list[Sample]]:
        self.t += after_s
        self.agent.check()
        return scrape(self.metrics.text())

    def inject(self, fault: str, **kw: Any) -> None:
        fake_backend.inject(self.path, fault=fault, now=datetime.fromtimestamp(self.t, UTC), **kw)


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path)


def test_every_series_and_label_for_the_fake_node(rig: Rig) -> None:
    page = rig.check()
    for name in GPU_SERIES:
        samples = page.get(name, [])
        assert sorted(s.labels["gpu"] for s in samples) == [str(i) for i in range(8)], name
        for s in samples:
            assert set(LABELS) <= s.labels.keys(), (name, s.labels)
            i = int(s.labels["gpu"])
            assert s.labels["UUID"] == f"GPU-fake-{i:04d}" and s.labels["device"] == f"nvidia{i}"
            assert s.labels["Hostname"] == NODE and s.labels["modelName"] == "NVIDIA H200"
            assert s.labels["pci_bus_id"].startswith("00000000:")
    assert {s.labels["err_code"] for s in page["DCGM_FI_DEV_XID_ERRORS"]} == {"0"}
    assert "DCGM_EXP_XID_ERRORS_COUNT" not in page  # no Xid in the window yet
    for name in IB_GAUGES | IB_COUNTERS:
        ports = sorted((s.labels["device"], s.labels["port"]) for s in page.get(name, []))
        assert ports == [(f"mlx5_{n}", "1") for n in range(8)], name
    for s in page["DCGM_FI_DEV_GPU_UTIL"]:
        assert 0 <= s.value <= 100
    for s in page["DCGM_FI_DEV_GPU_TEMP"]:
        assert 40 <= s.value < 82  # below the agent's own thermal warning
    for s in page["DCGM_FI_DEV_POWER_USAGE"]:
        assert 90 <= s.value <= 700
    used, free = page["DCGM_FI_DEV_FB_USED"], page["DCGM_FI_DEV_FB_FREE"]
    assert {u.value + f.value for u, f in zip(used, free, strict=True)} == {143_771}
    assert one(page, "node_infiniband_state_id", device="mlx5_0").value == 4
    assert one(page, "node_infiniband_physical_state_id", device="mlx5_0").value == 5
    assert one(page, "node_infiniband_rate_bytes_per_second", device="mlx5_0").value == 5e10
    assert rig.agent.check().reports == []  # the live values raise no fault


def test_values_move_between_scrapes_and_counters_grow(rig: Rig) -> None:
    first = rig.check()
    second = rig.check(after_s=37)
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED"):
        assert [s.value for s in first[name]] != [s.value for s in second[name]], name
    for name in (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "node_infiniband_port_data_transmitted_bytes_total",
        "node_infiniband_port_packets_received_total",
    ):  # fmt: skip
        for a, b in zip(first[name], second[name], strict=True):
            assert b.value > a.value, name
    # The energy counter's rate is the power: 37 s at 90..700 W.
    a, b = (
        first["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][0],
        second["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][0],
    )
    assert 37 * 90_000 <= b.value - a.value <= 37 * 700_000
    # Deterministic: the same instant gives the same page.
    rig.t -= 37
    assert rig.check() == first


def test_an_injected_xid_79_shows_with_err_code_and_in_the_window(rig: Rig) -> None:
    rig.check()
    rig.inject("XID_79", gpu=3)
    page = rig.check(after_s=10)
    last = one(page, "DCGM_FI_DEV_XID_ERRORS", gpu="3")
    assert last.value == 79 and last.labels["err_code"] == "79"
    assert one(page, "DCGM_FI_DEV_XID_ERRORS", gpu="2").labels["err_code"] == "0"
    count = one(page, "DCGM_EXP_XID_ERRORS_COUNT", gpu="3", xid="79")
    assert count.value == 1 and count.labels["window_size_in_ms"] == "300000"
    assert count.labels["Hostname"] == NODE
    page = rig.check(after_s=301)  # out of the window; the last Xid stays, as in DCGM
    assert "DCGM_EXP_XID_ERRORS_COUNT" not in page
    assert one(page, "DCGM_FI_DEV_XID_ERRORS", gpu="3").value == 79
    fake_backend.boot(rig.path, healthy=True)  # a reboot clears it
    page = rig.check(after_s=10)
    assert one(page, "DCGM_FI_DEV_XID_ERRORS", gpu="3").labels["err_code"] == "0"


def test_injected_faults_bump_their_counters(rig: Rig) -> None:
    rig.check()
    rig.inject("ECC_DBE", gpu=1)
    rig.inject("ROW_REMAP_FAILURE", gpu=2)
    rig.inject("NVLINK_ERRORS", gpu=4)
    rig.inject("IB_LINK_DOWN", hca="mlx5_2")
    rig.inject("GPU_FELL_OFF_BUS", gpu=5)
    page = rig.check(after_s=10)
    assert one(page, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="1").value == 1
    assert one(page, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="0").value == 0
    assert one(page, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", gpu="2").value == 1
    assert one(page, "DCGM_FI_DEV_ROW_REMAP_FAILURE", gpu="2").value == 1
    assert one(page, "DCGM_FI_DEV_ROW_REMAP_FAILURE", gpu="0").value == 0
    assert one(page, "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", gpu="4").value == 100_000
    assert one(page, "node_infiniband_state_id", device="mlx5_2").value == 1  # DOWN
    assert one(page, "node_infiniband_physical_state_id", device="mlx5_2").value == 3
    assert one(page, "node_infiniband_state_id", device="mlx5_1").value == 4
    # A lost GPU answers nothing: its series go, as under dcgm-exporter (GpuMissing).
    assert "5" not in {s.labels["gpu"] for s in page["DCGM_FI_DEV_GPU_TEMP"]}
    assert len(page["DCGM_FI_DEV_GPU_TEMP"]) == 7


class MetricsNvml(FakeNvml):
    """FakeNvml plus the calls behind dcgm-exporter's default series."""

    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139

    def __init__(self) -> None:
        super().__init__()
        self.power_unsupported = {1}

    def nvmlDeviceGetName(self, h: Handle) -> bytes:
        return b"NVIDIA H200"

    def nvmlDeviceGetUtilizationRates(self, h: Handle) -> Any:
        return SimpleNamespace(gpu=60 + h.index, memory=30)

    def nvmlDeviceGetPowerUsage(self, h: Handle) -> int:
        if h.index in self.power_unsupported:
            raise NVMLError(3)  # NOT_SUPPORTED
        return 312_500  # mW

    def nvmlDeviceGetTotalEnergyConsumption(self, h: Handle) -> int:
        return 9_000_000

    def nvmlDeviceGetMemoryInfo(self, h: Handle) -> Any:
        mib = 1024 * 1024
        return SimpleNamespace(total=143_771 * mib, used=1_000 * mib, free=142_771 * mib)

    def nvmlDeviceGetFieldValues(self, h: Handle, ids: list[Any]) -> list[Any]:
        if ids == [230]:
            return super().nvmlDeviceGetFieldValues(h, ids)
        assert all(field in (138, 139) for field, _link in ids)
        return [
            SimpleNamespace(nvmlReturn=0, valueType=3, value=SimpleNamespace(ullVal=1_000))
            for _ in ids
        ]


def test_nvml_readings_become_series() -> None:
    nvml = MetricsNvml()
    backend = NvmlBackend(nvml=nvml, timeout_s=0.5, event_wait_ms=50)
    backend.open()
    try:
        metrics = AgentMetrics("gpu-09")
        settings = AgentSettings(hold_checks=1, clear_checks=1, hold_checks_by_fault={})
        agent = Agent(
            node="gpu-09", settings=settings, backend=backend, infiniband=None,
            sink=ReportSink(), metrics=metrics,
        )  # fmt: skip
        g = backend.read().gpus[0]
        assert (g.name, g.utilization_gpu, g.power_w, g.energy_mj) == (
            "NVIDIA H200", 60, 312.5, 9_000_000,
        )  # fmt: skip
        assert (g.fb_used_mib, g.fb_free_mib, g.nvlink_bandwidth_kib) == (1_000, 142_771, 4_000)
        nvml.events.put(SimpleNamespace(device=nvml.handles[1], eventType=0x8, eventData=79))
        eventually(lambda: backend._events, "the Xid event")
        agent.check()
        page = scrape(metrics.text())
    finally:
        backend.close()
    labels = one(page, "DCGM_FI_DEV_GPU_UTIL", gpu="1").labels
    assert labels == {
        "gpu": "1", "UUID": "GPU-0001", "pci_bus_id": "00000000:01:00.0", "device": "nvidia1",
        "modelName": "NVIDIA H200", "Hostname": "gpu-09",
    }  # fmt: skip
    assert one(page, "DCGM_FI_DEV_POWER_USAGE", gpu="0").value == 312.5
    assert [s.labels["gpu"] for s in page["DCGM_FI_DEV_POWER_USAGE"]] == ["0"]  # unsupported
    assert backend.read().gpus[1].errors == {}  # NOT_SUPPORTED is not an error
    assert one(page, "DCGM_FI_DEV_FB_USED", gpu="0").value == 1_000
    assert one(page, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", gpu="0").value == 4_000
    assert one(page, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="0").value == 0
    assert one(page, "DCGM_FI_DEV_XID_ERRORS", gpu="1", err_code="79").value == 79
    # FakeNvml's links report replay/recovery/CRC counters: all four totals are there.
    assert one(page, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", gpu="0").value == 0
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" in page


def test_an_older_pynvml_leaves_the_new_series_out() -> None:
    backend = NvmlBackend(nvml=FakeNvml(), timeout_s=0.5, event_wait_ms=50)
    backend.open()
    try:
        metrics = AgentMetrics("gpu-09")
        metrics.observe(T0, backend.read(), [], None)
        page = scrape(metrics.text())
    finally:
        backend.close()
    assert "DCGM_FI_DEV_GPU_UTIL" not in page and "DCGM_FI_DEV_POWER_USAGE" not in page
    assert len(page["DCGM_FI_DEV_GPU_TEMP"]) == 2  # what it can read is still there
    assert one(page, "DCGM_FI_DEV_GPU_TEMP", gpu="0").labels["modelName"] == ""


def test_every_series_the_alert_rules_name_is_exported(rig: Rig) -> None:
    rig.check()
    rig.inject("XID_79", gpu=0)  # DCGM_EXP_XID_ERRORS_COUNT exists only with an Xid
    page = rig.check(after_s=10)
    rules = yaml.safe_load((ROOT / "deploy/prometheus/gpu-alerts.yml").read_text())
    named: set[str] = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            named |= set(re.findall(r"\b(?:DCGM_|node_infiniband_)\w+", rule["expr"]))
    assert named >= {"DCGM_FI_DEV_ROW_REMAP_FAILURE", "node_infiniband_state_id"}
    assert named - page.keys() == set()
    # The Xid rule selects on the `xid` label.
    assert one(page, "DCGM_EXP_XID_ERRORS_COUNT", xid="79").labels["gpu"] == "0"


def _agent(tmp_path: Path, settings: AgentSettings) -> Agent:
    """gpu-01's agent on the fake backend, reporting to a list."""
    path = tmp_path / "n.json"
    backend = FakeBackend(path)
    backend.open()
    return Agent(
        node="gpu-01", settings=settings, backend=backend, infiniband=FakeInfiniband(path),
        sink=ReportSink(),
    )  # fmt: skip


def test_the_agent_loop_serves_metrics_on_loopback(tmp_path: Path) -> None:
    agent = _agent(tmp_path, AgentSettings(metrics_port=0, interval_s=0.05))
    assert agent.metrics is not None  # made from the setting
    stop = threading.Event()
    loop = threading.Thread(target=agent.run, args=(stop,))
    loop.start()
    try:
        server = eventually(lambda: agent.metrics_server, "the metrics server")
        assert server.host == "127.0.0.1" and server.port > 0
        page = eventually(
            lambda: (
                (p := scrape(httpx.get(server.url, timeout=5).text)).get("DCGM_FI_DEV_GPU_TEMP")
                and p
            ),
            "a scrape with GPU series",
        )
        assert one(page, "DCGM_FI_DEV_GPU_TEMP", gpu="0").labels["Hostname"] == "gpu-01"
        assert "node_infiniband_state_id" in page
    finally:
        stop.set()
        loop.join(timeout=10)
    assert agent.metrics_server is None
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url, timeout=2)


def test_serve_refuses_a_taken_port() -> None:
    first = MetricsServer(AgentMetrics("a").registry, "127.0.0.1", 0)
    try:
        with pytest.raises(OSError):
            MetricsServer(AgentMetrics("b").registry, "127.0.0.1", first.port)
    finally:
        first.stop()


def test_an_agent_asked_to_serve_metrics_openly_off_loopback_refuses(tmp_path: Path) -> None:
    settings = AgentSettings(metrics_port=0, metrics_host="0.0.0.0", interval_s=0.05)
    agent = _agent(tmp_path, settings)
    with pytest.raises(OpenMetricsRefused):
        agent.run(threading.Event())
    assert agent.metrics_server is None
