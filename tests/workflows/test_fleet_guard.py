"""FleetGuard on the time-skipping test server, driven with updates from the client.

Aspects covered:
- the breaker trips on the (K+1)-th distinct incident within the sliding window, not at K,
  and a re-registered incident counts once; opens outside the window do not count;
- while tripped, repairs are refused and quarantines still admitted; after a human reset,
  repairs are admitted again and the burst that tripped it does not re-trip it;
- the minimum in-service fraction is never crossed, and a node left drained keeps counting;
- max_concurrent_repairs holds; admissions are idempotent per incident; stale releases
  change nothing;
- the recurrence count per node within the window, and opens pruned past the longest window;
- the breaker reports the InfiniBand leaf / pod its nodes share, and None otherwise;
- validators reject malformed requests without touching the state;
- a reset needs the API's proof of who resets: none is refused by the validator, a forged,
  expired or mismatched one (another person, another trip) by the worker's check, and the
  breaker stays tripped; a valid one resets it as the person it names;
- continue-as-new carries the state (forced with a small history), and a guard started
  from a pre-filled state acts on it;
- GuardActivities start the guard on first use (update-with-start) and reuse it, counting
  the cluster's nodes from Slurm;
- the operator's breaker client and `breaker` commands.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio import workflow
from temporalio.client import Client, WorkflowHandle, WorkflowHistory, WorkflowUpdateFailedError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Replayer, Worker
from typer.testing import CliRunner

from autoclusters.activities.guard import GuardActivities
from autoclusters.clients import breaker
from autoclusters.clients.cli.breaker import breaker_app
from autoclusters.core.decision_proof import LIFETIME_S, Decision, sign
from autoclusters.core.guard import (
    BREAKER_RESET_STEP,
    GUARD_ADMITTED_SIGNAL,
    Admission,
    AdmitCall,
    AdmitRequest,
    AdmittedNotice,
    BreakerStatus,
    GuardContext,
    GuardInput,
    GuardState,
    GuardStatus,
    IncidentOpened,
    OpenRecord,
    PolicyUpdate,
    RegisterCall,
    Registration,
    ReleaseCall,
    ReleaseRequest,
    ResetRequest,
    SlurmView,
    Waiter,
    guard_workflow_id,
    reset_subject,
)
from autoclusters.core.policy import GuardPolicy, NodeTopology
from autoclusters.workflows.fleet_guard import FleetGuard
from tests.decisions import (
    APPROVAL_KEY,
    FORGED_KEY,
    proof_checks,
    proven_reset,
    signed_reset,
)
from tests.fakes.systems import FakeSlurm
from tests.helpers import eventually, skip_time

# Virtual time: the guard runs forever, so every test also terminates the guards it started.
EXECUTION_TIMEOUT = timedelta(days=7)

Guard = WorkflowHandle[FleetGuard, None]


def _cluster() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


@workflow.defn(sandboxed=False)
class Waiting:
    """Stands in for an incident: keeps the guard's `guard_admitted` signals."""

    def __init__(self) -> None:
        self.notices: list[AdmittedNotice] = []

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)

    @workflow.signal(name=GUARD_ADMITTED_SIGNAL)
    def admitted(self, notice: AdmittedNotice) -> None:
        self.notices.append(notice)

    @workflow.query
    def told(self) -> list[AdmittedNotice]:
        return self.notices


@asynccontextmanager
async def _worker(
    env: WorkflowEnvironment, activities: list[Any] | None = None
) -> AsyncIterator[str]:
    """A worker hosting FleetGuard (and `Waiting` incidents) on its own task queue."""
    task_queue = f"tq-{uuid.uuid4()}"
    async with Worker(
        env.client,
        task_queue=task_queue,
        workflows=[FleetGuard, Waiting],
        activities=[*(activities or []), *proof_checks()],
    ):
        yield task_queue


async def _waiting(env: WorkflowEnvironment, g: Guard, name: str) -> str:
    """Start a stand-in incident on the guard's task queue; returns its workflow id."""
    wf_id = f"waiting-{name}-{uuid.uuid4().hex[:6]}"
    task_queue = (await g.describe()).task_queue
    await env.client.start_workflow(
        Waiting.run, id=wf_id, task_queue=task_queue, execution_timeout=EXECUTION_TIMEOUT
    )
    return wf_id


async def _told(env: WorkflowEnvironment, wf_id: str, count: int = 1) -> list[AdmittedNotice]:
    """The notices `wf_id` got, once it has `count` of them."""
    handle = env.client.get_workflow_handle_for(Waiting.run, wf_id)
    got = await eventually(
        lambda: _at_least(handle.query(Waiting.told), count), what=f"{count} notice(s) to {wf_id}"
    )
    return got


async def _at_least(
    notices: Awaitable[list[AdmittedNotice]], count: int
) -> list[AdmittedNotice] | None:
    got = await notices
    return got if len(got) >= count else None


@asynccontextmanager
async def _guard(
    env: WorkflowEnvironment,
    *,
    policy: GuardPolicy | None = None,
    topology: dict[str, NodeTopology] | None = None,
    state: GuardState | None = None,
    max_history_events: int | None = None,
    approvers: list[str] | None = None,
) -> AsyncIterator[Guard]:
    """Start a guard for a fresh cluster on its own worker; terminate it after the block.
    alice and bob are its approvers unless said otherwise."""
    inp = GuardInput(
        cluster=_cluster(),
        policy=policy or GuardPolicy(),
        topology=topology or {},
        state=state,
        max_history_events=max_history_events,
        approvers=["alice", "bob"] if approvers is None else approvers,
    )
    async with _worker(env) as task_queue:
        handle = await env.client.start_workflow(
            FleetGuard.run,
            inp,
            id=guard_workflow_id(inp.cluster),
            task_queue=task_queue,
            execution_timeout=EXECUTION_TIMEOUT,
        )
        try:
            yield handle
        finally:
            await handle.terminate("test over")


