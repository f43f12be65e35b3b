"""Event-driven detection: a fatal GPU event is reported when it arrives, not at the next
periodic check. The agent runs its real loop on the fake backend (the sandbox's), with a
60 s interval, so only the backend's wake-up can explain a report within the bound:

- an injected Xid, a lost GPU and a recovery-action event are each sent (through the
  spooling reporter) within EVENT_BOUND_S;
- a condition still needs its `hold_checks` periodic checks: event checks neither fire it
  nor move its streak;
- a burst of Xids is one report, and event checks are `event_check_gap_s` apart;
- the API refusing: the event's report waits in the spool (write-ahead, as ever);
- a new boot id wakes the agent for a full check (a restarted agent's first), which sends
  the snapshot at once;
- stopping the agent while events keep waking it is clean: the loop and the file watcher
  end, nothing is logged as an error.

The NVML backend's wake-up (its event thread) is tested in tests/agent/test_agent_nvml.py.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from autoclusters.clients.agent import fake_backend
from autoclusters.clients.agent.agent import STOP_POLL_S, Agent, CheckResult
from autoclusters.clients.agent.fake_backend import (
    FakeBackend,
    FakeInfiniband,
    FakeNode,
    healthy_node,
)
from autoclusters.clients.agent.readings import GpuEvent
from autoclusters.clients.agent.reporter import Answer, Outcome, Reporter, Spool
from autoclusters.clients.agent.settings import AgentSettings
from autoclusters.core.node_report import HealthSnapshot, NodeReport, ReportState

NODE = "gpu-05"
INTERVAL_S = 60.0  # far beyond every wait below: a report in time came from a wake-up
# Injection to the POST: the watcher's 0.2 s look at the file, one check, one send. It
# takes ~0.1-0.3 s here; the bound leaves room for a loaded 2-core CI machine.
EVENT_BOUND_S = 2.0
WAIT_S = 10.0  # how long a test waits for something the bound says comes much sooner


class Recorder:
    """What the agent does, each under one condition the test waits on: the checks it
    ran, the reports the API was sent, the snapshots."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self.results: list[CheckResult] = []
        self.sent: list[tuple[float, NodeReport]] = []  # (monotonic time, report)
        self.snapshots: list[HealthSnapshot] = []
        self.refuse = False  # the API answering 503

    def checked(self, result: CheckResult) -> None:
        with self._cv:
            self.results.append(result)
            self._cv.notify_all()

    def send(self, report: NodeReport) -> Answer:  # the reporter's Sender
        with self._cv:
            self.sent.append((time.monotonic(), report))
            self._cv.notify_all()
        return Answer(Outcome.RETRY, "HTTP 503") if self.refuse else Answer(Outcome.SENT, "202")

    def send_snapshot(self, snapshot: HealthSnapshot) -> Answer:
        with self._cv:
            self.snapshots.append(snapshot)
            self._cv.notify_all()
        return Answer(Outcome.SENT, "202")

    def wait_for(self, what: str, predicate: Callable[[], Any], timeout_s: float = WAIT_S) -> Any:
        with self._cv:
            got = self._cv.wait_for(predicate, timeout_s)
        if not got:
            raise AssertionError(f"timed out waiting for {what}")
        return got

    def reports(self, fault: str) -> list[NodeReport]:
        with self._cv:
            return [r for _, r in self.sent if r.fault == fault]

    def event_checks(self) -> list[CheckResult]:
        with self._cv:
            return [r for r in self.results if r.event]


class RecordedAgent(Agent):
    """The agent, telling the recorder about each check the loop runs."""

    recorder: Recorder

    def check(self, *, event: bool = False) -> CheckResult:
        result = super().check(event=event)
        self.recorder.checked(result)
        return result


