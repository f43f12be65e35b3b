"""The node agent's classification, against the fake backend and a fake sysfs tree:

- every fault kind `inject` can produce is read back as exactly that fault, firing, with
  per-subject evidence, and resolves once the node is healthy again (events: after the
  latch);
- GPU details: ignored Xids, recovery-action and GPU-lost events, the fabric grace period,
  NVLinks expected by setting, thermal by temperature, row-remap RMA threshold;
- InfiniBand from sysfs: a healthy tree, port DOWN / not LinkUp, rate below expected,
  link_downed and symbol_error increases, an HCA vanishing (learned or configured),
  ignore patterns, no InfiniBand at all;
- every kind the agent emits is a valid fault kind, and the policy's kinds are in the
  shipped policy.
"""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from autoclusters.clients.agent import fake_backend
from autoclusters.clients.agent.agent import Agent
from autoclusters.clients.agent.classify import EXTRA_KINDS, POLICY_KINDS
from autoclusters.clients.agent.fake_backend import FakeBackend, FakeInfiniband, healthy_node
from autoclusters.clients.agent.infiniband import SysfsInfiniband
from autoclusters.clients.agent.readings import FabricReading, GpuEvent
from autoclusters.clients.agent.settings import AgentSettings
from autoclusters.core.faults import FAULT_PATTERN
from autoclusters.core.node_report import NodeReport, ReportState
from autoclusters.core.policy import default_policy
from tests.fakes.systems import ReportSink

NODE = "gpu-01"
T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s

    @property
    def dt(self) -> datetime:
        return datetime.fromtimestamp(self.t, UTC)


class Rig:
    def __init__(
        self, tmp: Path, *, sysfs: Path | None = None, gpu: bool = True, **overrides: Any
    ) -> None:
        self.clock = Clock()
        self.sink = ReportSink()
        self.file = tmp / f"{NODE}.json"
        if not self.file.exists():
            fake_backend.write_node(self.file, healthy_node(gpus=4, nvlinks=4, hcas=2))
        self.backend = FakeBackend(self.file)
        self.backend.open()
        base: dict[str, Any] = {
            "hold_checks": 1, "clear_checks": 1, "hold_checks_by_fault": {}, "link_hold_s": 0,
        }  # fmt: skip
        self.settings = AgentSettings(**(base | overrides))
        self.agent = Agent(
            node=NODE,
            settings=self.settings,
            backend=self.backend if gpu else None,
            infiniband=SysfsInfiniband(sysfs) if sysfs else FakeInfiniband(self.file),
            sink=self.sink,
            clock=self.clock,
        )

    def check(self, advance: float = 10) -> list[NodeReport]:
        self.clock.advance(advance)
        return self.agent.check().reports

    def inject(self, fault: str, **kw: Any) -> None:
        fake_backend.inject(self.file, fault=fault, now=self.clock.dt, **kw)

    def change(self, fn: Any) -> None:
        fake_backend.update_node(self.file, fn)


def faults(reports: list[NodeReport], state: ReportState = ReportState.FIRING) -> set[str]:
    return {r.fault for r in reports if r.state is state}


CONDITIONS = [f for f in fake_backend.injectable() if f != "XID_<n>"]


@pytest.mark.parametrize("fault", CONDITIONS)
def test_each_injected_condition_fires_as_itself_and_resolves(tmp_path: Path, fault: str) -> None:
    rig = Rig(tmp_path)
    assert rig.check() == []  # the baseline: GPU count, adapters, links, counters
    rig.inject(fault, gpu=1)
    fired = rig.check()
    assert [(r.fault, r.state) for r in fired] == [(fault, ReportState.FIRING)]
    r = fired[0]
    assert r.node == NODE and r.sequence == 0 and r.message
    assert r.evidence["backend"] == "fake" and r.evidence["subjects"]
    assert rig.check() == []  # still holding: not re-reported
    fake_backend.reset(rig.file)
    resolved = rig.check()
    assert [(x.fault, x.state) for x in resolved] == [(fault, ReportState.RESOLVED)]
    assert resolved[0].episode_id == r.episode_id and resolved[0].report_id != r.report_id


