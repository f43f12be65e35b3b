"""The floor holds (issue 38): a storm never takes a cluster below its fleet guard's floor,
held critical drains included, unless the policy names the path (`guard.below_floor`).

NodeRemediation and FleetGuard on the time-skipping server against the in-memory Slurm and
cloud of tests/workflows/test_remediation_workflow.py, then the guard alone driven by updates.

Aspects covered:
- a storm of critical alerts over 4 nodes (floor 2) trips the breaker: 2 nodes are
  quarantined, the other 2 are held and their drains held too; Slurm never shows more
  than 2 drained; the held incidents, their Slack notices, the guard's queue and the
  console's guard bar say "held: drain not allowed, the cluster is at its floor (2 of 4
  in service)";
- with `below_floor: [drain_held_critical]` the held critical nodes are drained anyway;
- after the breaker's reset the held incidents are admitted in arrival order as nodes come
  back, never below the floor;
- the guard alone: held drains queue in arrival order and are admitted within the floor
  only; many asking at once are answered from the guard's one count; a quarantine admitted
  makes its incident's held drain moot; a newer policy naming the path admits what waits;
  a held-drained node left for a human keeps counting;
- `autoclusters breaker status` shows the floor, the count and the drains held there;
- the recorded 0.2 history of a held drain at the floor asks the guard first.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner

from autoclusters.clients import breaker
from autoclusters.clients.cli.breaker import breaker_app
from autoclusters.clients.console.topology import guard_view
from autoclusters.core.guard import (
    Admission,
    AdmitRequest,
    AdmittedNotice,
    GuardState,
    GuardStatus,
    PolicyUpdate,
    Waiter,
)
from autoclusters.core.guard_batch import GuardBatch, GuardCall
from autoclusters.core.models import FaultReport, IncidentState, workflow_id
from autoclusters.core.policy import GuardPolicy
from autoclusters.workflows.fleet_guard import FleetGuard
from autoclusters.workflows.remediation import NodeRemediation
from tests.decisions import proven_reset
from tests.fakes.systems import FakeCloud
from tests.helpers import time_skipping_env
from tests.workflows.test_fleet_guard import (
    Waiting,
    _fake_connect,
    _guard,
    _quarantine,
    _release,
    _status,
    _told,
)
from tests.workflows.test_fleet_guard import _waiting as _stand_in
from tests.workflows.test_remediation_workflow import Fleet, _fleet, _policy

NODES = ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]
# At least half the nodes in service (2 of 4); the second incident within the window trips
# the breaker, so every storm here is one the breaker saw.
STORM_GUARD = GuardPolicy(min_in_service_fraction=0.5, breaker_threshold=1)
AT_THE_FLOOR = "held: drain not allowed, the cluster is at its floor (2 of 4 in service)"
HISTORIES = Path(__file__).parents[1] / "histories"

Incident = WorkflowHandle[NodeRemediation, IncidentState]


@pytest_asyncio.fixture
async def env() -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping server per test, as tests/workflows/test_remediation_workflow.py's."""
    async with await time_skipping_env() as environment:
        yield environment


# --- a storm on NodeRemediation + FleetGuard ------------------------------------------------


async def _storm(f: Fleet, guard: GuardPolicy, alerts_per_node: int = 5) -> dict[str, Incident]:
    """Every node's critical alerts at once, as the API sends them: an update-with-start
    each, the first opening the node's incident and the others joining it."""
    policy = _policy(guard=guard)
    requests = {n: f.request(n, policy=policy) for n in NODES}

    async def alert(node: str, i: int) -> None:
        await f.env.client.execute_update_with_start_workflow(
            NodeRemediation.report_fault,
            FaultReport(
                incident_id=f"alert-{node}-{i}",
                fault=("XID_79", "XID_48")[i % 2],
                source="alertmanager",
                at=datetime.now(UTC),
            ),
            start_workflow_operation=f.with_start(requests[node]),
        )

    await asyncio.gather(*(alert(n, i) for n in NODES for i in range(alerts_per_node)))
    client = f.env.client
    return {
        n: client.get_workflow_handle_for(NodeRemediation.run, workflow_id(f.cluster, n))
        for n in NODES
    }


async def _settled(f: Fleet, incidents: dict[str, Incident]) -> dict[str, IncidentState]:
    """Once every incident is quarantined and waits on its repair, or is held at its
    quarantine with the humans told: each node's state then."""

    async def done() -> dict[str, IncidentState] | None:
        states = {n: await h.query(NodeRemediation.status) for n, h in incidents.items()}
        for node, st in states.items():
            w = st.waiting_for
            repair = st.current_step in ("admit_repair", "repair")
            held = w is not None and w.step == "quarantine" and "held" in f.events(node)
            if not (repair or held):
                return None
        return states

    deadline = asyncio.get_running_loop().time() + 60
    while (states := await done()) is None:
        assert asyncio.get_running_loop().time() < deadline, "the storm did not settle"
        await asyncio.sleep(0.1)
    return states


