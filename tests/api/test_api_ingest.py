"""Alert storms on an open incident: the API answers repeats without asking Temporal, and
loses nothing by it (Intake and OpenIncidents, with a stand-in for Temporal).

Aspects covered:
- an alert of a fault kind the node's open incident has, within the window, is answered
  `joined` before any Temporal call, and reaches the incident afterwards, in one batch;
- a fault kind the incident lacks waits for Temporal (it may raise the rung), and goes
  before the alerts that trail, outside a storm;
- in a storm (many nodes' alerts at once) nothing waits for a worker: each node's
  incident is started with its first kind's alerts in the start request (answered
  `opened` once the server has it), every other alert is answered `joined` and trails,
  a node's kinds in one update; an incident that lapsed but still runs (the same run) is
  joined without an update, one we know nothing of is asked by update; a start that
  fails fails the request (503); below the threshold the incident takes each alert;
- a closed incident is not joined: once the window passed, the alert waits for Temporal
  and gets the node's next incident; a trailing alert whose incident closed meanwhile is
  delivered to the next incident, and the closed one is forgotten;
- a trailing alert that can never be delivered forgets its dedupe key (a re-send delivers);
- shutdown sends what trails;
- an incident whose workflow task failed (Temporal: not ready) is a 503, retried, not 500;
- the webhooks are served by plain Starlette routes (FastAPI's machinery cost a quarter
  of an alert's CPU) and still documented in the OpenAPI document.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import cast

import pytest
from fastapi.routing import APIRoute
from starlette.routing import Match
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from autoclusters.clients import incidents
from autoclusters.clients.api import intake as intake_module
from autoclusters.clients.api import storm as storm_module
from autoclusters.clients.api.app import create_app
from autoclusters.clients.api.dedupe import DedupeStore
from autoclusters.clients.api.intake import Delivered, Intake, Signal, TemporalUnavailable
from autoclusters.clients.api.metrics import ApiMetrics
from autoclusters.clients.api.open_incidents import OpenIncident, OpenIncidents
from autoclusters.clients.api.storm import StormWatch
from autoclusters.clients.incidents import OpenedIncident
from autoclusters.clients.inventory import StaticInventory
from autoclusters.clients.storm_calls import StartedIncident
from autoclusters.clients.web.settings import ApiSettings
from autoclusters.core.fault_evidence import FaultEvidence
from autoclusters.core.models import FaultReport


@dataclass
class Call:
    node: str
    fault: str  # several, joined by "+", for one call carrying several kinds
    key: str
    # update (with start, the incident's worker took it), run <id> (to that run only),
    # start (Temporal's server took it)
    how: str = "update"
    alerts: int = 1


@dataclass
class FakeTemporal:
    """Answers open-or-join like the incident would; `refuse` makes the next calls fail
    (the incident is closing), after which the node's next incident opens."""

    incident: str = "inc-1"
    calls: list[Call] = field(default_factory=list)
    refuse: int = 0
    gate: asyncio.Event | None = None  # set: calls wait for it
    down: bool = False  # starts fail: Temporal unreachable
    running: dict[str, str] = field(default_factory=dict)  # node -> run id (starts only)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def deliver(
        self,
        node: str,
        fault: str,
        source: str,
        key: str,
        evidence: FaultEvidence | None,
        at: datetime | None,
        alerts: int = 1,
    ) -> OpenedIncident:
        if self.gate is not None:
            await self.gate.wait()
        async with self.changed:
            self.calls.append(Call(node, fault, key, alerts=alerts))
            self.changed.notify_all()
        if self.refuse:
            self.refuse -= 1
            self.incident = "inc-2"  # the closing one is done after this
            raise TemporalUnavailable(f"the incident on {node} is closing", kind="closing")
        first = len(self.calls) == 1 or not any(c.node == node for c in self.calls[:-1])
        return OpenedIncident(
            incident_id=self.incident,
            workflow_id=f"wf-{node}",
            run_id="r",
            joined=not first,
            opened=first,
        )

    async def start(
        self,
        node: str,
        fault: str,
        source: str,
        key: str,
        evidence: FaultEvidence | None,
        at: datetime | None,
        alerts: int = 1,
    ) -> StartedIncident:
        """The server's answer to a start: opened unless the node's incident runs."""
        if self.down:
            raise TemporalUnavailable("cannot reach Temporal")
        async with self.changed:
            self.calls.append(Call(node, fault, key, "start", alerts))
            self.changed.notify_all()
        if node in self.running:
            return StartedIncident(run_id=self.running[node])
        self.running[node] = f"run-{node}"
        opened = OpenedIncident(
            incident_id=self.incident, workflow_id=f"wf-{node}", run_id=f"run-{node}",
            joined=False, opened=True,
        )  # fmt: skip
        return StartedIncident(run_id=f"run-{node}", opened=opened)

    async def deliver_all(
        self, node: str, reports: list[FaultReport], known: OpenIncident | None = None
    ) -> OpenedIncident:
        """One update for several kinds: to the run known (`run`), or with a start."""
        faults = "+".join(r.fault for r in reports)
        alerts = sum(r.alerts for r in reports)
        opened = await self.deliver(node, faults, "", reports[0].key, None, None, alerts)
        if known is not None:
            self.calls[-1].how = f"run {known.run_id}"
        return opened

    async def until(self, check: Callable[[], bool], timeout_s: float = 5) -> None:
        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(check), timeout_s)