async def _register(
    g: Guard, node: str, incident_id: str | None = None, *, window_s: float = 86400
) -> Registration:
    return await g.execute_update(
        FleetGuard.register,
        IncidentOpened(
            node=node,
            incident_id=incident_id or f"INC-{node}-{uuid.uuid4().hex[:6]}",
            fault="XID_79",
            recurrence_window_s=window_s,
        ),
    )


async def _quarantine(
    g: Guard, node: str, incident_id: str, cluster_nodes: int = 8, wf: str | None = None
) -> Admission:
    return await g.execute_update(
        FleetGuard.admit_quarantine,
        AdmitRequest(
            node=node, incident_id=incident_id, cluster_nodes=cluster_nodes, workflow_id=wf
        ),
    )


async def _repair(
    g: Guard, node: str, incident_id: str, cluster_nodes: int = 8, wf: str | None = None
) -> Admission:
    return await g.execute_update(
        FleetGuard.admit_repair,
        AdmitRequest(
            node=node, incident_id=incident_id, cluster_nodes=cluster_nodes, workflow_id=wf
        ),
    )


async def _release(g: Guard, node: str, incident_id: str, *, back: bool) -> None:
    await g.execute_update(
        FleetGuard.release,
        ReleaseRequest(node=node, incident_id=incident_id, back_in_service=back),
    )


async def _status(g: Guard) -> GuardStatus:
    return await g.query(FleetGuard.status)


def _rejection(err: WorkflowUpdateFailedError) -> ApplicationError:
    assert isinstance(err.cause, ApplicationError), err.cause
    return err.cause


# --- the circuit breaker -----------------------------------------------------------------


async def test_breaker_trips_on_more_than_threshold_distinct_incidents(
    env: WorkflowEnvironment,
) -> None:
    async with _guard(env, policy=GuardPolicy(breaker_threshold=3)) as g:
        for i in range(1, 4):
            reg = await _register(g, f"gpu-0{i}", f"INC-{i}")
            assert not reg.breaker.tripped, f"tripped at {i} of threshold 3"
        # A retried registration is the same incident: still 3, still closed.
        again = await _register(g, "gpu-03", "INC-3")
        assert not again.breaker.tripped
        assert len((await _status(g)).state.opens) == 3

        fourth = await _register(g, "gpu-04", "INC-4")

        assert fourth.breaker.tripped
        assert fourth.breaker.tripped_at is not None
        assert fourth.breaker.nodes == ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]
        # No topology known: nothing shared.
        assert (fourth.breaker.shared_leaf, fourth.breaker.shared_pod) == (None, None)
        assert (await _status(g)).state.breaker == fourth.breaker
        # Incidents while tripped join the picture; the trip time stays.
        fifth = await _register(g, "gpu-05", "INC-5")
        assert fifth.breaker.nodes[-1] == "gpu-05"
        assert fifth.breaker.tripped_at == fourth.breaker.tripped_at


async def test_opens_outside_the_window_do_not_count(env: WorkflowEnvironment) -> None:
    async with _guard(env, policy=GuardPolicy(breaker_threshold=2, breaker_window_s=600)) as g:
        await _register(g, "gpu-01")
        await _register(g, "gpu-02")
        await env.sleep(timedelta(seconds=601))
        # Two old ones out of the window and two new ones in it: 2, not more than 2.
        await _register(g, "gpu-03")
        reg = await _register(g, "gpu-04")
        assert not reg.breaker.tripped

        reg = await _register(g, "gpu-05")

        assert reg.breaker.tripped
        assert reg.breaker.nodes == ["gpu-03", "gpu-04", "gpu-05"]


async def test_tripped_breaker_holds_repairs_not_quarantine_until_reset(
    env: WorkflowEnvironment,
) -> None:
    async with _guard(env, policy=GuardPolicy(breaker_threshold=1)) as g:
        await _register(g, "gpu-01", "INC-1")
        assert (await _register(g, "gpu-02", "INC-2")).breaker.tripped

        held = await _repair(g, "gpu-01", "INC-1")
        assert not held.admitted
        assert "circuit breaker tripped" in held.reason
        # A faulty node still leaves service while the breaker holds repairs.
        assert (await _quarantine(g, "gpu-01", "INC-1")).admitted
        assert (await _status(g)).state.repairing == {}

        reset = await g.execute_update(FleetGuard.reset_breaker, await proven_reset(g, "alice"))

        assert not reset.tripped
        assert reset.reset_by == "alice"
        assert reset.reset_at is not None
        assert reset.tripped_at is not None  # the record of the last trip stays
        assert (await _repair(g, "gpu-01", "INC-1")).admitted
        # The window restarted at the reset: the burst that tripped it does not count.
        assert not (await _register(g, "gpu-03", "INC-3")).breaker.tripped
        again = await _register(g, "gpu-04", "INC-4")
        assert again.breaker.tripped
        assert again.breaker.nodes == ["gpu-03", "gpu-04"]
        assert again.breaker.reset_by == "alice"


async def test_reset_is_refused_when_not_tripped_or_anonymous(env: WorkflowEnvironment) -> None:
    async with _guard(env, policy=GuardPolicy(breaker_threshold=1)) as g:
        with pytest.raises(WorkflowUpdateFailedError) as caught:
            await g.execute_update(FleetGuard.reset_breaker, await proven_reset(g, "alice"))
        assert _rejection(caught.value).type == "BreakerNotTripped"

        await _register(g, "gpu-01")
        await _register(g, "gpu-02")
        with pytest.raises(WorkflowUpdateFailedError) as caught:
            await g.execute_update(FleetGuard.reset_breaker, ResetRequest(by="  "))
        assert "by must not be empty" in _rejection(caught.value).message
        breaker_now = (await _status(g)).state.breaker
        assert breaker_now.tripped
        assert breaker_now.reset_by is None