def _most_drained(log: list[tuple[str, str]]) -> int:
    """The most nodes Slurm showed drained at one time, from the fake's call log."""
    drained: set[str] = set()
    most = 0
    for what, node in log:
        if what in ("drain", "admin_drain"):
            drained.add(node)
        elif what in ("resume", "admin_resume", "drain_lost"):
            drained.discard(node)
        most = max(most, len(drained))
    return most


def _held_at_quarantine(states: dict[str, IncidentState]) -> list[str]:
    return sorted(
        n for n, st in states.items() if st.waiting_for and st.waiting_for.step == "quarantine"
    )


@pytest.mark.parametrize("named", [False, True], ids=["floor-holds", "below-floor-named"])
async def test_a_storm_with_the_breaker_tripped_keeps_the_floor(
    env: WorkflowEnvironment, named: bool
) -> None:
    guard = STORM_GUARD.model_copy(update={"below_floor": ["drain_held_critical"] if named else []})
    # Repairs never finish here (and the tripped breaker holds them anyway).
    async with _fleet(env, nodes=4, cloud=lambda s: FakeCloud(s, hold=True)) as f:
        states = await _settled(f, await _storm(f, guard))
        status = await f.guard_status()
        st = status.state

        assert st.breaker.tripped
        held = _held_at_quarantine(states)
        quarantined = sorted(set(NODES) - set(held))
        assert len(held) == 2, {n: s.waiting_for for n, s in states.items()}
        assert sorted(st.out_of_service) == quarantined
        drained = sorted(n for n in NODES if f.slurm.node_now(n).drained)
        if not named:
            # The floor holds: the held critical nodes keep serving, and everyone says why.
            assert drained == quarantined
            assert _most_drained(f.slurm.log) == 2
            assert st.held_drained == {}
            for node in held:
                waiting = states[node].waiting_for
                assert waiting is not None and waiting.detail.startswith(AT_THE_FLOOR)
                note = f.notes(node)[-1]
                assert (note.event, note.severity) == ("held", "warning")
                assert AT_THE_FLOOR in note.text
                assert states[node].step("drain_held") is None
            # Each held incident waits twice, first come first served: for its quarantine
            # and for its drain (each queue in the order its requests came).
            for kind in ("quarantine", "held_drain"):
                waiters = [w for w in st.queue if w.kind == kind]
                assert sorted(w.node for w in waiters) == held
                assert [w.ticket for w in waiters] == sorted(w.ticket for w in waiters)
            drains = [w.node for w in st.queue if w.kind == "held_drain"]
            bar = guard_view(status)
            assert (bar.held_at_floor, bar.floor_detail) == (drains, "in service 2 of 4, floor 2")
        else:
            # Named: the held critical nodes are drained whatever the floor, and counted.
            assert drained == NODES
            assert st.held_drained == {n: states[n].request.incident_id for n in held}
            assert st.counted_out() == set(NODES)
            for node in held:
                assert f.slurm.node_now(node).reason.endswith(" (held)")
                assert AT_THE_FLOOR not in f.notes(node)[-1].text
                step = states[node].step("drain_held")
                assert step is not None and step.outcome == "ok"
            assert guard_view(status).held_at_floor == []


async def test_after_the_reset_the_held_are_admitted_in_arrival_order_never_below_the_floor(
    env: WorkflowEnvironment,
) -> None:
    async with _fleet(env, nodes=4) as f:
        incidents = await _storm(f, STORM_GUARD)
        states = await _settled(f, incidents)
        queue = (await f.guard_status()).state.queue
        arrival = [w.node for w in queue if w.kind == "quarantine"]
        assert sorted(arrival) == _held_at_quarantine(states)
        assert sorted(w.node for w in queue if w.kind == "held_drain") == sorted(arrival)
        assert f.cloud.repair_calls == []  # the breaker holds them

        await f.guard.execute_update(FleetGuard.reset_breaker, await proven_reset(f.guard, "alice"))
        results = await asyncio.gather(*(h.result() for h in incidents.values()))

        # The guard told the held incidents in the order they arrived (the others heard
        # of their repairs).
        history = await f.guard.fetch_history()
        held = [workflow_id(f.cluster, n) for n in arrival]
        told = [
            e.signal_external_workflow_execution_initiated_event_attributes.workflow_execution
            for e in history.events
            if e.HasField("signal_external_workflow_execution_initiated_event_attributes")
        ]
        first_told = dict.fromkeys(t.workflow_id for t in told if t.workflow_id in held)
        assert list(first_told) == held
        assert (await f.guard_status()).state.queue == []

    assert [r.status for r in results] == ["resolved"] * 4
    log = f.slurm.log
    assert _most_drained(log) == 2  # never below the floor, all along
    # Each held node was drained (its quarantine) only once there was room: the first
    # after one node came back, the second after both.
    resumed = [i for i, (what, _) in enumerate(log) if what == "resume"]
    first, second = (log.index(("drain", n)) for n in arrival)
    assert resumed[0] < first and resumed[1] < second
    for r in results:
        assert r.step("drain_held") is None  # the quarantine came first: no drain was held