def test_gpu_evidence_names_the_device_and_its_counters(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.check()
    rig.inject("ECC_DBE", gpu=2)
    rig.inject("ECC_DBE", gpu=2)
    (r,) = rig.check()
    assert r.evidence["subjects"] == [
        {
            "gpu": 2,
            "uuid": "GPU-fake-0002",
            "pci_bus_id": "00000000:38:00.0",
            "ecc_uncorrected_volatile": 2,
        }
    ]
    assert r.message == "GPU 2 (GPU-fake-0002): 2 uncorrected volatile ECC errors"


@pytest.mark.parametrize("xid", [79, 48, 13, 154])
def test_an_xid_event_fires_at_once_and_resolves_after_the_latch(tmp_path: Path, xid: int) -> None:
    rig = Rig(tmp_path, hold_checks=5, clear_checks=2, event_latch_s=60)
    rig.check()
    rig.inject(f"XID_{xid}", gpu=3)
    (r,) = rig.check()
    assert (r.fault, r.state) == (f"XID_{xid}", ReportState.FIRING)
    assert r.evidence["subjects"][0] | {"at": None} == {
        "gpu": 3, "uuid": "GPU-fake-0003", "at": None, "xid": xid,
    }  # fmt: skip
    assert rig.check(advance=30) == []
    assert rig.check(advance=31) == []  # the latch is over: one clean check of two
    assert faults(rig.check(), ReportState.RESOLVED) == {f"XID_{xid}"}


def test_ignored_xids_are_never_reported(tmp_path: Path) -> None:
    rig = Rig(tmp_path, ignored_xids=[43])
    rig.inject("XID_43")
    assert rig.check() == []
    rig.inject("XID_45")
    assert faults(rig.check()) == {"XID_45"}


def test_recovery_action_and_gpu_lost_events(tmp_path: Path) -> None:
    rig = Rig(tmp_path, hold_checks=5)

    def events(node: fake_backend.FakeNode) -> None:
        node.last_seq += 2
        node.events += [
            GpuEvent(kind="recovery_action", code=4, gpu=1, at=rig.clock.dt, seq=node.last_seq - 1),
            GpuEvent(kind="gpu_lost", at=rig.clock.dt, seq=node.last_seq),
        ]

    rig.change(events)
    got = {r.fault: r for r in rig.check()}
    assert set(got) == {"GPU_RECOVERY_ACTION", "GPU_FELL_OFF_BUS"}
    assert got["GPU_RECOVERY_ACTION"].evidence["subjects"][0]["action"] == "DRAIN_AND_RESET"


def test_gpu_count_uses_the_setting_over_what_it_has_seen(tmp_path: Path) -> None:
    rig = Rig(tmp_path, expected_gpus=8)
    (r,) = rig.check()
    assert r.fault == "GPU_COUNT_LOW"
    assert r.evidence["subjects"] == [{"device_count": 4, "expected": 8}]


def test_fabric_not_started_waits_for_the_grace_period(tmp_path: Path) -> None:
    rig = Rig(tmp_path, fabric_grace_s=120)

    def not_started(node: fake_backend.FakeNode) -> None:
        node.gpus.gpus[0].fabric = FabricReading(state=1)

    rig.change(not_started)
    assert rig.check() == []
    assert rig.check(advance=100) == []
    (r,) = rig.check(advance=30)
    assert r.fault == "FABRIC_NOT_READY"
    assert r.evidence["subjects"][0]["fabric_state"] == "NOT_STARTED"


def test_fabric_not_supported_is_fine(tmp_path: Path) -> None:
    rig = Rig(tmp_path, fabric_grace_s=0)

    def no_switch(node: fake_backend.FakeNode) -> None:
        for g in node.gpus.gpus:
            g.fabric = FabricReading(state=0)

    rig.change(no_switch)
    assert rig.check() == []


def test_expected_nvlinks_catch_a_link_never_seen_up(tmp_path: Path) -> None:
    def link_3_down(node: fake_backend.FakeNode) -> None:
        node.gpus.gpus[0].nvlinks[3].active = False

    rig = Rig(tmp_path)
    rig.change(link_3_down)
    assert rig.check() == []  # never seen active, nothing expected: an unused link
    rig2 = Rig(tmp_path, expected_nvlinks=4)
    (r,) = rig2.check()
    assert r.fault == "NVLINK_DOWN" and r.evidence["subjects"][0]["links_down"] == [3]


def test_thermal_by_temperature_near_slowdown(tmp_path: Path) -> None:
    rig = Rig(tmp_path, thermal_margin_c=5)

    def hot(node: fake_backend.FakeNode) -> None:
        node.gpus.gpus[0].temperature_c = 82  # slowdown at 87

    rig.change(hot)
    (r,) = rig.check()
    assert r.fault == "THERMAL" and r.evidence["subjects"][0]["temperature_c"] == 82


def test_uncorrectable_rows_past_the_rma_threshold_are_a_failure(tmp_path: Path) -> None:
    rig = Rig(tmp_path)

    def rows(node: fake_backend.FakeNode) -> None:
        rr = node.gpus.gpus[0].remapped_rows
        assert rr is not None
        rr.uncorrectable = 512

    rig.change(rows)
    assert faults(rig.check()) == {"ROW_REMAP_FAILURE"}


# --- InfiniBand from a sysfs tree -------------------------------------------------------


def port(
    root: Path,
    hca: str,
    n: int = 1,
    *,
    state: str = "4: ACTIVE",
    phys: str = "5: LinkUp",
    rate: str = "400 Gb/sec (4X NDR)",
    **counters: int,
) -> None:
    d = root / "class" / "infiniband" / hca / "ports" / str(n)
    (d / "counters").mkdir(parents=True, exist_ok=True)
    (d / "state").write_text(state + "\n")
    (d / "phys_state").write_text(phys + "\n")
    (d / "rate").write_text(rate + "\n")
    (d / "link_layer").write_text("InfiniBand\n")
    base = {"link_downed": 0, "symbol_error": 0, "link_error_recovery": 0, "port_rcv_errors": 0}
    for name, value in (base | counters).items():
        (d / "counters" / name).write_text(f"{value}\n")


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    for i in range(4):
        port(root, f"mlx5_{i}")
    return root


def ib_rig(tmp_path: Path, sysfs: Path, **overrides: Any) -> Rig:
    return Rig(tmp_path, sysfs=sysfs, gpu=False, **overrides)


def test_sysfs_tree_is_read_as_it_is(sysfs: Path) -> None:
    port(sysfs, "mlx5_0", 2, state="1: DOWN", phys="2: Polling", symbol_error=7)
    ib = SysfsInfiniband(sysfs).read()
    assert ib is not None and ib.hcas == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    p = next(p for p in ib.ports if (p.hca, p.port) == ("mlx5_0", 2))
    assert (p.state, p.phys_state, p.rate, p.link_layer) == (
        "1: DOWN", "2: Polling", "400 Gb/sec (4X NDR)", "InfiniBand",
    )  # fmt: skip
    assert p.counters["symbol_error"] == 7


def test_healthy_sysfs_and_no_infiniband_report_nothing(tmp_path: Path, sysfs: Path) -> None:
    assert ib_rig(tmp_path, sysfs).check() == []
    assert ib_rig(tmp_path, tmp_path / "empty").check() == []
    assert SysfsInfiniband(tmp_path / "empty").read() is None


@pytest.mark.parametrize(
    ("state", "phys"),
    [("1: DOWN", "3: Disabled"), ("2: INIT", "5: LinkUp"), ("4: ACTIVE", "2: Polling")],
)
def test_port_not_active_or_not_linkup_is_link_down(
    tmp_path: Path, sysfs: Path, state: str, phys: str
) -> None:
    rig = ib_rig(tmp_path, sysfs)
    rig.check()
    port(sysfs, "mlx5_2", state=state, phys=phys)
    (r,) = rig.check()
    assert r.fault == "IB_LINK_DOWN"
    assert r.evidence["subjects"] == [
        {"hca": "mlx5_2", "port": 1, "state": state, "phys_state": phys}
    ]


def test_rate_below_expected_is_degraded(tmp_path: Path, sysfs: Path) -> None:
    port(sysfs, "mlx5_1", rate="200 Gb/sec (4X HDR)")
    assert ib_rig(tmp_path, sysfs).check() == []  # no expected rate: not checked
    (r,) = ib_rig(tmp_path, sysfs, expected_ib_rate_gbps=400).check()
    assert r.fault == "IB_LINK_DEGRADED" and "below 400" in r.message


def test_link_downed_increase_is_degraded_for_the_window(tmp_path: Path, sysfs: Path) -> None:
    port(sysfs, "mlx5_0", link_downed=5)  # from before the agent: a baseline, no fault
    rig = ib_rig(tmp_path, sysfs, ib_event_window_s=300)
    assert rig.check() == []
    port(sysfs, "mlx5_0", link_downed=6)
    (r,) = rig.check()
    assert r.fault == "IB_LINK_DEGRADED" and "link_downed +1" in r.message
    assert r.evidence["subjects"][0]["counter_increase"]["link_downed"] == 1
    assert rig.check(advance=200) == []
    assert faults(rig.check(advance=200), ReportState.RESOLVED) == {"IB_LINK_DEGRADED"}


def test_symbol_errors_over_an_hour_and_in_a_burst(tmp_path: Path, sysfs: Path) -> None:
    rig = ib_rig(tmp_path, sysfs)
    rig.check()
    for n in (60, 120):  # 120 within the hour: the limit, not above it
        port(sysfs, "mlx5_3", symbol_error=n)
        assert rig.check(advance=600) == []
    port(sysfs, "mlx5_3", symbol_error=121)
    (r,) = rig.check(advance=600)
    assert "symbol_error +121 in the last hour" in r.message
    port(sysfs, "mlx5_1", symbol_error=500)
    got = rig.check(advance=10)  # 50/s on mlx5_1: a burst
    assert got == [] and "mlx5_1" in str(rig.agent.debouncer.firing["IB_LINK_DEGRADED"].evidence)


def test_a_vanished_hca_fell_off_the_bus(tmp_path: Path, sysfs: Path) -> None:
    rig = ib_rig(tmp_path, sysfs)
    rig.check()
    shutil.rmtree(sysfs / "class" / "infiniband" / "mlx5_1")
    (r,) = rig.check()
    assert r.fault == "HCA_FELL_OFF_BUS" and r.evidence["subjects"][0]["hca"] == "mlx5_1"


def test_expected_hcas_setting_catches_one_missing_from_the_start(
    tmp_path: Path, sysfs: Path
) -> None:
    rig = ib_rig(tmp_path, sysfs, expected_hcas=[f"mlx5_{i}" for i in range(5)])
    (r,) = rig.check()
    assert r.fault == "HCA_FELL_OFF_BUS" and r.message.startswith("mlx5_4")


def test_ignored_ports_and_hcas_are_not_checked(tmp_path: Path, sysfs: Path) -> None:
    port(sysfs, "mlx5_0", 2, state="1: DOWN", phys="3: Disabled")
    rig = ib_rig(tmp_path, sysfs, ib_ignore=["mlx5_0/2"])
    assert rig.check() == []


# --- the vocabulary ---------------------------------------------------------------------


def test_every_kind_the_agent_emits_is_a_fault_kind() -> None:
    for kind in (*POLICY_KINDS, *EXTRA_KINDS, "XID_79"):
        assert FAULT_PATTERN.match(kind), kind
    assert set(CONDITIONS) == set(POLICY_KINDS) | set(EXTRA_KINDS)


def test_the_policy_knows_every_policy_kind() -> None:
    policy = default_policy()
    assert not [k for k in POLICY_KINDS if k not in policy.faults]