async def test_a_non_approver_cannot_reset_the_breaker_an_approver_can(
    env: WorkflowEnvironment,
) -> None:
    async with _guard(env, policy=GuardPolicy(breaker_threshold=1), approvers=["alice"]) as g:
        await _register(g, "gpu-01")
        await _register(g, "gpu-02")

        with pytest.raises(WorkflowUpdateFailedError) as caught:
            await g.execute_update(FleetGuard.reset_breaker, await proven_reset(g, "mallory"))

        refused = _rejection(caught.value)
        assert refused.type == "NotAnApprover"
        assert "mallory is not an approver" in refused.message
        still = (await _status(g)).state.breaker
        assert still.tripped and still.reset_by is None
        assert not (await _repair(g, "gpu-01", "INC-1")).admitted

        proven = await proven_reset(g, "alice")
        reset = await g.execute_update(
            FleetGuard.reset_breaker, proven.model_copy(update={"by": " alice "})
        )

        assert not reset.tripped and reset.reset_by == "alice" and reset.reset_at is not None
        # The accepted reset is an update in the guard's history, with who asked.
        history = await g.fetch_history()
        resets = [
            e
            for e in history.events
            if e.HasField("workflow_execution_update_accepted_event_attributes")
            and e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
            == "reset_breaker"
        ]
        assert len(resets) == 1
        args = resets[0].workflow_execution_update_accepted_event_attributes.accepted_request
        assert b"alice" in args.input.args.payloads[0].data


async def test_a_reset_without_a_valid_proof_is_refused_at_the_guard(
    env: WorkflowEnvironment,
) -> None:
    """What `breaker reset --as alice` against Temporal did before: a name, nothing else."""
    async with _guard(env, policy=GuardPolicy(breaker_threshold=1), approvers=["alice"]) as g:
        await _register(g, "gpu-01")
        await _register(g, "gpu-02")
        st = await _status(g)
        cluster, trip = st.cluster, st.state.breaker.tripped_at
        assert trip is not None

        with pytest.raises(WorkflowUpdateFailedError) as caught:
            await g.execute_update(FleetGuard.reset_breaker, ResetRequest(by="alice"))
        assert _rejection(caught.value).type == "NoProof"
        assert "no proof of who resets" in _rejection(caught.value).message

        expired = signed_reset(cluster, trip, "alice").model_copy(
            update={"proof": _expired_proof(cluster, trip)}
        )
        cases = [
            (signed_reset(cluster, trip, "alice", key=FORGED_KEY), "not signed by our key"),
            (expired, "expired"),
            # Valid proofs, for something else than this reset.
            (signed_reset(cluster, trip, "bob").model_copy(update={"by": "alice"}),
             "bob's, not alice's"),
            (signed_reset(cluster, trip - timedelta(minutes=1), "alice"), "/trip-"),
            (signed_reset("another-cluster", trip, "alice"), "fleet-guard-another-cluster"),
        ]  # fmt: skip
        for bad, said in cases:
            with pytest.raises(WorkflowUpdateFailedError) as caught:
                await g.execute_update(FleetGuard.reset_breaker, bad)
            refused = _rejection(caught.value)
            assert refused.type == "DecisionRefused", refused
            assert said in refused.message and "reset refused" in refused.message
        still = (await _status(g)).state.breaker
        assert still.tripped and still.reset_by is None

        reset = await g.execute_update(
            FleetGuard.reset_breaker, signed_reset(cluster, trip, "alice", via="token:alice")
        )
        assert not reset.tripped and reset.reset_by == "alice"
        # The proof's check is in the history (a local activity's marker), and so is each
        # refusal after it (a failed update); the validator's refusals leave nothing.
        history = await g.fetch_history()
        markers = [e for e in history.events if e.HasField("marker_recorded_event_attributes")]
        assert len([m for m in markers if m.marker_recorded_event_attributes.marker_name
                    == "core_local_activity"]) == 1 + len(cases)  # fmt: skip
        failed = [
            e
            for e in history.events
            if e.HasField("workflow_execution_update_completed_event_attributes")
            and e.workflow_execution_update_completed_event_attributes.outcome.HasField("failure")
        ]
        assert len(failed) == len(cases)


def _expired_proof(cluster: str, trip: datetime) -> str:
    d = Decision(reset_subject(cluster, trip), BREAKER_RESET_STEP, "alice", True, "token:x")
    return sign(d, APPROVAL_KEY, now=datetime.now(UTC).timestamp() - LIFETIME_S - 120)


async def test_the_breaker_threshold_is_a_fraction_of_the_cluster_with_a_floor(
    env: WorkflowEnvironment,
) -> None:
    policy = GuardPolicy(breaker_threshold=2, breaker_threshold_fraction=0.1)
    async with _guard(env, policy=policy) as g:
        big = SlurmView(cluster_nodes=40)  # 10 % of 40: more than 4 opens trip it
        for i in range(1, 5):
            opened = IncidentOpened(
                node=f"gpu-{i:02d}", incident_id=f"INC-{i}", fault="XID_79", slurm=big
            )
            reg = await g.execute_update(FleetGuard.register, opened)
            assert not reg.breaker.tripped, f"tripped at {i} on a 40-node cluster"
        assert (await _status(g)).state.cluster_nodes == 40
        assert (await _register(g, "gpu-05")).breaker.tripped

    # A small cluster: the floor (2) holds, not 10 % of 4.
    async with _guard(env, policy=policy) as g:
        small = SlurmView(cluster_nodes=4)
        for i in range(1, 3):
            opened = IncidentOpened(
                node=f"gpu-{i:02d}", incident_id=f"INC-{i}", fault="XID_79", slurm=small
            )
            assert not (await g.execute_update(FleetGuard.register, opened)).breaker.tripped
        assert (await _register(g, "gpu-03")).breaker.tripped