# --- the guard alone ----------------------------------------------------------------------


async def _held_drain(
    g: WorkflowHandle[FleetGuard, None],
    node: str,
    incident_id: str,
    *,
    cluster_nodes: int = 8,
    wf: str | None = None,
) -> Admission:
    return await g.execute_update(
        FleetGuard.admit_held_drain,
        AdmitRequest(
            node=node, incident_id=incident_id, cluster_nodes=cluster_nodes, workflow_id=wf
        ),
    )


async def test_held_drains_wait_in_arrival_order_within_the_floor(
    env: WorkflowEnvironment,
) -> None:
    # 8 nodes, at least 75 % in service: the floor is 6, so 2 out at most.
    async with _guard(env, policy=GuardPolicy(min_in_service_fraction=0.75)) as g:
        assert (await _quarantine(g, "gpu-01", "INC-1")).admitted
        assert (await _quarantine(g, "gpu-02", "INC-2")).admitted
        waiters = {i: await _stand_in(env, g, f"inc-{i}") for i in (3, 4, 5)}
        held = {i: await _held_drain(g, f"gpu-0{i}", f"INC-{i}", wf=waiters[i]) for i in (3, 4, 5)}
        assert [(a.admitted, a.queued, a.position) for a in held.values()] == [
            (False, True, 1),
            (False, True, 2),
            (False, True, 3),
        ]
        assert held[3].reason == (
            "drain not allowed, the cluster is at its floor (6 of 8 in service)"
        )
        # Asking again while queued: the same place and ticket.
        again = await _held_drain(g, "gpu-04", "INC-4", wf=waiters[4])
        assert (again.position, again.ticket) == (2, held[4].ticket)

        for back, nxt in (("1", 3), ("2", 4)):
            await _release(g, f"gpu-0{back}", f"INC-{back}", back=True)
            told = await _told(env, waiters[nxt])
            assert told == [
                AdmittedNotice(kind="held_drain", incident_id=f"INC-{nxt}", ticket=held[nxt].ticket)
            ]
            st = (await _status(g)).state
            assert st.held_drained[f"gpu-0{nxt}"] == f"INC-{nxt}"
            assert len(st.counted_out()) == 2  # never below the floor
            assert [w.incident_id for w in st.queue] == [f"INC-{i}" for i in range(nxt + 1, 6)]
        assert (await _held_drain(g, "gpu-03", "INC-3")).reason == "already out of service"

        # Its quarantine admitted, a held-drained node counts once: no more room is taken.
        assert (await _quarantine(g, "gpu-03", "INC-3")).admitted
        st = (await _status(g)).state
        assert (st.out_of_service, st.held_drained) == ({"gpu-03": "INC-3"}, {"gpu-04": "INC-4"})

        # A newer policy naming the path admits what waits, below the floor.
        named = GuardPolicy(min_in_service_fraction=0.75, below_floor=["drain_held_critical"])
        await g.execute_update(FleetGuard.update_policy, PolicyUpdate(policy=named))
        await _told(env, waiters[5])
        assert len((await _status(g)).state.counted_out()) == 3

        # Its incident failed: the held-drained node is left for a human, and keeps counting
        # while Slurm shows it drained.
        await _release(g, "gpu-04", "INC-4", back=False)
        st = (await _status(g)).state
        assert (st.out_of_service["gpu-04"], st.left_out) == ("INC-4", {"gpu-04": "INC-4"})
        assert "gpu-04" not in st.held_drained
        for wf_id in waiters.values():
            await env.client.get_workflow_handle(wf_id).terminate("test over")