class Rig:
    def __init__(self, tmp: Path, **overrides: Any) -> None:
        self.file = tmp / f"{NODE}.json"
        fake_backend.write_node(self.file, healthy_node(gpus=2, nvlinks=2, hcas=1))
        self.backend = FakeBackend(self.file)
        self.backend.open()
        self.recorder = Recorder()
        self.spool = Spool(tmp / "spool")
        base: dict[str, Any] = {
            "interval_s": INTERVAL_S, "hold_checks": 2, "clear_checks": 2,
            "hold_checks_by_fault": {}, "event_latch_s": 300,
        }  # fmt: skip
        self.settings = AgentSettings(**(base | overrides))
        self.agent = RecordedAgent(
            node=NODE, settings=self.settings, backend=self.backend,
            infiniband=FakeInfiniband(self.file),
            sink=Reporter(spool=self.spool, sender=self.recorder, attempts=1),
            state_file=tmp / "spool" / "state.json", snapshots=self.recorder,
        )  # fmt: skip
        self.agent.recorder = self.recorder

    @contextmanager
    def running(self) -> Iterator[threading.Event]:
        """The agent's loop on its own thread, past its first (periodic) check."""
        stop = threading.Event()
        loop = threading.Thread(target=self.agent.run, args=(stop,), name="agent-loop")
        loop.start()
        try:
            self.recorder.wait_for("the first check", lambda: self.recorder.results)
            yield stop
        finally:
            stop.set()
            self.agent.wake()
            loop.join(timeout=WAIT_S)
            assert not loop.is_alive()
            self.backend.close()

    def inject(self, fault: str) -> None:
        fake_backend.inject(self.file, fault=fault)


def recovery_action_event(path: Path) -> None:
    """The driver asks for a node reboot (NVML's recovery-action event)."""

    def change(node: FakeNode) -> None:
        node.last_seq += 1
        at = datetime.now(UTC)
        node.events.append(
            GpuEvent(kind="recovery_action", code=2, gpu=1, uuid="GPU-fake-0001", at=at,
                     seq=node.last_seq)
        )  # fmt: skip

    fake_backend.update_node(path, change)


FATAL: dict[str, Callable[[Rig], None]] = {
    "XID_79": lambda rig: rig.inject("XID_79"),
    "GPU_FELL_OFF_BUS": lambda rig: rig.inject("GPU_FELL_OFF_BUS"),
    "GPU_RECOVERY_ACTION": lambda rig: recovery_action_event(rig.file),
}


@pytest.mark.parametrize("fault", sorted(FATAL))
def test_a_fatal_event_is_sent_at_once(tmp_path: Path, fault: str) -> None:
    rig = Rig(tmp_path)
    with rig.running():
        injected = time.monotonic()
        FATAL[fault](rig)
        rig.recorder.wait_for(f"{fault} sent", lambda: rig.recorder.reports(fault))
    [(sent_at, report)] = [(t, r) for t, r in rig.recorder.sent if r.fault == fault]
    delay = sent_at - injected
    assert delay < EVENT_BOUND_S, f"{fault} sent {delay:.3f} s after it arrived"
    assert report.state is ReportState.FIRING and report.node == NODE
    [woken] = rig.recorder.event_checks()  # the only check since the first: the event's
    assert [r.fault for r in woken.reports] == [fault] and woken.snapshot is None
    assert rig.spool.pending() == []  # spooled, sent, then taken out of the spool