def test_breaker_threshold_fraction_is_bounded() -> None:
    for bad in (-0.1, 1.5, float("inf"), float("nan")):
        with pytest.raises(ValueError):
            GuardPolicy(breaker_threshold_fraction=bad)
    assert GuardPolicy().breaker_limit(1000) == 50
    assert GuardPolicy().breaker_limit(4) == 5


async def test_the_guard_adopts_the_newest_policy(env: WorkflowEnvironment) -> None:
    async with _guard(env, policy=GuardPolicy(max_concurrent_repairs=1)) as g:
        assert (await _repair(g, "gpu-01", "INC-1")).admitted
        held = await _repair(g, "gpu-02", "INC-2")
        assert not held.admitted and held.queued

        newer = GuardPolicy(max_concurrent_repairs=2, breaker_threshold=7)
        opened = IncidentOpened(
            node="gpu-03",
            incident_id="INC-3",
            fault="XID_79",
            policy=newer,
            topology=TOPOLOGY,
            approvers=["carol"],
        )
        await g.execute_update(FleetGuard.register, opened)

        st = await _status(g)
        assert (st.policy, st.approvers) == (newer, ["carol"])
        # Two repairs allowed now: the waiter was served at once.
        assert st.state.repairing == {"gpu-01": "INC-1", "gpu-02": "INC-2"}
        assert st.state.queue == []
        # The old approvers are not the cluster's any more.
        await _register(g, "gpu-04")
        with pytest.raises(WorkflowUpdateFailedError):
            await g.execute_update(FleetGuard.reset_breaker, await proven_reset(g, "alice"))

        # An explicit update, for an operator.
        strict = GuardPolicy(max_concurrent_repairs=1)
        after = await g.execute_update(FleetGuard.update_policy, PolicyUpdate(policy=strict))
        assert after.policy == strict and after.approvers == ["carol"]


# --- the queue -----------------------------------------------------------------------------


async def test_waiters_are_admitted_in_arrival_order_and_told(env: WorkflowEnvironment) -> None:
    async with _guard(env, policy=GuardPolicy(max_concurrent_repairs=1)) as g:
        assert (await _repair(g, "gpu-01", "INC-1")).admitted
        waiters = {i: await _waiting(env, g, f"inc-{i}") for i in (2, 3, 4, 5)}
        answers = {}
        for i in (2, 3, 4, 5):
            answers[i] = await _repair(g, f"gpu-0{i}", f"INC-{i}", wf=waiters[i])
        assert [(a.admitted, a.queued, a.position) for a in answers.values()] == [
            (False, True, 1),
            (False, True, 2),
            (False, True, 3),
            (False, True, 4),
        ]
        assert "1 repairs already running (gpu-01)" in answers[2].reason
        assert "2 earlier incident(s) wait first" in answers[4].reason
        # Asking again while queued: the same place and ticket.
        again = await _repair(g, "gpu-03", "INC-3", wf=waiters[3])
        assert (again.position, again.ticket) == (2, answers[3].ticket)
        # A waiter cancelled (released) leaves the queue; the others move up.
        await _release(g, "gpu-04", "INC-4", back=True)
        assert (await _repair(g, "gpu-05", "INC-5", wf=waiters[5])).position == 3

        for done, nxt in ((1, 2), (2, 3), (3, 5)):
            await _release(g, f"gpu-0{done}", f"INC-{done}", back=True)
            told = await _told(env, waiters[nxt])
            assert told == [
                AdmittedNotice(kind="repair", incident_id=f"INC-{nxt}", ticket=answers[nxt].ticket)
            ]
            st = (await _status(g)).state
            assert st.repairing == {f"gpu-0{nxt}": f"INC-{nxt}"}
            # A later waiter never overtakes: the next one asking still waits its turn.
            assert (await _repair(g, f"gpu-0{nxt}", f"INC-{nxt}")).reason == "already repairing"
        assert (await _status(g)).state.queue == []
        for wf_id in waiters.values():
            await env.client.get_workflow_handle(wf_id).terminate("test over")
        assert (
            await env.client.get_workflow_handle_for(Waiting.run, waiters[4]).query(Waiting.told)
        ) == []


QUEUED_HISTORY = Path(__file__).parents[1] / "histories" / "fleet_guard_0.1_held_then_admitted.json"
SIGNALLED = "signal_external_workflow_execution_initiated_event_attributes"