async def test_many_asking_at_once_are_answered_from_the_guards_one_count(
    env: WorkflowEnvironment,
) -> None:
    # 4 nodes, half in service: room for 2 out. Four incidents ask in one batch (as a busy
    # worker sends them): each answer counts the ones before it.
    async with _guard(env, policy=GuardPolicy(min_in_service_fraction=0.5)) as g:
        calls = [
            GuardCall(
                update="admit_held_drain",
                admit=AdmitRequest(node=n, incident_id=f"INC-{n}", cluster_nodes=4),
            )
            for n in NODES
        ]
        answers = await g.execute_update(FleetGuard.batch, GuardBatch(calls=calls))
        assert [a.admission.admitted for a in answers if a.admission] == [True, True, False, False]
        assert [a.admission.position for a in answers if a.admission] == [None, None, 1, 2]
        st = (await _status(g)).state
        assert st.held_drained == {"gpu-01": "INC-gpu-01", "gpu-02": "INC-gpu-02"}


async def test_an_admitted_quarantine_takes_the_place_of_its_held_drain(
    env: WorkflowEnvironment,
) -> None:
    # 4 nodes, half in service. gpu-03 and gpu-04 are held (quarantine, then drain) as their
    # incidents ask: the quarantine goes first when a node comes back.
    async with _guard(env, policy=GuardPolicy(min_in_service_fraction=0.5)) as g:
        for n in ("gpu-01", "gpu-02"):
            assert (await _quarantine(g, n, f"INC-{n}", cluster_nodes=4)).admitted
        waiters = {n: await _stand_in(env, g, n) for n in ("gpu-03", "gpu-04")}
        tickets = {}
        for n in ("gpu-03", "gpu-04"):
            q = await _quarantine(g, n, f"INC-{n}", cluster_nodes=4, wf=waiters[n])
            d = await _held_drain(g, n, f"INC-{n}", cluster_nodes=4, wf=waiters[n])
            assert not q.admitted and not d.admitted
            tickets[n] = q.ticket
        await _release(g, "gpu-01", "INC-gpu-01", back=True)

        told = await _told(env, waiters["gpu-03"])
        assert told == [
            AdmittedNotice(kind="quarantine", incident_id="INC-gpu-03", ticket=tickets["gpu-03"])
        ]
        st = (await _status(g)).state
        assert st.counted_out() == {"gpu-02", "gpu-03"}
        assert [(w.kind, w.node) for w in st.queue] == [
            ("quarantine", "gpu-04"),
            ("held_drain", "gpu-04"),
        ]
        stand_in = env.client.get_workflow_handle_for(Waiting.run, waiters["gpu-04"])
        assert await stand_in.query(Waiting.told) == []
        for wf_id in waiters.values():
            await env.client.get_workflow_handle(wf_id).terminate("test over")


def test_breaker_status_shows_the_floor_and_the_drains_held_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_connect(monkeypatch)
    at = datetime(2026, 1, 5, 3, 0, tzinfo=UTC)
    st = GuardStatus(
        cluster="c1",
        policy=GuardPolicy(min_in_service_fraction=0.5),
        state=GuardState(
            cluster_nodes=4,
            out_of_service={"gpu-01": "INC-1"},
            held_drained={"gpu-02": "INC-2"},
            queue=[
                Waiter(
                    kind="held_drain",
                    node="gpu-03",
                    incident_id="INC-3",
                    workflow_id=None,
                    ticket=1,
                    since=at,
                )
            ],
        ),
    )

    async def status(client: Any, cluster: str) -> GuardStatus:
        return st

    monkeypatch.setattr(breaker, "breaker_status", status)

    out = CliRunner().invoke(breaker_app, ["status"])

    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "at least 50% of nodes in service (below it: nothing)" in text
    assert "in service: 2 of 4 nodes (floor 2)" in text
    assert "waiting for drain while held (at the floor): gpu-03 (INC-3)" in text
    assert "INC-2 (drained while held)" in text


# --- the recorded history -------------------------------------------------------------------


def test_the_recorded_held_drain_at_the_floor_asks_the_guard_first() -> None:
    """The 0.2 history of the case: the held drain's ask comes after the patch marker, and
    no drain follows it (the guard held it at the floor)."""
    events = json.loads((HISTORIES / "remediation_0.2_held_drain_at_floor.json").read_text())
    names = [
        e["activityTaskScheduledEventAttributes"]["activityType"]["name"]
        for e in events["events"]
        if "activityTaskScheduledEventAttributes" in e
    ]
    asked = names.index("guard_admit_held_drain")
    assert names[asked - 1] == "guard_admit_quarantine"
    assert names[asked + 1] == "notify"  # held: no drain before the guard's signal
    markers = [e for e in events["events"] if "markerRecordedEventAttributes" in e]
    assert any(b"remediation-0.2-held-drain-asks-the-guard" in _payload(m) for m in markers), (
        "no patch marker"
    )


def _payload(marker: dict[str, Any]) -> bytes:
    payloads = marker["markerRecordedEventAttributes"]["details"]["patch-data"]["payloads"]
    return b"".join(base64.b64decode(p["data"]) for p in payloads)
