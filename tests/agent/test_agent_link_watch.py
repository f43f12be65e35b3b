"""The link watch: a port going down is reported within `link_hold_s + link_watch_s`, not
at the periodic checks (clients/agent/link_watch.py, agent.py). The agent runs its real
loop on the fake backend with a 60 s interval, so only the watch can explain a report in
time:

- a port down for longer than the hold fires within hold + watch period, and not before
  the hold;
- a flap shorter than the hold never fires: the next time the port goes down its hold
  starts again;
- a watch read that fails is logged once and wakes nothing; a link check whose read fails
  moves no track (no fire, no resolve); a link check never resolves (the periodic checks
  do, after `clear_checks`);
- the debounce's hold in seconds, and `due()`, on their own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from autoclusters.clients.agent import fake_backend
from autoclusters.clients.agent.agent import Agent, CheckResult
from autoclusters.clients.agent.classify import Finding
from autoclusters.clients.agent.debounce import Debouncer
from autoclusters.clients.agent.fake_backend import FakeBackend, FakeInfiniband, healthy_node
from autoclusters.clients.agent.link_watch import LinkWatch
from autoclusters.clients.agent.readings import IbReadings
from autoclusters.clients.agent.settings import AgentSettings
from autoclusters.core.node_report import NodeReport, ReportState

NODE = "gpu-07"
HCA = "mlx5_1"
INTERVAL_S = 60.0  # far beyond every wait below: a report in time came from the watch
WATCH_S = 0.2
HOLD_S = 1.0
# A check, a send and the watch's thread being late on a loaded 2-core CI machine.
SLACK_S = 1.5
WAIT_S = 10.0
STATE = "/sys/class/infiniband/mlx5_1/ports/1/state"


class Recorder:
    """The agent's report sink, keeping the reports it is handed (when), and the link checks
    run, under one condition the test waits on."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self.sent: list[tuple[float, NodeReport]] = []  # (monotonic time, report)
        self.link_checks: list[CheckResult] = []

    def submit(self, reports: list[NodeReport]) -> None:
        with self._cv:
            self.sent += [(time.monotonic(), r) for r in reports]
            self._cv.notify_all()

    def flush(self) -> None:
        pass

    def checked_links(self, result: CheckResult) -> None:
        with self._cv:
            self.link_checks.append(result)
            self._cv.notify_all()

    def wait_for(self, what: str, predicate: Callable[[], Any]) -> Any:
        with self._cv:
            got = self._cv.wait_for(predicate, WAIT_S)
        if not got:
            raise AssertionError(f"timed out waiting for {what}")
        return got

    def link_down_seen(self, down: bool) -> Callable[[], bool]:
        """A link check ran whose reading had the port down (or up)."""
        return lambda: any(("IB_LINK_DOWN" in r.findings) == down for r in self.link_checks)

    def reports(self) -> list[tuple[float, NodeReport]]:
        with self._cv:
            return [(t, r) for t, r in self.sent if r.fault == "IB_LINK_DOWN"]


class RecordedAgent(Agent):
    recorder: Recorder

    def check_links(self) -> CheckResult:
        result = super().check_links()
        self.recorder.checked_links(result)
        return result


class FlakyInfiniband(FakeInfiniband):
    """The fake file's ports, or (while `failing`) a read that could not read a port's
    state, as sysfs answers when a file read fails (`IbReadings.errors`)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.failing = False
        self.reads = 0
        self._cv = threading.Condition()

    def read(self) -> IbReadings | None:
        ib = super().read()
        with self._cv:
            self.reads += 1
            self._cv.notify_all()
        if self.failing and ib is not None:
            for p in ib.ports:
                p.state = ""
            ib.errors[STATE] = "Input/output error"
        return ib

    def wait_reads(self, n: int) -> None:
        with self._cv:
            assert self._cv.wait_for(lambda: self.reads >= n, WAIT_S), f"{n} reads"


class Rig:
    def __init__(self, tmp: Path, *, clock: Callable[[], float] = time.time, **kw: Any) -> None:
        self.file = tmp / f"{NODE}.json"
        fake_backend.write_node(self.file, healthy_node(gpus=2, nvlinks=2, hcas=2))
        self.backend = FakeBackend(self.file)
        self.backend.open()
        self.ib = FlakyInfiniband(self.file)
        self.recorder = Recorder()
        base: dict[str, Any] = {
            "interval_s": INTERVAL_S, "hold_checks": 2, "clear_checks": 2,
            "link_watch_s": WATCH_S, "link_hold_s": HOLD_S,
        }  # fmt: skip
        self.settings = AgentSettings(**(base | kw))
        self.agent = RecordedAgent(
            node=NODE, settings=self.settings, backend=self.backend, infiniband=self.ib,
            sink=self.recorder, clock=clock,
        )  # fmt: skip
        self.agent.recorder = self.recorder

    @contextmanager
    def running(self) -> Iterator[None]:
        """The agent's loop on its own thread, past its first (periodic) check."""
        stop = threading.Event()
        loop = threading.Thread(target=self.agent.run, args=(stop,), name="agent-loop")
        reads = self.ib.reads + (2 if self.settings.link_watch_s else 1)
        loop.start()
        try:
            self.ib.wait_reads(reads)  # the watch's baseline and the first check's
            yield
        finally:
            stop.set()
            self.agent.wake()
            loop.join(timeout=WAIT_S)
            assert not loop.is_alive()
            self.backend.close()

    def down(self) -> float:
        fake_backend.inject(self.file, fault="IB_LINK_DOWN", hca=HCA)
        return time.monotonic()

    def up(self) -> float:
        fake_backend.reset(self.file)
        return time.monotonic()