async def test_guard_histories_replay(env: WorkflowEnvironment) -> None:
    """A recorded guard of the 0.1 baseline that held, queued and signalled an incident
    replays on the current code, and so does one that queues and signals now."""
    replayer = Replayer(workflows=[FleetGuard, Waiting], data_converter=pydantic_data_converter)
    recorded = WorkflowHistory.from_json("fleet-guard-0.1", QUEUED_HISTORY.read_text())
    result = await replayer.replay_workflow(recorded, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure
    signals = [e for e in recorded.events if e.WhichOneof("attributes") == SIGNALLED]
    assert signals, "the recorded guard told a queued incident it was admitted"

    async with _guard(env, policy=GuardPolicy(max_concurrent_repairs=1)) as g:
        assert (await _repair(g, "gpu-01", "INC-1")).admitted
        waiter = await _waiting(env, g, "inc-2")
        assert (await _repair(g, "gpu-02", "INC-2", wf=waiter)).queued
        await _release(g, "gpu-01", "INC-1", back=True)
        await _told(env, waiter)
        new = await g.fetch_history()
        await env.client.get_workflow_handle(waiter).terminate("test over")
    result = await replayer.replay_workflow(new, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure


async def test_a_quarantine_waiter_is_served_before_a_later_one(env: WorkflowEnvironment) -> None:
    # 8 nodes, 75 %: two out at most.
    async with _guard(env, policy=GuardPolicy(min_in_service_fraction=0.75)) as g:
        assert (await _quarantine(g, "gpu-01", "INC-1")).admitted
        assert (await _quarantine(g, "gpu-02", "INC-2")).admitted
        first = await _quarantine(g, "gpu-03", "INC-3")
        later = await _quarantine(g, "gpu-04", "INC-4")
        assert (first.position, later.position) == (1, 2)

        await _release(g, "gpu-01", "INC-1", back=True)

        st = (await _status(g)).state
        assert st.out_of_service == {"gpu-02": "INC-2", "gpu-03": "INC-3"}
        assert [w.incident_id for w in st.queue] == ["INC-4"]
        # INC-4 asking again is still second to nobody but capacity: still held.
        assert not (await _quarantine(g, "gpu-04", "INC-4")).admitted


async def test_the_count_recovers_once_a_human_resumes_a_node(env: WorkflowEnvironment) -> None:
    slurm = FakeSlurm()
    for i in range(1, 5):
        slurm.add_node(f"gpu-0{i}")
    # 4 nodes, 75 % in service: one out at a time.
    policy = GuardPolicy(min_in_service_fraction=0.75, reconcile_interval_s=300)
    ctx = GuardContext(cluster=_cluster(), policy=policy)
    handle = env.client.get_workflow_handle_for(FleetGuard.run, guard_workflow_id(ctx.cluster))
    run = ActivityEnvironment().run
    tq = f"tq-{uuid.uuid4()}"
    acts = GuardActivities(env.client, slurm, tq, execution_timeout=EXECUTION_TIMEOUT)
    async with Worker(
        env.client, task_queue=tq, workflows=[FleetGuard, Waiting], activities=[acts.slurm_view]
    ):
        try:
            one = AdmitCall(guard=ctx, node="gpu-01", incident_id="INC-1")
            assert (await run(acts.admit_quarantine, one)).admitted
            slurm.set_reason("gpu-01", "autoclusters: INC-1 XID_79")
            # The incident failed: gpu-01 is left drained for a human, and still counts.
            release = ReleaseRequest(node="gpu-01", incident_id="INC-1", back_in_service=False)
            await run(acts.release, ReleaseCall(guard=ctx, release=release))
            waiter = await _waiting(env, handle, "inc-2")
            two = AdmitCall(guard=ctx, node="gpu-02", incident_id="INC-2", workflow_id=waiter)
            held = await run(acts.admit_quarantine, two)
            assert not held.admitted and held.queued
            st = (await handle.query(FleetGuard.status)).state
            assert st.left_out == {"gpu-01": "INC-1"}

            # Nothing changes while Slurm still shows it drained.
            await env.sleep(timedelta(seconds=301))
            assert (await handle.query(FleetGuard.status)).state.out_of_service == {
                "gpu-01": "INC-1"
            }

            slurm.admin_resume("gpu-01")  # a human fixed it by hand
            await env.sleep(timedelta(seconds=301))  # the guard's own reconcile

            told = await _told(env, waiter)
            assert told[0].incident_id == "INC-2"
            st = (await handle.query(FleetGuard.status)).state
            assert st.out_of_service == {"gpu-02": "INC-2"}
            assert (st.left_out, st.queue) == ({}, [])
            assert st.reconciled_at is not None
        finally:
            await handle.terminate("test over")
            await env.client.get_workflow_handle(waiter).terminate("test over")


async def test_an_admission_brings_slurms_view_and_reconciles(env: WorkflowEnvironment) -> None:
    async with _guard(env, policy=GuardPolicy(min_in_service_fraction=0.75)) as g:
        assert (await _quarantine(g, "gpu-01", "INC-1", cluster_nodes=4)).admitted
        await _release(g, "gpu-01", "INC-1", back=False)
        view = AdmitRequest(
            node="gpu-02", incident_id="INC-2", cluster_nodes=4, out_of_service=["gpu-01"]
        )
        assert not (await g.execute_update(FleetGuard.admit_quarantine, view)).admitted
        # gpu-01 resumed by hand: the next ask sees it in service.
        view = view.model_copy(update={"out_of_service": []})
        assert (await g.execute_update(FleetGuard.admit_quarantine, view)).admitted
        assert (await _status(g)).state.out_of_service == {"gpu-02": "INC-2"}


# --- admissions --------------------------------------------------------------------------


async def test_min_in_service_fraction_is_never_crossed(env: WorkflowEnvironment) -> None:
    # 8 nodes, at least 75 % in service: at most 2 out at once.
    async with _guard(env, policy=GuardPolicy(min_in_service_fraction=0.75)) as g:
        assert (await _quarantine(g, "gpu-01", "INC-1")).admitted
        assert (await _quarantine(g, "gpu-02", "INC-2")).admitted

        refused = await _quarantine(g, "gpu-03", "INC-3")
        assert not refused.admitted
        assert "below the minimum 6" in refused.reason
        # The same incident asking again is admitted again, and costs nothing.
        assert (await _quarantine(g, "gpu-02", "INC-2")).admitted
        assert (await _status(g)).state.out_of_service == {"gpu-01": "INC-1", "gpu-02": "INC-2"}

        await _release(g, "gpu-01", "INC-1", back=True)
        assert (await _quarantine(g, "gpu-03", "INC-3")).admitted

        # Left drained for a human: still out, still counting.
        await _release(g, "gpu-02", "INC-2", back=False)
        assert not (await _quarantine(g, "gpu-04", "INC-4")).admitted
        st = (await _status(g)).state
        assert st.out_of_service == {"gpu-02": "INC-2", "gpu-03": "INC-3"}
        # A new incident on a node that is already out costs no capacity.
        assert (await _quarantine(g, "gpu-02", "INC-9")).admitted
        assert (await _status(g)).state.out_of_service["gpu-02"] == "INC-9"


async def test_max_concurrent_repairs_holds(env: WorkflowEnvironment) -> None:
    async with _guard(env, policy=GuardPolicy(max_concurrent_repairs=2)) as g:
        assert (await _repair(g, "gpu-01", "INC-1")).admitted
        assert (await _repair(g, "gpu-02", "INC-2")).admitted

        refused = await _repair(g, "gpu-03", "INC-3")
        assert not refused.admitted
        assert "2 repairs already running (gpu-01, gpu-02)" in refused.reason
        again = await _repair(g, "gpu-01", "INC-1")
        assert again.admitted and again.reason == "already repairing"

        # A release from an incident that no longer holds the node changes nothing.
        await _release(g, "gpu-01", "INC-OLD", back=True)
        assert not (await _repair(g, "gpu-03", "INC-3")).admitted

        await _release(g, "gpu-01", "INC-1", back=True)
        assert (await _repair(g, "gpu-03", "INC-3")).admitted
        assert (await _status(g)).state.repairing == {"gpu-02": "INC-2", "gpu-03": "INC-3"}


async def test_malformed_requests_are_rejected_without_a_trace(env: WorkflowEnvironment) -> None:
    async with _guard(env) as g:
        bad: list[tuple[Any, Any]] = [
            (FleetGuard.register, IncidentOpened(node="", incident_id="INC-1", fault="X")),
            (
                FleetGuard.register,
                IncidentOpened(
                    node="gpu-01", incident_id="INC-1", fault="X", recurrence_window_s=0
                ),
            ),
            (
                FleetGuard.admit_quarantine,
                AdmitRequest(node="gpu-01", incident_id=" ", cluster_nodes=8),
            ),
            (
                FleetGuard.admit_repair,
                AdmitRequest(node="gpu-01", incident_id="I", cluster_nodes=0),
            ),
            (FleetGuard.release, ReleaseRequest(node="", incident_id="I", back_in_service=True)),
        ]
        for update, arg in bad:
            with pytest.raises(WorkflowUpdateFailedError):
                await g.execute_update(update, arg)

        assert (await _status(g)).state == GuardState()


# --- recurrence and topology -------------------------------------------------------------


async def test_recurrence_counts_earlier_incidents_on_the_node_within_the_window(
    env: WorkflowEnvironment,
) -> None:
    async with _guard(env) as g:
        assert (await _register(g, "gpu-01", "INC-1")).recent_on_node == 0
        await skip_time(env, timedelta(hours=1))
        assert (await _register(g, "gpu-01", "INC-2")).recent_on_node == 1
        assert (await _register(g, "gpu-02", "INC-3")).recent_on_node == 0
        await skip_time(env, timedelta(minutes=90))
        # Now INC-1 is 2.5 h old and INC-2 1.5 h: a 2 h window sees only INC-2.
        assert (await _register(g, "gpu-01", "INC-4", window_s=7200)).recent_on_node == 1
        # A retried registration answers what it answered the first time.
        assert (await _register(g, "gpu-01", "INC-2")).recent_on_node == 1
        assert (await _register(g, "gpu-01", "INC-5")).recent_on_node == 3

        # Past the longest window (the default day), opens are pruned.
        await skip_time(env, timedelta(hours=25))
        assert (await _register(g, "gpu-01", "INC-6")).recent_on_node == 0
        assert [o.incident_id for o in (await _status(g)).state.opens] == ["INC-6"]


TOPOLOGY = {
    "gpu-01": NodeTopology(leaf="leaf-1", pod="pod-a"),
    "gpu-02": NodeTopology(leaf="leaf-1", pod="pod-a"),
    "gpu-03": NodeTopology(leaf="leaf-1", pod="pod-a"),
    "gpu-04": NodeTopology(leaf="leaf-2", pod="pod-a"),
    "gpu-05": NodeTopology(leaf="leaf-3", pod="pod-b"),
}


@pytest.mark.parametrize(
    ("nodes", "leaf", "pod"),
    [
        (["gpu-01", "gpu-02", "gpu-03"], "leaf-1", "pod-a"),
        (["gpu-01", "gpu-02", "gpu-04"], None, "pod-a"),
        (["gpu-01", "gpu-04", "gpu-05"], None, None),
        (["gpu-01", "gpu-02", "gpu-99"], None, None),  # gpu-99: topology unknown
    ],
)
async def test_breaker_reports_the_leaf_or_pod_its_nodes_share(
    env: WorkflowEnvironment, nodes: list[str], leaf: str | None, pod: str | None
) -> None:
    async with _guard(env, policy=GuardPolicy(breaker_threshold=2), topology=TOPOLOGY) as g:
        for node in nodes:
            reg = await _register(g, node)

    assert reg.breaker.tripped
    assert reg.breaker.nodes == nodes
    assert (reg.breaker.shared_leaf, reg.breaker.shared_pod) == (leaf, pod)


# --- continue-as-new ---------------------------------------------------------------------


async def test_continue_as_new_keeps_the_state(env: WorkflowEnvironment) -> None:
    policy = GuardPolicy(breaker_threshold=3, max_concurrent_repairs=1)
    async with _guard(env, policy=policy, topology=TOPOLOGY, max_history_events=30) as g:
        first_run = (await g.describe()).run_id
        assert (await _quarantine(g, "gpu-01", "INC-1")).admitted
        assert (await _repair(g, "gpu-01", "INC-1")).admitted
        await _register(g, "gpu-01", "INC-1")
        for i in range(2, 5):
            await _register(g, f"gpu-0{i}", f"INC-{i}")
        before = await _status(g)
        assert before.state.breaker.tripped
        # Enough updates to cross the small history limit more than once.
        for _ in range(20):
            assert (await _register(g, "gpu-02", "INC-2")).recent_on_node == 0

        after = await _status(g)
        assert (await g.describe()).run_id != first_run
        assert after.state.continued_as_new >= 1
        assert after.policy == policy
        assert after.state.model_dump(exclude={"continued_as_new"}) == before.state.model_dump(
            exclude={"continued_as_new"}
        )
        # The carried state still governs: repair slot taken, breaker tripped, idempotency.
        assert (await _repair(g, "gpu-01", "INC-1")).admitted
        assert not (await _repair(g, "gpu-02", "INC-2")).admitted
        assert (await _register(g, "gpu-05", "INC-5")).breaker.shared_leaf is None


async def test_guard_started_from_carried_state_acts_on_it(env: WorkflowEnvironment) -> None:
    at = datetime(2026, 1, 5, 3, 0, tzinfo=UTC)
    carried = GuardState(
        opens=[OpenRecord(node="gpu-01", incident_id="INC-1", fault="XID_79", at=at)],
        out_of_service={"gpu-01": "INC-1", "gpu-02": "INC-2"},
        repairing={"gpu-02": "INC-2"},
        breaker=BreakerStatus(tripped=True, tripped_at=at, nodes=["gpu-01", "gpu-02"]),
        continued_as_new=4,
    )
    async with _guard(env, state=carried) as g:
        st = await _status(g)
        assert st.state == carried
        assert not (await _repair(g, "gpu-03", "INC-3")).admitted
        assert not (await _quarantine(g, "gpu-03", "INC-3")).admitted  # 6 of 8 left
        assert (await _repair(g, "gpu-02", "INC-2")).admitted  # idempotent, even tripped


# --- the activities ----------------------------------------------------------------------


async def test_guard_activities_start_the_guard_on_first_use_and_reuse_it(
    env: WorkflowEnvironment,
) -> None:
    slurm = FakeSlurm()
    for i in range(1, 5):
        slurm.add_node(f"gpu-0{i}")
    ctx = GuardContext(
        cluster=_cluster(),
        policy=GuardPolicy(min_in_service_fraction=0.75, breaker_threshold=10),
        topology=TOPOLOGY,
    )
    handle = env.client.get_workflow_handle_for(FleetGuard.run, guard_workflow_id(ctx.cluster))
    async with _worker(env) as task_queue:
        acts = GuardActivities(env.client, slurm, task_queue, execution_timeout=EXECUTION_TIMEOUT)
        run = ActivityEnvironment().run
        try:
            opened = IncidentOpened(node="gpu-01", incident_id="INC-1", fault="XID_79")
            reg = await run(acts.register, RegisterCall(guard=ctx, incident=opened))
            assert reg.recent_on_node == 0
            first = await handle.describe()

            # 4 nodes in Slurm, 75 % in service: one out at a time.
            call = AdmitCall(guard=ctx, node="gpu-01", incident_id="INC-1")
            assert (await run(acts.admit_quarantine, call)).admitted
            other = AdmitCall(guard=ctx, node="gpu-02", incident_id="INC-2")
            refused = await run(acts.admit_quarantine, other)
            assert not refused.admitted
            assert "1 of 4 nodes" in refused.reason
            assert (refused.queued, refused.position) == (True, 1)
            assert (await run(acts.admit_repair, call)).admitted
            release = ReleaseRequest(node="gpu-01", incident_id="INC-1", back_in_service=True)
            await run(acts.release, ReleaseCall(guard=ctx, release=release))

            # One guard all along: the same run; gpu-01's place went to the queued gpu-02.
            assert (await handle.describe()).run_id == first.run_id
            st = await handle.query(FleetGuard.status)
            assert st.policy == ctx.policy
            assert (st.state.out_of_service, st.state.repairing) == ({"gpu-02": "INC-2"}, {})
            assert st.state.queue == []
            assert [o.incident_id for o in st.state.opens] == ["INC-1"]
            assert st.state.cluster_nodes == 4
            # The registration and each admission brought Slurm's view.
            assert slurm.calls["nodes"] == 4

            # A malformed request is refused for good, not retried.
            bad = AdmitCall(guard=ctx, node="", incident_id="INC-3")
            with pytest.raises(ApplicationError) as caught:
                await run(acts.admit_repair, bad)
            assert caught.value.type == "GuardRejected"
            assert caught.value.non_retryable
        finally:
            await handle.terminate("test over")


# --- the operator's side -----------------------------------------------------------------


async def test_breaker_client_reads_and_resets_the_guard(env: WorkflowEnvironment) -> None:
    client: Client = env.client
    with pytest.raises(breaker.GuardNotStarted):
        await breaker.breaker_status(client, _cluster())
    as_api = {"key": APPROVAL_KEY, "via": "token:tests"}
    with pytest.raises(breaker.GuardNotStarted):
        await breaker.reset_breaker(client, _cluster(), "alice", **as_api)

    async with _guard(env, policy=GuardPolicy(breaker_threshold=1)) as g:
        cluster = (await _status(g)).cluster
        with pytest.raises(breaker.BreakerNotTripped):
            await breaker.reset_breaker(client, cluster, "alice", **as_api)
        await _register(g, "gpu-01")
        await _register(g, "gpu-02")
        assert (await breaker.breaker_status(client, cluster)).state.breaker.tripped
        with pytest.raises(breaker.NotAnApprover, match="mallory is not an approver"):
            await breaker.reset_breaker(client, cluster, "mallory", **as_api)
        with pytest.raises(breaker.GuardError, match="reset refused: .*not signed by our key"):
            await breaker.reset_breaker(client, cluster, "alice", key=FORGED_KEY, via="x")
        with pytest.raises(breaker.GuardError, match="reset refused: no proof"):
            await breaker.send_reset(client, cluster, ResetRequest(by="alice"))
        assert (await breaker.breaker_status(client, cluster)).state.breaker.tripped

        reset = await breaker.reset_breaker(client, cluster, "alice", **as_api)

        assert not reset.tripped and reset.reset_by == "alice"
        assert not (await breaker.breaker_status(client, cluster)).state.breaker.tripped


def _fake_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    async def connect(settings: Any) -> Any:
        return object()

    monkeypatch.setattr("autoclusters.integrations.temporal.connect", connect)


def _fake_api(
    monkeypatch: pytest.MonkeyPatch, status: int, answer: dict[str, Any]
) -> list[dict[str, Any]]:
    """`breaker reset` posts to the API (clients/cli/decisions.py): what it sent, answered
    with `status` and `answer`."""
    sent: list[dict[str, Any]] = []

    def post(url: str, *, json: Any, headers: dict[str, str], timeout: float) -> httpx.Response:
        sent.append({"url": url, "json": json, "headers": headers})
        return httpx.Response(status, json=answer, request=httpx.Request("POST", url))

    monkeypatch.setattr("autoclusters.clients.cli.decisions.httpx.post", post)
    monkeypatch.setenv("AUTOCLUSTERS_API_URL", "http://api.test")
    monkeypatch.setenv("AUTOCLUSTERS_API_TOKEN", "bobs-own-token-012345678")
    return sent


def test_breaker_cli_status_json_and_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_connect(monkeypatch)
    monkeypatch.setenv("AUTOCLUSTERS_CLUSTER", "c1")
    tripped = GuardStatus(
        cluster="c1",
        policy=GuardPolicy(),
        state=GuardState(
            breaker=BreakerStatus(
                tripped=True, nodes=["gpu-01"], tripped_at=datetime(2026, 1, 5, tzinfo=UTC)
            )
        ),
    )
    asked: list[tuple[str, str]] = []

    async def status(client: Any, cluster: str) -> GuardStatus:
        asked.append(("status", cluster))
        return tripped

    monkeypatch.setattr(breaker, "breaker_status", status)
    done = BreakerStatus(reset_by="bob", reset_at=datetime(2026, 1, 5, tzinfo=UTC))
    sent = _fake_api(monkeypatch, 200, done.model_dump(mode="json"))
    runner = CliRunner()

    out = runner.invoke(breaker_app, ["status", "--json"])
    assert out.exit_code == 0, out.output
    assert GuardStatus.model_validate_json(out.stdout) == tripped
    assert "autoclusters breaker reset" in runner.invoke(breaker_app, ["status"]).stdout

    # The person is the token's: the CLI names nobody, the API says who reset it.
    out = runner.invoke(breaker_app, ["reset", "--cluster", "c2"])
    assert out.exit_code == 0, out.output
    assert "breaker of c2 reset by bob" in out.stdout
    assert asked == [("status", "c1"), ("status", "c1")]
    assert sent == [
        {
            "url": "http://api.test/v1/breaker/reset",
            "json": {"cluster": "c2"},
            "headers": {"Authorization": "Bearer bobs-own-token-012345678"},
        }
    ]

    # --as named anyone: gone, with a word on why.
    out = runner.invoke(breaker_app, ["reset", "--as", "alice"])
    assert out.exit_code == 2
    assert "--as is gone" in out.output and len(sent) == 1


def test_breaker_cli_says_when_there_is_no_guard_or_nothing_to_reset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_connect(monkeypatch)

    async def not_started(client: Any, cluster: str) -> GuardStatus:
        raise breaker.GuardNotStarted(f"the fleet guard of cluster {cluster} is not running")

    monkeypatch.setattr(breaker, "breaker_status", not_started)
    runner = CliRunner()

    out = runner.invoke(breaker_app, ["status", "--cluster", "c9"])
    assert out.exit_code == 1
    assert "cluster c9 is not running" in out.output

    said = {"error": "not tripped", "detail": "the circuit breaker of c9 is not tripped"}
    _fake_api(monkeypatch, 409, said)
    out = runner.invoke(breaker_app, ["reset", "--cluster", "c9"])
    assert out.exit_code == 0
    assert "not tripped; nothing to reset" in out.output

    said = {"error": "no fleet guard", "detail": "the fleet guard of cluster c9 is not running"}
    _fake_api(monkeypatch, 404, said)
    out = runner.invoke(breaker_app, ["reset", "--cluster", "c9"])
    assert out.exit_code == 1
    assert "cluster c9 is not running" in out.output


def test_breaker_cli_refuses_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_connect(monkeypatch)
    said = {
        "error": "reset refused",
        "detail": "reset refused: mallory is not an approver of cluster c9; the breaker "
        "stays as it is",
    }
    _fake_api(monkeypatch, 409, said)

    out = CliRunner().invoke(breaker_app, ["reset", "--cluster", "c9"])

    assert out.exit_code == 1
    assert out.output.strip().splitlines() == [
        "409: reset refused: mallory is not an approver of cluster c9; the breaker stays as it is"
    ]
    # A reader's token (or none) is the settings' fault: exit 2.
    _fake_api(monkeypatch, 403, {"error": "forbidden", "detail": "a reader token may not"})
    assert CliRunner().invoke(breaker_app, ["reset"]).exit_code == 2
    monkeypatch.delenv("AUTOCLUSTERS_API_TOKEN")
    out = CliRunner().invoke(breaker_app, ["reset"])
    assert out.exit_code == 2 and "AUTOCLUSTERS_API_TOKEN" in out.output


def test_breaker_cli_status_shows_the_threshold_approvers_and_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_connect(monkeypatch)
    at = datetime(2026, 1, 5, 3, 0, tzinfo=UTC)
    st = GuardStatus(
        cluster="c1",
        policy=GuardPolicy(breaker_threshold=5, breaker_threshold_fraction=0.05),
        approvers=["alice", "bob"],
        state=GuardState(
            cluster_nodes=200,
            queue=[
                Waiter(
                    kind="repair",
                    node="gpu-07",
                    incident_id="INC-7",
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
    assert "trips on more than 10 incidents" in text  # 5 % of 200, above the floor of 5
    assert "approvers (may reset): alice, bob" in text
    assert "waiting for repair: gpu-07 (INC-7)" in text