def test_a_condition_still_needs_its_periodic_checks(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    agent = rig.agent
    agent.check()  # the links are seen up
    rig.inject("ECC_DBE")
    rig.inject("NVLINK_DOWN")
    for _ in range(5):  # event checks, however many, are not periodic ones
        assert agent.check(event=True).reports == []
    rig.inject("XID_79")
    woken = agent.check(event=True)
    assert [r.fault for r in woken.reports] == ["XID_79"]
    assert set(woken.findings) == {"XID_79"} and woken.infiniband is None
    assert set(agent.debouncer.memory.tracks) == {"XID_79"}  # no condition's streak moved
    assert agent.check().reports == []  # periodic: hold 1 of 2
    assert agent.check(event=True).reports == []
    assert {r.fault for r in agent.check().reports} == {"ECC_DBE", "NVLINK_DOWN"}  # 2 of 2


def test_an_event_check_leaves_a_firing_condition_to_the_periodic_checks(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    agent = rig.agent
    rig.inject("ECC_DBE")
    agent.check()
    assert [r.fault for r in agent.check().reports] == ["ECC_DBE"]
    fake_backend.reset(rig.file)  # the condition cleared: only periodic checks resolve it
    for _ in range(3):
        assert agent.check(event=True).reports == []
    assert agent.check().reports == []
    [resolved] = agent.check().reports
    assert (resolved.fault, resolved.state) == ("ECC_DBE", ReportState.RESOLVED)


def test_the_loop_leaves_conditions_to_the_interval(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    with rig.running():
        fake_backend.inject(rig.file, fault="ECC_DBE")
        rig.inject("XID_79")  # wakes the agent, which sees the ECC errors too
        rig.recorder.wait_for("XID_79 sent", lambda: rig.recorder.reports("XID_79"))
    assert rig.recorder.reports("ECC_DBE") == []
    assert "ECC_DBE" not in rig.agent.debouncer.memory.tracks


def test_a_burst_of_xids_is_one_report(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    xids = lambda: len(rig.agent.classifier.memory.events.get("XID_79", []))  # noqa: E731
    with rig.running():
        for _ in range(15):
            rig.inject("XID_79")
        rig.recorder.wait_for("the agent to take all 15 Xids", lambda: xids() == 15)
        rig.inject("XID_13")  # another fault in the same burst: its own report
        rig.recorder.wait_for("XID_13 sent", lambda: rig.recorder.reports("XID_13"))
    assert len(rig.recorder.reports("XID_79")) == 1
    assert len(rig.recorder.reports("XID_13")) == 1
    woken = [r.at for r in rig.recorder.event_checks()]
    gap = rig.settings.event_check_gap_s
    assert woken and all(b - a >= gap - 0.05 for a, b in zip(woken, woken[1:], strict=False))


def test_an_event_report_waits_in_the_spool_while_the_api_refuses(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.recorder.refuse = True
    with rig.running():
        rig.inject("XID_79")
        rig.recorder.wait_for("a try to send XID_79", lambda: rig.recorder.reports("XID_79"))
    [spooled] = rig.spool.pending()
    assert rig.spool.load(spooled).fault == "XID_79"  # the next flush sends it


def test_a_new_boot_wakes_a_full_check_and_its_snapshot(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    with rig.running():
        [first] = rig.recorder.snapshots
        booted = time.monotonic()
        node = fake_backend.boot(rig.file, healthy=True)
        rig.recorder.wait_for(
            "a snapshot of the new boot",
            lambda: any(s.boot_id == node.boot_id for s in rig.recorder.snapshots),
        )
        took = time.monotonic() - booted
    assert took < EVENT_BOUND_S and first.boot_id != node.boot_id
    assert [r.event for r in rig.recorder.results] == [False, False]  # both full checks


def test_an_xid_on_a_new_boot_is_reported_while_the_last_boots_still_fires(
    tmp_path: Path,
) -> None:
    """A repaired machine's next Xid is a new fault: reported at once, not swallowed while
    the previous boot's Xid waits out its clear checks (the bench saw it reach the API only
    through the alert path, 3.7 s late). The same boot's second Xid is still one report
    (tests/agent/test_agent_debounce.py)."""
    rig = Rig(tmp_path)
    with rig.running():
        rig.inject("XID_79")
        rig.recorder.wait_for("the first Xid", lambda: len(rig.recorder.reports("XID_79")) == 1)
        node = fake_backend.boot(rig.file, healthy=True)  # repaired: a new boot, clean
        rig.recorder.wait_for(
            "the new boot's snapshot",
            lambda: any(s.boot_id == node.boot_id for s in rig.recorder.snapshots),
        )
        assert len(rig.recorder.reports("XID_79")) == 1
        injected = time.monotonic()
        rig.inject("XID_79")  # a new fault on the new machine, within the clear checks
        rig.recorder.wait_for(
            "the new boot's Xid", lambda: len(rig.recorder.reports("XID_79")) == 2
        )
    first, again = rig.recorder.reports("XID_79")
    assert again.state is ReportState.FIRING and again.sequence == first.sequence + 1
    [(sent_at, _)] = [(t, r) for t, r in rig.recorder.sent if r is again]
    assert sent_at - injected < EVENT_BOUND_S


def test_stopping_while_events_keep_waking_it_is_clean(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    rig = Rig(tmp_path, event_check_gap_s=0.0)
    storm_over = threading.Event()

    def storm() -> None:
        while not storm_over.is_set():
            rig.inject("XID_13")

    stop = threading.Event()
    loop = threading.Thread(target=rig.agent.run, args=(stop,), name="agent-loop")
    injector = threading.Thread(target=storm, name="xid-storm")
    loop.start()
    injector.start()
    try:
        rig.recorder.wait_for("event checks", lambda: len(rig.recorder.event_checks()) >= 3)
        stopping = time.monotonic()
        stop.set()  # set from another thread, without a wake-up: the loop still ends
        loop.join(timeout=WAIT_S)
        stopped_in = time.monotonic() - stopping
    finally:
        storm_over.set()
        injector.join(timeout=WAIT_S)
        stop.set()
        loop.join(timeout=WAIT_S)
    assert not loop.is_alive() and stopped_in < STOP_POLL_S + EVENT_BOUND_S
    assert "fake-events" not in {t.name for t in threading.enumerate()}  # the watcher too
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert len(rig.recorder.reports("XID_13")) == 1