def test_a_port_down_past_the_hold_fires_within_hold_plus_the_watch(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    with rig.running():
        downed = rig.down()
        rig.recorder.wait_for("IB_LINK_DOWN sent", rig.recorder.reports)
    [(sent_at, report)] = rig.recorder.reports()
    took = sent_at - downed
    assert HOLD_S <= took < HOLD_S + WATCH_S + SLACK_S, f"sent {took:.2f} s after the port went"
    assert report.state is ReportState.FIRING
    assert report.message == f"{HCA} port 1: 1: DOWN / 3: Disabled"
    # Seen by a link check (the watch woke it) and fired by one, with no periodic check.
    assert rig.recorder.link_down_seen(True)()
    assert rig.recorder.link_checks[-1].reports == [report]


def test_a_flap_shorter_than_the_hold_never_fires(tmp_path: Path) -> None:
    hold = 2 * HOLD_S  # the flap's up must land within it, on a busy machine too
    rig = Rig(tmp_path, link_hold_s=hold)
    with rig.running():
        rig.down()
        rig.recorder.wait_for("the port seen down", rig.recorder.link_down_seen(True))
        rig.up()  # back within the hold
        rig.recorder.wait_for("the port seen up", rig.recorder.link_down_seen(False))
        assert "IB_LINK_DOWN" not in rig.agent.debouncer.memory.tracks  # the streak ended
        downed = rig.down()  # down again, for good: its hold starts now, not at the flap
        rig.recorder.wait_for("IB_LINK_DOWN sent", rig.recorder.reports)
    [(sent_at, report)] = rig.recorder.reports()
    assert sent_at - downed >= hold
    assert report.state is ReportState.FIRING


def test_the_periodic_check_alone_holds_in_seconds_too(tmp_path: Path) -> None:
    """With the watch off, a port the first check sees down is read again at its hold's
    end (`Debouncer.due`), not an interval later."""
    rig = Rig(tmp_path, link_watch_s=0)
    downed = rig.down()
    with rig.running():
        rig.recorder.wait_for("IB_LINK_DOWN sent", rig.recorder.reports)
    [(sent_at, _)] = rig.recorder.reports()
    assert HOLD_S <= sent_at - downed < HOLD_S + SLACK_S
    assert rig.ib.reads == 2  # the first check's and the link check's at the hold's end


def test_a_failed_watch_read_is_logged_once_and_wakes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="autoclusters.clients.agent.link_watch")
    rig = Rig(tmp_path)
    woken = threading.Event()
    watch = LinkWatch(rig.ib, every_s=0.05, wake=woken.set)
    watch.start()
    try:
        rig.ib.failing = True  # every port's state reads "" now: down, were it believed
        rig.ib.wait_reads(rig.ib.reads + 5)
        assert not woken.is_set()
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and STATE in warnings[0].getMessage()
        rig.ib.failing = False  # readable again, and unchanged: still nothing
        rig.ib.wait_reads(rig.ib.reads + 3)
        assert not woken.is_set()
        assert "read again" in caplog.records[-1].getMessage()
        rig.down()  # a real change wakes it
        assert woken.wait(WAIT_S)
    finally:
        watch.stop()


def test_a_link_check_that_cannot_read_moves_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = [1_800_000_000.0]
    rig = Rig(tmp_path, clock=lambda: now[0])
    agent = rig.agent
    agent.check()
    rig.down()
    assert agent.check_links().reports == []  # seen down: the hold starts
    before = agent.debouncer.memory.model_copy(deep=True)
    rig.ib.failing = True
    now[0] += 5 * HOLD_S  # the hold is over, but the read says nothing
    assert agent.check_links().reports == []
    assert agent.debouncer.memory == before
    assert any("could not be read" in r.getMessage() for r in caplog.records)
    rig.ib.failing = False
    [fired] = agent.check_links().reports  # readable, still down: fires now
    assert fired.state is ReportState.FIRING
    rig.up()
    rig.ib.failing = True
    now[0] += 100
    assert agent.check_links().reports == []  # an unreadable port does not resolve it
    rig.ib.failing = False
    for _ in range(3):
        now[0] += 1
        assert agent.check_links().reports == []  # up, but link checks never resolve
    assert [r.state for r in agent.check().reports] == []  # periodic: clean 1 of 2
    [resolved] = agent.check().reports
    assert resolved.state is ReportState.RESOLVED


def finding() -> dict[str, Finding]:
    return {"IB_LINK_DOWN": Finding("IB_LINK_DOWN", subjects=[{"hca": HCA}], messages=["m"])}


def test_the_hold_in_seconds_and_due() -> None:
    links = frozenset({"IB_LINK_DOWN"})
    d = Debouncer(
        hold_for=lambda _f: 2, hold_seconds=lambda f: 2.0 if f in links else None,
        clear_checks=2, rereport_s=3600, flap_window_s=3600, max_flaps=3,
    )  # fmt: skip
    assert d.due() is None
    assert d.update(100.0, finding(), only=links) == []
    assert d.due() == 102.0
    assert d.update(101.0, finding(), only=links) == []  # 2 checks, 1 s: not yet
    assert d.update(101.5, {}, only=links) == []  # up again: the streak ends
    assert d.due() is None
    assert d.update(102.0, finding(), only=links) == []  # a new streak from 102
    assert d.update(103.9, finding()) == []  # a periodic check counts too; 1.9 s
    [fired] = d.update(104.0, finding(), only=links)
    assert (fired.state, fired.since) == (ReportState.FIRING, 102.0)
    assert d.due() is None  # firing: nothing to wait for
    assert d.update(105.0, {}, only=links) == []  # a link check does not resolve
    assert d.update(110.0, {}) == []
    [resolved] = d.update(120.0, {})
    assert resolved.state is ReportState.RESOLVED