def make_intake(
    temporal: FakeTemporal, ttl_s: float = 60, flush_s: float = 0.01, storm_nodes: int = 0
) -> tuple[Intake, OpenIncidents, DedupeStore[Delivered]]:
    """`storm_nodes`: alerts on their way for that many nodes at once make a storm (0:
    never, and no starts: as before storms had a path of their own)."""
    known = OpenIncidents(ttl_s)
    dedupe = DedupeStore[Delivered](ttl_s=3600, max_entries=1000)
    intake = Intake(
        temporal.deliver,
        dedupe=dedupe,
        metrics=ApiMetrics(),
        max_in_flight=8,
        timeout_s=5,
        open_incidents=known,
        join_flush_s=flush_s,
        start=temporal.start if storm_nodes else None,
        storm=StormWatch(storm_nodes),
        deliver_all=temporal.deliver_all if storm_nodes else None,
    )
    return intake, known, dedupe


def sig(key: str, fault: str = "XID_79", node: str = "gpu-001") -> Signal:
    return Signal(key=key, node=node, fault=fault, source="alertmanager")


async def eventually(check: Callable[[], bool], timeout_s: float = 5) -> None:
    """Until `check()` holds (a failed call is handled a few loop turns after it failed)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.001)


async def test_a_repeat_within_the_window_is_answered_joined_without_temporal() -> None:
    temporal = FakeTemporal()
    intake, _, _ = make_intake(temporal, flush_s=0.05)
    try:
        [first] = await intake.submit([sig("a1")])
        assert first.delivered.opened and len(temporal.calls) == 1

        outcomes = await intake.submit([sig(f"a{i}") for i in range(2, 12)])
        # Answered before Temporal heard of them: still the one call that opened it.
        assert len(temporal.calls) == 1
        assert {o.delivered.incident_id for o in outcomes} == {"inc-1"}
        assert not any(o.delivered.opened or o.repeat for o in outcomes)

        # ... and they reach the incident afterwards, together.
        await temporal.until(lambda: len(temporal.calls) == 2)
        assert temporal.calls[1].key.startswith("reports-10-")
    finally:
        await intake.close()


async def test_a_new_fault_kind_on_the_node_waits_for_temporal() -> None:
    temporal = FakeTemporal()
    intake, _, _ = make_intake(temporal)
    try:
        await intake.submit([sig("a1")])
        temporal.gate = asyncio.Event()
        answer = asyncio.create_task(intake.submit([sig("b1", fault="ECC_DBE")]))
        await asyncio.sleep(0.05)  # room to answer early, if it (wrongly) would
        assert not answer.done(), "a new fault kind must not be answered before Temporal"
        temporal.gate.set()
        [outcome] = await answer
        assert [c.fault for c in temporal.calls] == ["XID_79", "ECC_DBE"]
        assert outcome.delivered.incident_id == "inc-1"
        # The incident now has both kinds: a repeat of the new one is answered at once.
        temporal.gate = asyncio.Event()  # closed: any call would hang
        [again] = await asyncio.wait_for(intake.submit([sig("b2", fault="ECC_DBE")]), 1)
        assert again.delivered.incident_id == "inc-1"
        temporal.gate.set()
    finally:
        await intake.close()


async def test_what_a_request_waits_for_goes_before_what_trails() -> None:
    temporal = FakeTemporal()
    intake, _, _ = make_intake(temporal)
    try:
        await intake.submit([sig("a1")])
        temporal.gate = asyncio.Event()
        lane = intake._lanes  # node -> alerts waiting for the call in flight to return
        busy = asyncio.create_task(intake.submit([sig("c1", fault="IB_LINK_DOWN")]))
        await eventually(lambda: lane.get("gpu-001") == [])  # c1's call is in flight
        await intake.submit([sig("a2")])  # trails, then queues behind the busy call
        await eventually(lambda: len(lane["gpu-001"]) == 1)
        waiting = asyncio.create_task(intake.submit([sig("b1", fault="ECC_DBE")]))
        await eventually(lambda: len(lane["gpu-001"]) == 2)
        temporal.gate.set()
        await busy
        [outcome] = await waiting
        # One batch, sent together (the incident is known open): the waited-for one first.
        assert [c.fault for c in temporal.calls[1:]] == ["IB_LINK_DOWN", "ECC_DBE", "XID_79"]
        assert outcome.delivered.incident_id == "inc-1"
    finally:
        await intake.close()


async def test_an_incident_known_open_too_long_ago_is_asked_again() -> None:
    temporal = FakeTemporal()
    intake, known, _ = make_intake(temporal, ttl_s=5)
    try:
        await intake.submit([sig("a1")])
        # As if the report that said it was open went out 10 s ago; it has closed since.
        known.forget("gpu-001")
        known.learn("gpu-001", "inc-1", "wf-gpu-001", "XID_79", time.monotonic() - 10)
        assert known.joined("gpu-001", "XID_79") is None
        temporal.incident = "inc-2"
        [outcome] = await intake.submit([sig("a2")])
        assert len(temporal.calls) == 2, "the alert must go to Temporal before the answer"
        assert outcome.delivered.incident_id == "inc-2"
        assert known.joined("gpu-001", "XID_79") is not None  # learnt anew
    finally:
        await intake.close()


async def test_a_trailing_alert_whose_incident_closed_goes_to_the_next_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(intake_module, "TRAIL_RETRIES_S", (0.01, 0.01))
    temporal = FakeTemporal()
    intake, known, _ = make_intake(temporal)
    try:
        await intake.submit([sig("a1")])
        temporal.refuse = 1  # the incident closes before the trailing call lands
        [joined] = await intake.submit([sig("a2")])
        assert joined.delivered.incident_id == "inc-1" and len(temporal.calls) == 1
        # Refused once (closing), then sent again: the node's next incident takes it.
        await temporal.until(lambda: len(temporal.calls) == 3)
        assert temporal.calls[1].key == temporal.calls[2].key == "report-a2"
        entry = known.joined("gpu-001", "XID_79")
        assert entry is not None and entry.incident_id == "inc-2"
        [later] = await intake.submit([sig("a3")])
        assert later.delivered.incident_id == "inc-2"
    finally:
        await intake.close()


async def test_a_closing_incident_is_forgotten_and_the_next_alert_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(intake_module, "TRAIL_RETRIES_S", (30.0,))
    temporal = FakeTemporal()
    intake, known, _ = make_intake(temporal)
    try:
        await intake.submit([sig("a1")])
        temporal.refuse = 1
        await intake.submit([sig("a2")])
        await temporal.until(lambda: len(temporal.calls) == 2)  # the refused trailing call
        # A closing incident is not joined: the refusal forgets it.
        await eventually(lambda: known.joined("gpu-001", "XID_79") is None)
        [outcome] = await intake.submit([sig("a3")])
        assert len(temporal.calls) == 3 and outcome.delivered.incident_id == "inc-2"
    finally:
        await intake.close(drain_s=0)


async def test_a_trailing_alert_never_delivered_forgets_its_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(intake_module, "TRAIL_RETRIES_S", (0.01,))
    temporal = FakeTemporal()
    intake, _, dedupe = make_intake(temporal)
    try:
        await intake.submit([sig("a1")])
        temporal.refuse = 2
        await intake.submit([sig("a2")])
        await temporal.until(lambda: len(temporal.calls) == 3)
        # Given up: a re-send of an alert that never reached the incident delivers again.
        await eventually(lambda: "a2" not in dedupe)
    finally:
        await intake.close(drain_s=0)


async def test_shutdown_sends_what_trails() -> None:
    temporal = FakeTemporal()
    intake, _, _ = make_intake(temporal, flush_s=60)
    await intake.submit([sig("a1")])
    await intake.submit([sig("a2"), sig("a3")])
    assert len(temporal.calls) == 1
    await intake.close()
    assert len(temporal.calls) == 2 and temporal.calls[1].key.startswith("reports-2-")


# --- storms ----------------------------------------------------------------------------------

STORM_NODES = [f"gpu-{i:03d}" for i in range(1, 5)]


async def test_in_a_storm_each_node_is_opened_by_a_start_and_nothing_waits_for_a_worker() -> None:
    temporal = FakeTemporal()
    intake, _, _ = make_intake(temporal, storm_nodes=3, flush_s=0.05)
    try:
        # Four nodes at once (a storm from three): two alerts of one kind and one of
        # another on each.
        temporal.gate = asyncio.Event()  # closed: any update would hang
        signals = [
            sig(f"{kind}{i}-{n}", fault, node)
            for n, node in enumerate(STORM_NODES)
            for i, (kind, fault) in enumerate([("x", "XID_79"), ("x", "XID_79"), ("e", "ECC_DBE")])
        ]
        outcomes = await asyncio.wait_for(intake.submit(signals), 2)
        # Answered from the starts alone: one per node, carrying its first kind's alerts.
        starts = [c for c in temporal.calls if c.how == "start"]
        assert [(c.node, c.fault, c.alerts) for c in starts] == [
            (node, "XID_79", 2) for node in STORM_NODES
        ]
        assert len(temporal.calls) == len(STORM_NODES)
        opened = {o.signal.node: o.delivered.opened for o in outcomes if o.delivered.opened}
        assert opened == dict.fromkeys(STORM_NODES, True)
        assert sum(o.delivered.opened for o in outcomes) == len(STORM_NODES)

        # The other kind trails: one update per node reaches the incident afterwards, to
        # the run its start began.
        temporal.gate.set()
        await temporal.until(lambda: len(temporal.calls) == 2 * len(STORM_NODES))
        updates = temporal.calls[len(STORM_NODES) :]
        assert sorted((c.node, c.fault, c.alerts, c.how) for c in updates) == [
            (node, "ECC_DBE", 1, f"run run-{node}") for node in STORM_NODES
        ]
    finally:
        await intake.close()


async def test_in_a_storm_a_nodes_alerts_of_several_kinds_trail_in_one_update() -> None:
    temporal = FakeTemporal()
    intake, _, _ = make_intake(temporal, storm_nodes=3, flush_s=0.05)
    try:
        await intake.submit([sig(f"o-{node}", node=node) for node in STORM_NODES])
        assert [c.how for c in temporal.calls] == ["start"] * len(STORM_NODES)
        later = [
            sig(f"{fault}-{i}", fault, "gpu-001")
            for fault in ("ECC_DBE", "IB_LINK_DOWN", "XID_79")
            for i in range(3)
        ]
        outcomes = await intake.submit(later)
        assert not any(o.delivered.opened for o in outcomes)
        assert {o.delivered.incident_id for o in outcomes} == {"inc-1"}
        await temporal.until(lambda: len(temporal.calls) == len(STORM_NODES) + 1)
        [update] = temporal.calls[len(STORM_NODES) :]
        assert (update.node, update.how, update.alerts) == ("gpu-001", "run run-gpu-001", 9)
        assert sorted(update.fault.split("+")) == ["ECC_DBE", "IB_LINK_DOWN", "XID_79"]
    finally:
        await intake.close()


async def test_in_a_storm_a_lapsed_incident_still_running_is_joined_without_an_update() -> None:
    temporal = FakeTemporal()
    intake, known, _ = make_intake(temporal, storm_nodes=3, flush_s=60)
    try:
        await intake.submit([sig(f"o-{node}", node=node) for node in STORM_NODES])
        # As if Temporal last said so long ago: the entry lapsed, the run still runs.
        entry = known.open_on("gpu-001")
        assert entry is not None
        entry.as_of -= 3600
        assert known.open_on("gpu-001") is None
        temporal.gate = asyncio.Event()  # closed: any update would hang
        [outcome] = await asyncio.wait_for(intake.submit([sig("late", "ECC_DBE")]), 2)
        assert outcome.delivered.incident_id == "inc-1" and not outcome.delivered.opened
        assert [c.how for c in temporal.calls[len(STORM_NODES) :]] == ["start"]  # the probe
        assert known.open_on("gpu-001") is not None  # fresh again
        temporal.gate.set()
    finally:
        await intake.close(drain_s=0)


async def test_in_a_storm_an_incident_we_know_nothing_of_is_asked_by_update() -> None:
    temporal = FakeTemporal(running={"gpu-001": "run-of-another-replica"})
    intake, _, _ = make_intake(temporal, storm_nodes=3)
    try:
        outcomes = await intake.submit([sig(f"o-{node}", node=node) for node in STORM_NODES])
        first = [(c.how, c.fault) for c in temporal.calls if c.node == "gpu-001"]
        # The start found a run: nothing was sent to it, so the alert went by update,
        # and joined the incident that ran already.
        assert first == [("start", "XID_79"), ("update", "XID_79")]
        opened = sorted(o.signal.node for o in outcomes if o.delivered.opened)
        assert opened == STORM_NODES[1:]
    finally:
        await intake.close()


async def test_in_a_storm_temporal_down_fails_the_request() -> None:
    temporal = FakeTemporal(down=True)
    intake, _, dedupe = make_intake(temporal, storm_nodes=3)
    try:
        with pytest.raises(TemporalUnavailable):
            await intake.submit([sig(f"o-{node}", node=node) for node in STORM_NODES])
        # Nothing was accepted: Alertmanager's retry delivers them all.
        await eventually(lambda: not any(f"o-{node}" in dedupe for node in STORM_NODES))
    finally:
        await intake.close()


async def test_below_the_storm_threshold_the_incident_takes_each_alert_itself() -> None:
    temporal = FakeTemporal()
    intake, _, _ = make_intake(temporal, storm_nodes=3)
    try:
        await intake.submit([sig("a1"), sig("b1", "ECC_DBE", "gpu-002")])
        assert [c.how for c in temporal.calls] == ["update", "update"]
    finally:
        await intake.close()


def test_a_storm_is_many_busy_nodes_and_lasts_a_while_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr(storm_module.time, "monotonic", lambda: now[0])
    watch = StormWatch(nodes=8, hold_s=10)
    assert not watch.observe(7)
    assert watch.observe(8)
    now[0] += 9
    assert watch.observe(0)  # a lull between payloads
    now[0] += 2
    assert not watch.observe(1)
    assert not StormWatch(nodes=0).observe(10_000)  # api_storm_nodes = 0: never


def test_open_incidents_learn_only_newer_news_and_expire() -> None:
    known = OpenIncidents(ttl_s=5)
    now = time.monotonic()
    known.learn("n", "inc-2", "wf", "XID_79", now)
    known.learn("n", "inc-1", "wf", "XID_79", now - 1)  # an older call's late answer
    entry = known.joined("n", "XID_79")
    assert entry is not None and entry.incident_id == "inc-2"
    assert known.joined("n", "ECC_DBE") is None  # a kind the incident does not have
    assert known.joined("other", "XID_79") is None
    # A failure forgets the incident, and a call sent before it cannot bring it back.
    sent = time.monotonic()
    known.forget("n")
    known.learn("n", "inc-2", "wf", "XID_79", sent)
    assert known.joined("n", "XID_79") is None
    known.learn("n", "inc-3", "wf", "XID_79", time.monotonic())
    assert known.joined("n", "XID_79") is not None
    off = OpenIncidents(ttl_s=0)
    off.learn("n", "inc-1", "wf", "XID_79", now)
    assert off.joined("n", "XID_79") is None  # 0 turns it off


def test_the_webhooks_are_served_plainly_and_still_documented() -> None:
    app = create_app(
        ApiSettings(api_inventory="static"),
        client_factory=_no_temporal,
        inventory=StaticInventory([]),
    )
    scope = {"type": "http", "method": "POST", "path": "/v1/alerts/alertmanager"}
    first = next(r for r in app.router.routes if r.matches(scope)[0] == Match.FULL)
    assert not isinstance(first, APIRoute), "FastAPI's route would serve it: the slow path"
    doc = app.openapi()["paths"]
    for path in ("/v1/alerts/alertmanager", "/v1/reports"):
        assert "requestBody" in doc[path]["post"], path


async def _no_temporal() -> Client:
    raise AssertionError("no Temporal in this test")


async def test_an_incident_whose_workflow_task_failed_is_503_not_500(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def not_ready(*_args: object, **_kwargs: object) -> OpenedIncident:
        raw = b"\x08\t...type.googleapis.com/temporal.api.errordetails.v1.WorkflowNotReadyFailure"
        raise RPCError(
            "Unable to perform workflow execution update due to Workflow Task in failed state.",
            RPCStatusCode.FAILED_PRECONDITION,
            raw,
        )

    async def client() -> Client:
        return cast(Client, object())

    monkeypatch.setattr(incidents, "open_incident", not_ready)
    app = create_app(ApiSettings(api_inventory="static"), client_factory=client)
    with pytest.raises(TemporalUnavailable) as refused:
        await app.state.api.deliver("gpu-001", "XID_79", "alertmanager", "k", None, None)
    assert refused.value.kind == "not_ready"
