"""The agent's debounce: what turns findings over time into reports.

- a condition fires only after holding for N consecutive checks (per-fault N too);
- up/down/up within the hold never fires; down/up while firing neither resolves nor
  re-fires;
- events and a lost GPU fire on the first check, since the time the backend stamped the
  event; an Xid storm is one report;
- a fault firing is re-reported once per re-report interval, with a new report_id;
- a cleared fault resolves after the clear checks, in the same episode;
- slow flapping is bounded by the flap window;
- across an agent restart (persisted state) nothing is re-reported, and a fault that
  cleared meanwhile resolves.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from autoclusters.clients.agent import fake_backend
from autoclusters.clients.agent.agent import Agent
from autoclusters.clients.agent.classify import Finding
from autoclusters.clients.agent.debounce import Debouncer, Transition
from autoclusters.clients.agent.fake_backend import FakeBackend, FakeInfiniband, healthy_node
from autoclusters.clients.agent.settings import AgentSettings
from autoclusters.core.node_report import NodeReport, ReportState
from tests.fakes.systems import ReportSink

FIRING, RESOLVED = ReportState.FIRING, ReportState.RESOLVED


def debouncer(
    *, hold: int = 3, clear: int = 2, rereport: float = 3600, window: float = 3600, flaps: int = 3
) -> Debouncer:
    return Debouncer(
        hold_for=lambda fault: {"THERMAL": 5}.get(fault, hold),
        clear_checks=clear,
        rereport_s=rereport,
        flap_window_s=window,
        max_flaps=flaps,
    )


def feed(
    d: Debouncer, pattern: str, *, fault: str = "ECC_DBE", t0: float = 0.0, step: float = 10
) -> list[Transition]:
    """One check per character: 'x' the fault holds, '.' it does not."""
    out: list[Transition] = []
    for i, c in enumerate(pattern):
        findings = (
            {fault: Finding(fault, subjects=[{"gpu": 0}], messages=["m"])} if c == "x" else {}
        )
        out += d.update(t0 + i * step, findings)
    return out


def states(ts: list[Transition]) -> list[tuple[str, ReportState]]:
    return [(t.fault, t.state) for t in ts]


def test_a_condition_fires_after_holding_for_n_checks_and_only_once() -> None:
    d = debouncer(hold=3)
    assert feed(d, "xx") == []
    got = feed(d, "x" * 20, t0=20)
    assert states(got) == [("ECC_DBE", FIRING)]
    assert got[0].since == 0.0  # the streak's first check, not the check that fired it


def test_an_event_fires_since_the_backend_stamped_it_not_since_the_check() -> None:
    d = debouncer()
    xid = Finding("XID_79", immediate=True, subjects=[{"gpu": 0}], messages=["m"],
                  started_at=99.6)  # fmt: skip
    (fired,) = d.update(100.0, {"XID_79": xid})
    assert fired.state == FIRING and fired.since == 99.6
    # A stamp later than the check (a clock ahead of the agent's) is not taken.
    late = Finding("XID_48", immediate=True, started_at=130.0)
    (late_fired,) = d.update(120.0, {"XID_79": xid, "XID_48": late})
    assert late_fired.fault == "XID_48" and late_fired.since == 120.0


def test_per_fault_hold() -> None:
    assert feed(debouncer(), "xxxx", fault="THERMAL") == []
    assert states(feed(debouncer(), "xxxxx", fault="THERMAL")) == [("THERMAL", FIRING)]


def test_flapping_within_the_hold_never_fires() -> None:
    assert feed(debouncer(hold=3), "xx.xx.x.xx.xx.xx." * 5) == []


def test_flapping_while_firing_neither_resolves_nor_refires() -> None:
    got = feed(debouncer(hold=2, clear=3), "xx" + "x.x..x.x..x" * 5)
    assert states(got) == [("ECC_DBE", FIRING)]


def test_a_cleared_fault_resolves_after_the_clear_checks() -> None:
    got = feed(debouncer(hold=1, clear=3), "x..")
    assert states(got) == [("ECC_DBE", FIRING)]
    got = feed(debouncer(hold=1, clear=3), "x...")
    assert states(got) == [("ECC_DBE", FIRING), ("ECC_DBE", RESOLVED)]
    assert got[0].since == got[1].since and got[1].sequence == 0


def test_immediate_findings_fire_on_the_first_check() -> None:
    d = debouncer(hold=10)
    got = d.update(
        5.0, {"XID_79": Finding("XID_79", immediate=True, subjects=[{}], messages=["x"])}
    )
    assert states(got) == [("XID_79", FIRING)]


def test_an_immediate_finding_on_a_new_boot_fires_again() -> None:
    d = debouncer(hold=1, clear=3)
    xid = {"XID_79": Finding("XID_79", immediate=True, subjects=[{}], messages=["x"])}
    assert states(d.update(1.0, xid, boot="a")) == [("XID_79", FIRING)]
    assert d.update(2.0, xid, boot="a") == []  # the same boot: still the same fault
    again = d.update(3.0, xid, boot="b")  # rebooted, and an Xid again: a new fault
    assert states(again) == [("XID_79", FIRING)] and again[0].sequence == 1
    assert again[0].since == 3.0
    assert d.update(4.0, xid, boot="b") == []
    # A condition (not immediate) still firing across a boot is not re-reported for it.
    ecc = {"ECC_DBE": Finding("ECC_DBE", subjects=[{"gpu": 0}], messages=["m"])}
    assert states(d.update(5.0, ecc, boot="b")) == [("ECC_DBE", FIRING)]
    assert d.update(6.0, ecc, boot="c") == []


def test_re_report_once_per_interval_with_the_next_sequence() -> None:
    d = debouncer(hold=1, rereport=100)
    got = feed(d, "x" * 25, step=10)  # 240 s of holding
    assert [(t.state, t.sequence) for t in got] == [(FIRING, 0), (FIRING, 1), (FIRING, 2)]
    assert len({t.since for t in got}) == 1


def test_slow_flapping_is_bounded_by_the_flap_window() -> None:
    d = debouncer(hold=2, clear=2, window=3600, flaps=3)
    got = feed(d, "xxx..." * 100, step=10)  # 100 full up/down cycles in 6000 s
    fired = [t for t in got if t.state is FIRING and t.sequence == 0]  # not re-reports
    resolved = [t for t in got if t.state is RESOLVED]
    assert (len(fired), len(resolved)) == (3, 2), states(got)
    # It stays firing until clean for a whole window, then resolves once.
    tail = feed(d, "." * 400, t0=6000 + 10, step=10)
    assert states(tail) == [("ECC_DBE", RESOLVED)]


def _slow(run: str) -> dict[str, Finding]:
    """A job-progress finding, as progress_rules.findings_for makes it."""
    return {"SLOW_NODE": Finding("SLOW_NODE", immediate=True, messages=[run], episodes=[run])}


def test_a_job_progress_fault_of_another_run_fires_again_even_when_damped() -> None:
    """Seen in bench/silent.py: a node slow for three jobs within the hour was damped, and
    the fourth job slow on it (its incidents long closed) opened no incident."""
    d = debouncer(hold=1, clear=2, window=3600, flaps=3)
    t, fired = 0.0, []
    for k in range(3):  # three jobs in turn, each slow for a while, then gone
        for _ in range(3):
            t += 10
            fired += d.update(t, _slow(f"{k}/0/0"))
        for _ in range(3):
            t += 10
            fired += d.update(t, {})
    assert [x.state for x in fired] == [FIRING, RESOLVED] * 3  # never damped
    t += 10
    again = d.update(t, _slow("9/0/0"))
    assert states(again) == [("SLOW_NODE", FIRING)]


def test_a_new_run_while_still_firing_is_a_new_fault_and_the_same_run_is_not() -> None:
    d = debouncer(hold=1, clear=3)
    assert states(d.update(1.0, _slow("5/0/0"))) == [("SLOW_NODE", FIRING)]
    assert d.update(2.0, _slow("5/0/0")) == []  # the same run: the same fault
    requeued = d.update(3.0, _slow("5/1/0"))  # the job's next run, slow here again
    assert states(requeued) == [("SLOW_NODE", FIRING)] and requeued[0].sequence == 1
    assert requeued[0].since == 3.0
    assert d.update(4.0, _slow("5/1/0")) == []


def test_findings_with_no_run_keep_the_flap_damping() -> None:
    """The damping still holds for hardware findings (no episodes)."""
    d = debouncer(hold=1, clear=1, window=3600, flaps=2)
    got = feed(d, "x.x.x.x.", step=10)
    assert len([x for x in got if x.state is FIRING]) == 2, states(got)


class AgentRig:
    """An agent on the fake backend with a state file, restartable."""

    def __init__(self, tmp: Path, **overrides: object) -> None:
        self.t = 1_800_000_000.0
        self.file = tmp / "node.json"
        self.state = tmp / "spool" / "state.json"
        self.settings = AgentSettings(
            **({"hold_checks": 2, "clear_checks": 2, "event_latch_s": 300} | overrides)  # type: ignore[arg-type]
        )
        if not self.file.exists():
            fake_backend.write_node(self.file, healthy_node(gpus=2, nvlinks=2, hcas=1))
        self.sink = ReportSink()
        self.restart()

    def restart(self) -> None:
        backend = FakeBackend(self.file)
        backend.open()
        self.agent = Agent(
            node="gpu-07", settings=self.settings, backend=backend,
            infiniband=FakeInfiniband(self.file), sink=self.sink, state_file=self.state,
            clock=lambda: self.t,
        )  # fmt: skip

    def check(self, n: int = 1, step: float = 10) -> list[NodeReport]:
        got: list[NodeReport] = []
        for _ in range(n):
            self.t += step
            got += self.agent.check().reports
        return got

    def inject(self, fault: str) -> None:
        fake_backend.inject(self.file, fault=fault, now=datetime.fromtimestamp(self.t, UTC))


def test_an_xid_storm_is_one_report(tmp_path: Path) -> None:
    rig = AgentRig(tmp_path)
    got: list[NodeReport] = []
    for _ in range(50):
        rig.inject("XID_13")
        got += rig.check(step=5)
    assert [(r.fault, r.state) for r in got] == [("XID_13", FIRING)]


def test_a_restarted_agent_does_not_re_report(tmp_path: Path) -> None:
    rig = AgentRig(tmp_path)
    rig.inject("ECC_DBE")
    rig.inject("XID_79")
    first = rig.check(3)
    assert {(r.fault, r.state) for r in first} == {("ECC_DBE", FIRING), ("XID_79", FIRING)}
    rig.restart()
    assert rig.check(3) == []
    assert set(rig.agent.debouncer.firing) == {"ECC_DBE", "XID_79"}


def test_a_fault_that_cleared_while_the_agent_was_down_resolves(tmp_path: Path) -> None:
    rig = AgentRig(tmp_path)
    assert rig.check() == []  # sees every link up
    rig.inject("NVLINK_DOWN")
    (fired,) = rig.check(2)
    fake_backend.reset(rig.file)
    rig.restart()  # the new process remembers the link it saw active, and the firing
    got = rig.check(2)
    assert [(r.fault, r.state) for r in got] == [("NVLINK_DOWN", RESOLVED)]
    assert got[0].episode_id == fired.episode_id


def test_a_lost_gpu_is_reported_at_once(tmp_path: Path) -> None:
    rig = AgentRig(tmp_path, hold_checks=10)
    rig.inject("GPU_FELL_OFF_BUS")
    assert [r.fault for r in rig.check()] == ["GPU_FELL_OFF_BUS"]


def test_report_ids_are_stable_for_the_same_report(tmp_path: Path) -> None:
    since = datetime(2026, 1, 1, tzinfo=UTC)
    kw = {"node": "gpu-01", "fault": "ECC_DBE", "since": since, "observed_at": since}
    a = NodeReport.build(state="firing", **kw)  # type: ignore[arg-type]
    b = NodeReport.build(state="firing", **kw)  # type: ignore[arg-type]
    c = NodeReport.build(state="firing", sequence=1, **kw)  # type: ignore[arg-type]
    d = NodeReport.build(state="resolved", **kw)  # type: ignore[arg-type]
    assert a.report_id == b.report_id
    assert len({a.report_id, c.report_id, d.report_id}) == 3
    assert a.episode_id == c.episode_id == d.episode_id


def test_the_state_file_is_written_only_when_it_changes(tmp_path: Path) -> None:
    rig = AgentRig(tmp_path)
    rig.check()
    written = rig.state.stat()
    rig.check(3)  # healthy, nothing new: the same state, not written again
    again = rig.state.stat()
    assert (again.st_ino, again.st_mtime_ns) == (written.st_ino, written.st_mtime_ns)
    rig.inject("ECC_DBE")
    rig.check()  # the fault's hold starts: the debounce's memory changed
    assert rig.state.stat().st_ino != written.st_ino
    rig.state.unlink()  # gone (a wiped spool): written again though nothing changed
    rig.check()
    assert rig.state.exists()
