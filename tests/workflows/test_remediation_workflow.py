"""NodeRemediation (runbook v2) on the time-skipping test server, against in-memory Slurm,
cloud and health gate, with the real FleetGuard on the same worker.

Aspects covered:
- a full incident runs the runbook's steps in order, drains with our reason, requeues the
  node's jobs once and releases their hold, repairs on the fault's rung, passes the health
  gate, returns the node, and answers `status` mid-flight;
- observe mode touches nothing and lists its plan; a monitor-only fault never drains;
- approve mode waits for a human: approve, reject, a reminder then leave drained or proceed
  on timeout; validators refuse unknown approvers, the wrong step and a second decision;
- duplicate alerts (update-with-start) join the one open incident: one drain, faults merged
  with counts, and a more severe fault raises the rung while the incident waits;
- a recurrence on the node escalates the next incident; a failed health gate escalates one
  rung, and an incident that never passes fails loudly with the node left drained;
- the fleet guard's breaker holds repairs until a human resets it, and the minimum
  in-service fraction holds the second quarantine until the first node is back;
- a failed repair, a retried requeue, a foreign drain, an unknown node, and jobs that
  cannot be requeued (force, or leave the node drained).

Activities run in real time (only workflow timers skip): waits are kept small, except the
2 s a node must answer in a row after a reboot or replacement (`wait_node_registered`).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio
from temporalio import activity
from temporalio.client import (
    WithStartWorkflowOperation,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ActivityError, ApplicationError, RetryState
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Worker

from autoclusters.activities.guard import GuardActivities
from autoclusters.activities.slurm import SlurmActivities
from autoclusters.core.guard import GuardStatus, guard_workflow_id
from autoclusters.core.models import (
    SPARE_REASON,
    ApprovalRequest,
    DrainInput,
    FaultAck,
    FaultReport,
    IncidentRequest,
    IncidentState,
    Notification,
    RefusedApproval,
    RequeueInput,
    ReturnInput,
    drain_reason,
    workflow_id,
)
from autoclusters.core.policy import FaultRule, GuardPolicy, Policy, Rung, StepPolicy
from autoclusters.core.sharing import LENT_REASON, Pool, YieldCall, YieldResult
from autoclusters.integrations import temporal
from autoclusters.workers.remediation import WORKFLOWS, activities_for
from autoclusters.workflows.fleet_guard import FleetGuard
from autoclusters.workflows.guard_steps import held_drain_reason
from autoclusters.workflows.remediation import NodeRemediation
from autoclusters.workflows.steps import STEP_RETRY as RETRY
from tests.decisions import APPROVAL_KEY, proven, proven_reset
from tests.fakes.systems import FakeCloud, FakeHealth, FakeSlurm, RecordingNotifier
from tests.helpers import run_state, skip_time, time_skipping_env


@pytest_asyncio.fixture
async def env() -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping server per test, not per module: a CI run (serial, after the sandbox
    modules) saw `env.sleep` (unlock_time_skipping_with_sleep) time out in four tests after
    earlier ones had passed on the module's shared server, while the module alone passes;
    a fresh server keeps whatever one test leaves behind from locking time for the next."""
    async with await time_skipping_env() as environment:  # shut down on the way out
        yield environment


# Virtual time under the test server: a workflow stuck on a bug fails instead of hanging.
EXECUTION_TIMEOUT = timedelta(days=1)
RUNBOOK = [
    "guard_register",
    "notify_opened",
    "admit_quarantine",
    "drain",
    "requeue",
    "silence",
    "wait_idle",
    "admit_repair",
    "repair",
    "wait_registered",
    "health_gate",
    "return_to_service",
    "notify_resolved",
]
# Approve mode: the decision comes after the node is quarantined and idle.
APPROVED_RUNBOOK = [*RUNBOOK[:7], "approval", "notify_approval_needed", *RUNBOOK[7:]]
APPROVAL_TIMEOUT_S = 600

# The policy every test starts from: explicit, so no test depends on the shipped file.
FAULTS = {
    "XID_79": FaultRule(severity="critical", first_rung=Rung.REBOOT),
    "XID_48": FaultRule(severity="critical", first_rung=Rung.REBOOT),
    "XID_61": FaultRule(severity="critical", first_rung=Rung.REPLACE),
    "XID_46": FaultRule(severity="critical", first_rung=Rung.RESET_GPU),
    "XID_13": FaultRule(severity="warning", first_rung=Rung.MONITOR),
}
# Activities wait in real time: a tiny idle timeout (jobs are requeued first anyway).
STEPS = {r: StepPolicy(idle_timeout_s=0.5) for r in (Rung.RESET_GPU, Rung.REBOOT, Rung.REPLACE)}


def _policy(**changes: Any) -> Policy:
    fields: dict[str, Any] = {
        "mode": "auto",
        "approvers": ["alice", "bob"],
        "approval_timeout_s": APPROVAL_TIMEOUT_S,
        "faults": FAULTS,
        "steps": STEPS,
        "guard": GuardPolicy(min_in_service_fraction=0.5, breaker_threshold=10),
    }
    return Policy(**{**fields, **changes})


Incident = WorkflowHandle[NodeRemediation, IncidentState]


# --- a fake cluster with a worker ----------------------------------------------------------


@dataclass
class Fleet:
    """One fake cluster (its own name, so its own fleet guard) and a worker for it."""

    env: WorkflowEnvironment
    cluster: str
    task_queue: str
    slurm: FakeSlurm
    cloud: FakeCloud
    health: FakeHealth
    notifier: RecordingNotifier
    started: list[str] = field(default_factory=list)

    def request(
        self,
        node: str = "gpu-01",
        fault: str = "XID_79",
        *,
        policy: Policy | None = None,
        incident_id: str | None = None,
    ) -> IncidentRequest:
        return IncidentRequest(
            incident_id=incident_id or f"INC-{uuid.uuid4().hex[:8]}",
            cluster=self.cluster,
            node=node,
            fault=fault,
            opened_at=datetime(2026, 1, 5, 3, 0, tzinfo=UTC),
            policy=policy or _policy(),
        )

    async def start(
        self, req: IncidentRequest, execution_timeout: timedelta = EXECUTION_TIMEOUT
    ) -> Incident:
        self.started.append(workflow_id(req.cluster, req.node))
        return await self.env.client.start_workflow(
            NodeRemediation.run,
            req,
            id=workflow_id(req.cluster, req.node),
            task_queue=self.task_queue,
            execution_timeout=execution_timeout,
        )

    def with_start(self, req: IncidentRequest) -> WithStartWorkflowOperation[Any, Any]:
        self.started.append(workflow_id(req.cluster, req.node))
        return WithStartWorkflowOperation(
            NodeRemediation.run,
            req,
            id=workflow_id(req.cluster, req.node),
            task_queue=self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            execution_timeout=EXECUTION_TIMEOUT,
        )

    @property
    def guard(self) -> WorkflowHandle[FleetGuard, None]:
        return self.env.client.get_workflow_handle_for(
            FleetGuard.run, guard_workflow_id(self.cluster)
        )

    async def guard_status(self) -> GuardStatus:
        return await self.guard.query(FleetGuard.status)

    def notes(self, node: str = "gpu-01") -> list[Notification]:
        return [n for n in self.notifier.notes if n.node == node]

    def events(self, node: str = "gpu-01") -> list[str]:
        return [n.event for n in self.notes(node)]


def _add_nodes(slurm: FakeSlurm, count: int) -> None:
    """gpu-01 runs job 101 (spanning gpu-03 too); gpu-02 runs job 102."""
    for i in range(1, count + 1):
        slurm.add_node(f"gpu-{i:02d}")
    slurm.add_job(101, nodes="gpu-[01,03]")
    slurm.add_job(102, nodes="gpu-02")


@asynccontextmanager
async def _fleet(
    env: WorkflowEnvironment,
    *,
    nodes: int = 3,
    cloud: Callable[[FakeSlurm], FakeCloud] = FakeCloud,
    fixed_by: Rung | None = Rung.RESET_GPU,
    extra_activities: Sequence[Callable[..., Any]] = (),
    approval_keys: Sequence[str] = (APPROVAL_KEY,),
    **slurm_knobs: bool,
) -> AsyncIterator[Fleet]:
    """A fresh cluster on its own worker and task queue; the worker lives for the block, and
    what the block started (incidents, the cluster's guard) is terminated after it."""
    slurm = FakeSlurm(**slurm_knobs)
    _add_nodes(slurm, nodes)
    fake_cloud = cloud(slurm)
    f = Fleet(
        env=env,
        cluster=f"test-{uuid.uuid4().hex[:8]}",
        task_queue=f"tq-{uuid.uuid4()}",
        slurm=slurm,
        cloud=fake_cloud,
        health=FakeHealth(fake_cloud, fixed_by=fixed_by),
        notifier=RecordingNotifier(),
    )
    # No execution timeout on the guard: it is a timer the test server skips to the moment
    # nothing else runs (between one incident's result and the next start, under load),
    # and a guard that timed out comes back empty, its recurrence count forgotten.
    guard_acts = GuardActivities(env.client, slurm, f.task_queue)
    async with Worker(
        env.client,
        task_queue=f.task_queue,
        workflows=WORKFLOWS,
        activities=[
            *activities_for(
                slurm,
                fake_cloud,
                f.health,
                guard_acts,
                [f.notifier],
                approval_keys=approval_keys,
            ),  # fmt: skip
            *extra_activities,
        ],
    ):
        try:
            yield f
        finally:
            fake_cloud.release.set()  # never leave a held repair behind
            for wf_id in [*dict.fromkeys(f.started), guard_workflow_id(f.cluster)]:
                try:
                    await env.client.get_workflow_handle(wf_id).terminate(reason="test over")
                except RPCError:
                    pass  # finished already, or never started


async def _until(
    handle: Incident, check: Callable[[IncidentState], bool], what: str, timeout_s: float = 30
) -> IncidentState:
    """Read the incident until `check` holds (real time: no timer is skipped meanwhile).
    A query that failed (tests/helpers.py `run_state`) is made again; one that keeps
    failing is reported."""
    deadline = time.monotonic() + timeout_s
    failed: WorkflowQueryFailedError | None = None
    while True:
        try:
            state: IncidentState | None = await run_state(handle, NodeRemediation.status)
        except WorkflowQueryFailedError as e:
            state, failed = None, e
        if state is not None and check(state):
            return state
        if time.monotonic() > deadline:
            if state is None:
                raise AssertionError(f"timed out after {timeout_s}s waiting for {what}: {failed}")
            raise AssertionError(
                f"timed out after {timeout_s}s waiting for {what}: status {state.status}, "
                f"step {state.current_step}, waiting for {state.waiting_for}, "
                f"steps {[s.name for s in state.steps]}"
            )
        await asyncio.sleep(0.1)


async def _until_true(check: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.1)


def _waiting(kind: str, step: str | None = None) -> Callable[[IncidentState], bool]:
    def check(s: IncidentState) -> bool:
        w = s.waiting_for
        return w is not None and w.kind == kind and (step is None or w.step == step)

    return check


def _chain(err: BaseException) -> list[BaseException]:
    """`err` and its `.cause`s, outermost first (a Temporal failure nests its causes)."""
    out: list[BaseException] = []
    seen: BaseException | None = err
    while seen is not None:
        out.append(seen)
        seen = getattr(seen, "cause", None)
    return out


def _app_error(err: BaseException, type_: str) -> ApplicationError:
    found = [e for e in _chain(err) if isinstance(e, ApplicationError) and e.type == type_]
    assert found, f"no ApplicationError of type {type_} in {_chain(err)!r}"
    return found[0]


def _our_reason(req: IncidentRequest) -> str:
    return f"autoclusters: {req.incident_id} {req.fault}"


async def _approve(
    handle: Incident, step: str, approver: str = "alice", *, reject: bool = False
) -> None:
    update = NodeRemediation.reject if reject else NodeRemediation.approve
    req = await proven(handle, step, approver, approve=not reject)
    rec = await handle.execute_update(update, req)
    assert (rec.step, rec.approver, rec.approved) == (step, approver, not reject)


async def _refused(handle: Incident, req: ApprovalRequest, *, reject: bool = False) -> str:
    """The validator refuses the decision: the client sees WorkflowUpdateFailedError."""
    update = NodeRemediation.reject if reject else NodeRemediation.approve
    with pytest.raises(WorkflowUpdateFailedError) as caught:
        await handle.execute_update(update, req)
    return str(caught.value.cause)


# --- the runbook ---------------------------------------------------------------------------


async def test_incident_resolves_in_runbook_order(env: WorkflowEnvironment) -> None:
    async with _fleet(env, cloud=lambda s: FakeCloud(s, hold=True)) as f:
        req = f.request()
        handle = await f.start(req)
        await asyncio.wait_for(f.cloud.started.wait(), timeout=30)
        # Mid-repair: the node is out of service under our reason, the job already elsewhere.
        during = await handle.query(NodeRemediation.status)
        assert (during.status, during.current_step) == ("open", "repair")
        assert (during.rung, during.mode) == ("reboot", "auto")
        assert [s.name for s in during.steps] == RUNBOOK[:9]
        assert during.requeued_jobs == [101]
        assert during.waiting_for is None
        node = f.slurm.node_now("gpu-01")
        assert node.drained and node.reason == _our_reason(req)
        guard = (await f.guard_status()).state
        assert guard.out_of_service == {"gpu-01": req.incident_id}
        assert guard.repairing == {"gpu-01": req.incident_id}

        f.cloud.release.set()
        result = await handle.result()
        after = await handle.query(NodeRemediation.status)
        guard = (await f.guard_status()).state
        described = await handle.describe()

    assert result.status == "resolved"
    assert [s.name for s in result.steps] == RUNBOOK
    assert all(s.outcome == "ok" for s in result.steps), result.steps
    assert (result.rung, result.mode, result.repair_attempts) == ("reboot", "auto", 1)
    assert [h.passed for h in result.health] == [True]
    assert result.current_step is None and result.waiting_for is None
    assert result.closed_at is not None and result.error is None
    assert result.requeued_jobs == [101] and result.recovery_path == {101: "requeue"}
    assert (result.old_vm_id, result.new_vm_id) == ("vm-0001", "vm-0001")  # a reboot
    assert [(x.fault, x.count) for x in result.faults] == [("XID_79", 1)]
    assert after == result
    # The search attributes follow the state (read from the execution, not visibility).
    assert described.typed_search_attributes.get(temporal.INCIDENT_STATUS) == "resolved"
    assert described.typed_search_attributes.get(temporal.REPAIR_ACTION) == "reboot"

    node = f.slurm.node_now("gpu-01")
    assert not node.drained
    assert node.reason == ""
    assert node.display_state == "IDLE"
    # The side effects happened in runbook order, each once.
    assert f.slurm.log == [
        ("drain", "gpu-01"),
        ("requeue", "101"),
        ("release_hold", "101"),
        ("cloud.reboot", "gpu-01"),
        ("registered", "gpu-01"),
        ("resume", "gpu-01"),
    ]
    assert f.slurm.requeue_count == {101: 1}
    assert f.slurm.release_count == {101: 1}
    job = f.slurm.job_now(101)
    assert (job.job_state, job.state_reason, job.restart_cnt) == ("PENDING", "None", 1)
    assert f.slurm.job_now(102).job_state == "RUNNING"
    assert f.cloud.repair_calls == [("gpu-01", Rung.REBOOT, f"{req.incident_id}:1:reboot")]
    assert f.health.checks == ["gpu-01"]
    assert f.events() == ["opened", "resolved"]
    assert f.notes()[0].severity == "critical"  # XID_79 is critical in the policy
    assert all(n.incident_id == req.incident_id for n in f.notifier.notes)
    # The guard let go of the node.
    assert (guard.out_of_service, guard.repairing) == ({}, {})
    assert [o.incident_id for o in guard.opens] == [req.incident_id]


async def test_a_degraded_fault_has_the_jobs_checkpoint_before_their_requeue(
    env: WorkflowEnvironment,
) -> None:
    """on_degraded: checkpoint_then_drain: drain, then the job is asked to checkpoint and
    requeues itself (its one requeue for the fault), and the requeue step only releases its
    hold; a fatal fault's incident has no such step (test_incident_resolves_in_runbook_order)."""
    degraded = {"ROW_REMAP_PENDING": FaultRule(
        severity="warning", first_rung=Rung.RESET_GPU, on_degraded="checkpoint_then_drain"
    )}  # fmt: skip
    async with _fleet(env) as f:
        f.slurm.checkpointing.add(101)
        req = f.request(fault="ROW_REMAP_PENDING", policy=_policy(faults={**FAULTS, **degraded}))
        result = await (await f.start(req)).result()

    assert result.status == "resolved", result.error
    names = [s.name for s in result.steps]
    assert names[names.index("drain") : names.index("wait_idle")] == [
        "drain", "checkpoint", "requeue", "silence"
    ]  # fmt: skip
    checkpoint = result.step("checkpoint")
    assert checkpoint is not None and checkpoint.outcome == "ok"
    assert "checkpointed [101]" in checkpoint.detail
    assert result.checkpointed_jobs == [101] and result.requeued_jobs == [101]
    # One signal, no requeue by us, one restart: the job's own requeue was the fault's one.
    assert f.slurm.signals == {101: 1}
    assert f.slurm.requeue_count[101] == 0
    job = f.slurm.job_now(101)
    assert (job.job_state, job.state_reason, job.restart_cnt) == ("PENDING", "None", 1)
    assert f.slurm.release_count == {101: 1}
    assert f.slurm.log[:3] == [("drain", "gpu-01"), ("signal USR1", "101"), ("release_hold", "101")]


@pytest.mark.parametrize("job_recovery", ["in-job", "requeue"])
async def test_a_job_with_a_hot_spare_goes_on_without_a_requeue(
    env: WorkflowEnvironment, job_recovery: str
) -> None:
    """A job announcing a spare (`injob=`) loses the node inside the requeue step and goes
    on; the incident records the path each job took. With job_recovery: requeue, it is
    requeued as any job."""
    async with _fleet(env) as f:
        # Its batch script runs on gpu-03 (Slurm never releases a job's batch host).
        f.slurm.add_job(
            101, nodes="gpu-[01,03]", comment="injob=/dev/shm/job-101", batch_host="gpu-03"
        )
        f.slurm.in_job_recovering.add(101)
        req = f.request(policy=_policy(job_recovery=job_recovery))
        result = await (await f.start(req)).result()

    assert result.status == "resolved", result.error
    assert [s.name for s in result.steps] == RUNBOOK  # the same steps either way
    job = f.slurm.job_now(101)
    if job_recovery == "in-job":
        assert result.recovery_path == {101: "in-job"} and result.requeued_jobs == []
        assert (job.job_state, job.restart_cnt, job.nodes) == ("RUNNING", 0, "gpu-03")
        assert f.slurm.requeue_count[101] == 0
        step = result.step("requeue")
        assert step is not None and "[101] went on without the node" in step.detail
    else:
        assert result.recovery_path == {101: "requeue"} and result.requeued_jobs == [101]
        assert f.slurm.requeue_count[101] == 1 and f.slurm.calls["shrink_job"] == 0


@pytest.mark.parametrize("announce", [True, False])
async def test_the_recovery_chosen_by_its_cost_is_recorded_and_told(
    env: WorkflowEnvironment, announce: bool
) -> None:
    """Issue 42: each job's plan (the GPU-hours each path would lose, the one taken) is on
    the incident; with `announce_recovery` Slack is told once the jobs are on their way,
    between the requeue and the repair; without it nothing more is sent. gpu-04 is free:
    job 102 can start again at once (the requeue path)."""
    async with _fleet(env, nodes=4) as f:
        f.slurm.add_job(
            101, nodes="gpu-[01,03]", comment="injob=/dev/shm/job-101", batch_host="gpu-03"
        )
        f.slurm.in_job_recovering.add(101)
        f.slurm.add_job(102, nodes="gpu-01")
        req = f.request(policy=_policy(announce_recovery=announce))
        result = await (await f.start(req)).result()
        events = f.events("gpu-01")
        notes = f.notes("gpu-01")

    assert result.status == "resolved", result.error
    plans = {p.job_id: p.chosen for p in result.recovery_plans}
    assert plans == {101: "in-job", 102: "requeue"}
    assert result.recovery_path == {101: "in-job", 102: "requeue"}
    if announce:
        assert events.count("recovery_chosen") == 1
        assert events.index("opened") < events.index("recovery_chosen") < events.index("resolved")
        told = next(n for n in notes if n.event == "recovery_chosen")
        assert "job 101: in-job" in told.text and "job 102: requeue" in told.text
    else:
        assert "recovery_chosen" not in events


async def test_two_faults_on_one_job_with_one_standby(env: WorkflowEnvironment) -> None:
    """XID_79 on both training nodes of a job (gpu-05, gpu-06; gpu-04 its standby and batch
    host) within a second: one healthy node is left for two seats, so the job is requeued
    at once, once in all, and both incidents resolve. Which incident's requeue step runs
    first is the worker's to choose: if it ran before the other's drain, it released its
    node and signalled the steps first (in-job), and the other's requeued the job. The
    incident whose requeue step finds the job records its path; one whose step runs after
    the requeue finds no job left on its node (Slurm shows a requeued job with no nodes).
    tests/activities/test_in_job_recovery.py puts the two steps in each order."""
    async with _fleet(env, nodes=6) as f:
        f.slurm.add_job(
            201, nodes="gpu-[04-06]", comment="injob=/dev/shm/job-201 training=gpu-05,gpu-06"
        )
        policy = _policy(job_recovery="in-job")
        handles = [await f.start(f.request(node, policy=policy)) for node in ("gpu-05", "gpu-06")]
        results = [await h.result() for h in handles]

    assert [r.status for r in results] == ["resolved", "resolved"], [r.error for r in results]
    assert f.slurm.requeue_count[201] == 1 and f.slurm.job_now(201).restart_cnt == 1
    assert len(f.slurm.step_signals) == f.slurm.calls["shrink_job"] <= 1
    paths = [r.recovery_path for r in results]
    assert {201: "requeue"} in paths and all(p in ({201: "requeue"}, {}) for p in paths)
    details = [step.detail for r in results if (step := r.step("requeue")) is not None]
    assert any("more losses than standbys" in d for d in details), details


async def test_observe_mode_changes_nothing(env: WorkflowEnvironment) -> None:
    async with _fleet(env) as f:
        req = f.request(policy=_policy(mode="observe"))
        result = await (await f.start(req)).result()
        guard = (await f.guard_status()).state

    assert (result.status, result.mode, result.rung) == ("observed", "observe", "reboot")
    assert [s.name for s in result.steps] == ["guard_register", "notify_opened", "notify_observed"]
    plan = result.planned_steps
    assert plan[0].startswith(f"drain gpu-01 with reason '{_our_reason(req)}'")
    assert any(p.startswith("reboot gpu-01") for p in plan), plan
    assert plan[-1] == "return to service"
    # Nothing touched: not Slurm, not the cloud, not the guard's out-of-service count.
    assert f.slurm.log == []
    assert [f.slurm.calls[c] for c in ("drain", "requeue", "resume", "cancel")] == [0, 0, 0, 0]
    assert not f.slurm.node_now("gpu-01").drained
    assert f.slurm.job_now(101).job_state == "RUNNING"
    assert f.cloud.repair_calls == []
    assert f.health.checks == []
    assert guard.out_of_service == {}
    assert f.events() == ["opened", "observed"]
    assert "observe mode, nothing changed" in f.notes()[-1].text


async def test_monitor_only_fault_stays_in_service(env: WorkflowEnvironment) -> None:
    async with _fleet(env) as f:
        req = f.request(fault="XID_13")
        result = await (await f.start(req)).result()

    assert (result.status, result.rung) == ("monitored", "monitor")
    assert [s.name for s in result.steps] == [
        "guard_register",
        "notify_opened",
        "notify_monitored",
    ]
    assert f.slurm.log == []
    assert f.slurm.calls["drain"] == 0
    assert not f.slurm.node_now("gpu-01").drained
    assert f.cloud.repair_calls == []
    assert f.events() == ["opened", "monitored"]
    assert f.notes()[0].severity == "warning"


# --- approvals -------------------------------------------------------------------------------


async def _approval_pending(f: Fleet, req: IncidentRequest) -> Incident:
    """Start an incident and wait until it asks for a decision on its first rung."""
    handle = await f.start(req)
    # The "approval_needed" notification is a step of its own inside the approval: wait
    # until it has been sent.
    state = await _until(
        handle,
        lambda st: (
            _waiting("approval", "reboot")(st)
            and st.current_step == "approval"
            and st.step("notify_approval_needed") is not None
            and st.step("notify_approval_needed").finished_at is not None
        ),  # type: ignore[union-attr]
        "the approval request",
    )
    assert state.current_step == "approval"
    assert [s.name for s in state.steps] == APPROVED_RUNBOOK[:9]
    # Quarantined before anyone is asked: the node is drained, nothing repaired yet.
    assert f.slurm.node_now("gpu-01").drained
    assert f.cloud.repair_calls == []
    await _until_true(lambda: "approval_needed" in f.events(), "approval_needed")
    assert f.events() == ["opened", "approval_needed"]
    assert "alice" in f.notes()[-1].text
    return handle


async def test_approve_mode_waits_for_approval_then_resolves(env: WorkflowEnvironment) -> None:
    async with _fleet(env) as f:
        req = f.request(policy=_policy(mode="approve"))
        handle = await _approval_pending(f, req)

        await _approve(handle, "reboot", "alice")
        result = await handle.result()

    assert result.status == "resolved"
    assert [s.name for s in result.steps] == APPROVED_RUNBOOK
    assert [(a.step, a.approver, a.approved) for a in result.approvals] == [
        ("reboot", "alice", True)
    ]
    approval = result.step("approval")
    assert approval is not None and approval.detail == "approved by alice"
    assert [r for _, r, _ in f.cloud.repair_calls] == [Rung.REBOOT]
    assert not f.slurm.node_now("gpu-01").drained
    assert f.events() == ["opened", "approval_needed", "resolved"]


async def test_rejected_incident_leaves_node_drained(env: WorkflowEnvironment) -> None:
    async with _fleet(env) as f:
        req = f.request(policy=_policy(mode="approve"))
        handle = await _approval_pending(f, req)

        await _approve(handle, "reboot", "bob", reject=True)
        result = await handle.result()  # completes: a rejection is not a failure
        guard = (await f.guard_status()).state

    assert result.status == "rejected"
    assert result.error is None
    assert [(a.approver, a.approved) for a in result.approvals] == [("bob", False)]
    node = f.slurm.node_now("gpu-01")
    assert node.drained and node.reason == _our_reason(req)
    assert f.slurm.calls["resume"] == 0
    assert f.cloud.repair_calls == []
    assert f.events() == ["opened", "approval_needed", "rejected"]
    assert "left drained" in f.notes()[-1].text
    # Left drained: it keeps counting as out of service, and repairs nothing.
    assert guard.out_of_service == {"gpu-01": req.incident_id}
    assert guard.repairing == {}


async def test_unanswered_approval_reminds_once_then_leaves_drained(
    env: WorkflowEnvironment,
) -> None:
    async with _fleet(env) as f:
        req = f.request(policy=_policy(mode="approve"))
        handle = await _approval_pending(f, req)

        await env.sleep(timedelta(seconds=APPROVAL_TIMEOUT_S + 1))
        await _until_true(lambda: "approval_reminder" in f.events(), "the reminder")
        still = await handle.query(NodeRemediation.status)
        assert still.status == "open"
        assert _waiting("approval", "reboot")(still)
        assert f.events() == ["opened", "approval_needed", "approval_reminder"]

        with pytest.raises(WorkflowFailureError) as caught:
            await handle.result()  # the second timeout passes in virtual time
        state = await handle.query(NodeRemediation.status)

    assert "RemediationFailed" == _app_error(caught.value, "RemediationFailed").type
    assert state.status == "failed"
    assert state.error == f"no decision on reboot within {2 * APPROVAL_TIMEOUT_S}s"
    assert state.approvals == []
    node = f.slurm.node_now("gpu-01")
    assert node.drained and node.reason == _our_reason(req)
    assert f.cloud.repair_calls == []
    assert f.events() == ["opened", "approval_needed", "approval_reminder", "failed"]
    failed = f.notes()[-1]
    assert failed.severity == "critical"
    assert "left drained" in failed.text


async def test_unanswered_approval_proceeds_when_the_policy_says_so(
    env: WorkflowEnvironment,
) -> None:
    async with _fleet(env) as f:
        req = f.request(policy=_policy(mode="approve", approval_timeout_action="proceed"))
        handle = await _approval_pending(f, req)
        result = await handle.result()  # both timeouts pass in virtual time

    assert result.status == "resolved"
    assert [(a.approver, a.approved) for a in result.approvals] == [("policy:timeout", True)]
    assert [r for _, r, _ in f.cloud.repair_calls] == [Rung.REBOOT]
    assert f.events() == ["opened", "approval_needed", "approval_reminder", "resolved"]


async def test_validators_refuse_bad_decisions(env: WorkflowEnvironment) -> None:
    async with _fleet(env, cloud=lambda s: FakeCloud(s, hold=True)) as f:
        req = f.request(policy=_policy(mode="approve"))
        handle = await _approval_pending(f, req)

        why = await _refused(handle, ApprovalRequest(step="reboot", approver="mallory"))
        assert "mallory is not an approver" in why
        why = await _refused(
            handle, ApprovalRequest(step="reboot", approver="mallory"), reject=True
        )
        assert "mallory is not an approver" in why
        why = await _refused(handle, ApprovalRequest(step="replace", approver="alice"))
        assert "on reboot, not replace" in why
        # Refused decisions leave no trace by themselves; the client records them.
        await handle.signal(
            NodeRemediation.approval_refused,
            RefusedApproval(
                step="reboot",
                approver="mallory",
                approved=True,
                reason="not an approver",
                at=datetime(2026, 1, 5, 3, 5, tzinfo=UTC),
            ),
        )
        still = await _until(handle, lambda s: len(s.refusals) == 1, "the refusal recorded")
        assert _waiting("approval", "reboot")(still)
        assert still.approvals == []
        assert (still.refusals[0].approver, still.refusals[0].reason) == (
            "mallory",
            "not an approver",
        )

        await _approve(handle, "reboot", "bob")
        # Decided: a second decision, either way, is refused.
        why = await _refused(handle, ApprovalRequest(step="reboot", approver="alice"))
        assert "not waiting for a decision" in why
        why = await _refused(handle, ApprovalRequest(step="reboot", approver="alice"), reject=True)
        assert "not waiting for a decision" in why

        await asyncio.wait_for(f.cloud.started.wait(), timeout=30)
        f.cloud.release.set()
        result = await handle.result()

    assert result.status == "resolved"
    assert [(a.approver, a.approved) for a in result.approvals] == [("bob", True)]
    assert len(result.refusals) == 1


# --- duplicate alerts ------------------------------------------------------------------------


async def test_duplicate_alerts_join_the_open_incident(env: WorkflowEnvironment) -> None:
    async with _fleet(env) as f:
        req = f.request(policy=_policy(mode="approve"), incident_id="INC-A")
        run_ids: list[str | None] = []

        async def report(incident_id: str, fault: str) -> FaultAck:
            """An alert as the alert receiver sends it: open the incident, or join it."""
            op = f.with_start(req)
            ack: FaultAck = await env.client.execute_update_with_start_workflow(
                NodeRemediation.report_fault,
                FaultReport(
                    incident_id=incident_id,
                    fault=fault,
                    source="dcgm",
                    at=datetime(2026, 1, 5, 3, len(run_ids), tzinfo=UTC),
                ),
                start_workflow_operation=op,
            )
            run_ids.append((await op.workflow_handle()).result_run_id)
            return ack

        first = await report("INC-A", "XID_79")
        assert (first.incident_id, first.joined) == ("INC-A", False)
        second = await report("INC-B", "XID_79")  # while the incident is on its way
        assert (second.incident_id, second.joined) == ("INC-A", True)

        handle: Incident = env.client.get_workflow_handle_for(
            NodeRemediation.run, workflow_id(req.cluster, req.node)
        )
        await _until(handle, _waiting("approval", "reboot"), "the approval request")
        third = await report("INC-C", "XID_48")  # another fault, the same rung
        fourth = await report("INC-D", "XID_79")
        assert [(a.incident_id, a.joined, a.rung) for a in (third, fourth)] == [
            ("INC-A", True, "reboot"),
            ("INC-A", True, "reboot"),
        ]
        merged = await handle.query(NodeRemediation.status)
        assert [(x.fault, x.count) for x in merged.faults] == [("XID_79", 3), ("XID_48", 1)]
        assert merged.rung == "reboot"

        # A more severe fault raises the rung of the waiting incident; the approval asked
        # for is now the replacement.
        worse = await report("INC-E", "XID_61")
        assert (worse.incident_id, worse.joined, worse.rung) == ("INC-A", True, "replace")
        raised = await _until(handle, _waiting("approval", "replace"), "approval of replace")
        assert raised.rung == "replace"
        why = await _refused(handle, ApprovalRequest(step="reboot", approver="alice"))
        assert "on replace, not reboot" in why

        await _approve(handle, "replace", "alice")
        result = await handle.result()

    assert len(set(run_ids)) == 1 and None not in run_ids, run_ids  # one incident all along
    assert result.status == "resolved"
    assert result.request.incident_id == "INC-A"
    assert [(x.fault, x.count) for x in result.faults] == [
        ("XID_79", 3),
        ("XID_48", 1),
        ("XID_61", 1),
    ]
    assert all(x.source == "dcgm" for x in result.faults[1:])
    assert f.slurm.calls["drain"] == 1
    assert f.slurm.log.count(("drain", "gpu-01")) == 1
    assert f.slurm.requeue_count == {101: 1}
    assert f.cloud.repair_calls == [("gpu-01", Rung.REPLACE, "INC-A:1:replace")]
    assert (result.old_vm_id, result.new_vm_id) == ("vm-0001", "vm-0002")
    approvals = [s for s in result.steps if s.name == "approval"]
    assert [a.detail for a in approvals] == [
        "none: a more severe fault raised the rung to replace",
        "approved by alice",
    ]
    assert f.events() == ["opened", "approval_needed", "approval_needed", "resolved"]


# --- escalation ------------------------------------------------------------------------------


async def test_recurrence_on_the_node_escalates_the_next_incident(
    env: WorkflowEnvironment,
) -> None:
    # Real time, not skipped: the test server skips time while an activity runs (a slow
    # worker on a loaded machine), and the guard's next timer is its oldest open leaving
    # the recurrence window, a day on. Skipped to it, the first incident is rightly
    # forgotten before the second registers (CI saw reboot instead of replace, twice).
    with env.auto_time_skipping_disabled():
        async with _fleet(env) as f:
            first = f.request()
            one = await (await f.start(first)).result()
            second = f.request()
            two = await (await f.start(second)).result()
            guard = (await f.guard_status()).state

    assert (one.status, one.rung) == ("resolved", "reboot")
    assert (two.status, two.rung) == ("resolved", "replace")
    assert f.cloud.repair_calls == [
        ("gpu-01", Rung.REBOOT, f"{first.incident_id}:1:reboot"),
        ("gpu-01", Rung.REPLACE, f"{second.incident_id}:1:replace"),
    ]
    opened = [n for n in f.notes() if n.event == "opened"]
    assert "earlier incident" not in opened[0].text
    assert "1 earlier incident(s) on this node" in opened[1].text
    register = two.step("guard_register")
    assert register is not None and register.detail.startswith("1 recent on node")
    assert [o.incident_id for o in guard.opens] == [first.incident_id, second.incident_id]


async def test_failed_health_gate_escalates_one_rung(env: WorkflowEnvironment) -> None:
    async with _fleet(env, fixed_by=Rung.REPLACE) as f:
        req = f.request()
        result = await (await f.start(req)).result()

    assert result.status == "resolved"
    assert (result.rung, result.repair_attempts) == ("replace", 2)
    assert [(r, k) for _, r, k in f.cloud.repair_calls] == [
        (Rung.REBOOT, f"{req.incident_id}:1:reboot"),
        (Rung.REPLACE, f"{req.incident_id}:2:replace"),
    ]
    assert [h.passed for h in result.health] == [False, True]
    assert [s.name for s in result.steps] == [
        *RUNBOOK[:11],
        "notify_escalated",
        *RUNBOOK[7:],
    ]
    gates = [s for s in result.steps if s.name == "health_gate"]
    assert gates[0].detail.startswith("FAILED: gpu_faults: fault persists until replace")
    assert gates[1].detail == "passed"
    assert f.events() == ["opened", "escalated", "resolved"]
    escalated = f.notes()[1]
    assert escalated.severity == "warning"
    assert "next: replace" in escalated.text
    assert not f.slurm.node_now("gpu-01").drained


@pytest.mark.parametrize(
    ("fault", "max_attempts", "tried"),
    [
        # The ladder ends: nothing above replace.
        ("XID_79", 3, [Rung.REBOOT, Rung.REPLACE]),
        # max_repair_attempts ends it before the ladder does.
        ("XID_46", 2, [Rung.RESET_GPU, Rung.REBOOT]),
    ],
    ids=["ladder-ends", "attempts-run-out"],
)
async def test_node_that_never_passes_the_health_gate_is_left_drained(
    env: WorkflowEnvironment, fault: str, max_attempts: int, tried: list[Rung]
) -> None:
    async with _fleet(env, fixed_by=None) as f:
        req = f.request(fault=fault, policy=_policy(max_repair_attempts=max_attempts))
        handle = await f.start(req)
        with pytest.raises(WorkflowFailureError) as caught:
            await handle.result()
        state = await handle.query(NodeRemediation.status)
        guard = (await f.guard_status()).state

    _app_error(caught.value, "RemediationFailed")
    gate = _app_error(caught.value, "HealthGateFailed")
    assert f"health gate failed after {tried[-1].value} (attempt {len(tried)})" in gate.message
    assert [r for _, r, _ in f.cloud.repair_calls] == tried
    assert state.status == "failed"
    assert state.repair_attempts == len(tried)
    assert [h.passed for h in state.health] == [False] * len(tried)
    assert state.step("return_to_service") is None
    node = f.slurm.node_now("gpu-01")
    assert node.drained and node.reason == _our_reason(req)
    assert f.slurm.calls["resume"] == 0
    assert f.events() == ["opened", *["escalated"] * (len(tried) - 1), "failed"]
    failed = f.notes()[-1]
    assert failed.severity == "critical"
    assert "gpu-01 left drained" in failed.text
    assert guard.out_of_service == {"gpu-01": req.incident_id}
    assert guard.repairing == {}


# --- the fleet guard -------------------------------------------------------------------------


async def test_tripped_breaker_holds_repairs_until_reset(env: WorkflowEnvironment) -> None:
    policy = _policy(
        mode="approve", guard=GuardPolicy(breaker_threshold=1, min_in_service_fraction=0.5)
    )
    async with _fleet(env, nodes=4) as f:
        one, two = f.request("gpu-01", policy=policy), f.request("gpu-02", policy=policy)
        h1 = await f.start(one)
        await _until(h1, _waiting("approval"), "the first approval request")
        h2 = await f.start(two)  # the second open within the window trips the breaker
        await _until(h2, _waiting("approval"), "the second approval request")
        breaker = (await f.guard_status()).state.breaker
        assert breaker.tripped and breaker.nodes == ["gpu-01", "gpu-02"]
        assert "CIRCUIT BREAKER TRIPPED" in f.notes("gpu-02")[0].text

        await _approve(h1, "reboot")
        await _approve(h2, "reboot")
        for h in (h1, h2):
            # The "held" notification is a step of its own inside admit_repair: wait past it.
            held = await _until(
                h,
                lambda st: (
                    _waiting("admission", "repair")(st) and st.current_step == "admit_repair"
                ),
                "the repair held",
            )
            assert held.waiting_for is not None
            assert "circuit breaker tripped" in held.waiting_for.detail
            assert held.current_step == "admit_repair"
        # Asking again later changes nothing, and the humans heard of it once.
        await env.sleep(timedelta(seconds=one.timeouts.admission_poll_s + 1))
        for node, h in (("gpu-01", h1), ("gpu-02", h2)):
            assert _waiting("admission", "repair")(await h.query(NodeRemediation.status))
            assert f.events(node) == ["opened", "approval_needed", "held"]
            assert f.notes(node)[-1].severity == "warning"
            # Quarantine is not held by the breaker: the faulty nodes left service.
            assert f.slurm.node_now(node).drained
        assert f.cloud.repair_calls == []

        reset = await f.guard.execute_update(
            FleetGuard.reset_breaker, await proven_reset(f.guard, "alice")
        )
        assert not reset.tripped and reset.reset_by == "alice"
        r1, r2 = await h1.result(), await h2.result()

    assert (r1.status, r2.status) == ("resolved", "resolved")
    assert sorted(n for n, _, _ in f.cloud.repair_calls) == ["gpu-01", "gpu-02"]
    for node in ("gpu-01", "gpu-02"):
        assert not f.slurm.node_now(node).drained
        assert f.events(node) == ["opened", "approval_needed", "held", "resolved"]


async def test_fault_reported_while_repair_is_held_raises_the_repair(
    env: WorkflowEnvironment,
) -> None:
    policy = _policy(guard=GuardPolicy(breaker_threshold=1, min_in_service_fraction=0.5))
    async with _fleet(env, nodes=4, cloud=lambda s: FakeCloud(s, hold=True)) as f:
        one, two = f.request("gpu-01", policy=policy), f.request("gpu-02", policy=policy)
        h1 = await f.start(one)
        await asyncio.wait_for(f.cloud.started.wait(), timeout=30)  # gpu-01 is repairing
        h2 = await f.start(two)  # trips the breaker: gpu-02's repair is held
        await _until(h2, _waiting("admission", "repair"), "the repair held")

        ack = await env.client.execute_update_with_start_workflow(
            NodeRemediation.report_fault,
            FaultReport(incident_id="INC-other", fault="XID_61", at=datetime.now(UTC)),
            start_workflow_operation=f.with_start(two),
        )
        assert (ack.incident_id, ack.joined, ack.rung) == (two.incident_id, True, "replace")

        await f.guard.execute_update(FleetGuard.reset_breaker, await proven_reset(f.guard, "alice"))
        f.cloud.release.set()
        r1, r2 = await h1.result(), await h2.result()

    assert (r1.status, r1.rung) == ("resolved", "reboot")
    assert (r2.status, r2.rung) == ("resolved", "replace")
    # The held reboot was never carried out: once admitted, the raised rung was repaired.
    assert [(n, r) for n, r, _ in f.cloud.repair_calls] == [
        ("gpu-01", Rung.REBOOT),
        ("gpu-02", Rung.REPLACE),
    ]
    assert [s.name for s in r2.steps].count("admit_repair") == 2
    assert r2.repair_attempts == 1


@pytest.mark.parametrize(
    ("drain_held", "below_floor"),
    [(True, True), (True, False), (False, False)],
    ids=["held-drain-below-floor", "held-drain-at-floor", "no-held-drain"],
)
async def test_min_in_service_fraction_holds_the_second_quarantine(
    env: WorkflowEnvironment, drain_held: bool, below_floor: bool
) -> None:
    # 4 nodes, at least 75 % in service: one node out at a time. The held drain of a
    # critical node goes below that floor only when the policy names it.
    guard = GuardPolicy(
        min_in_service_fraction=0.75,
        drain_held_critical=drain_held,
        below_floor=["drain_held_critical"] if below_floor else [],
    )
    policy = _policy(guard=guard)
    drained_while_held = drain_held and below_floor
    async with _fleet(env, nodes=4, cloud=lambda s: FakeCloud(s, hold=True)) as f:
        one, two = f.request("gpu-01", policy=policy), f.request("gpu-02", policy=policy)
        h1 = await f.start(one)
        await asyncio.wait_for(f.cloud.started.wait(), timeout=30)  # gpu-01 is out
        h2 = await f.start(two)
        held = await _until(
            h2,
            lambda st: (
                _waiting("admission", "quarantine")(st) and st.current_step == "admit_quarantine"
            ),  # past the nested "held" notification
            "the quarantine held",
        )
        assert held.waiting_for is not None
        assert "below the minimum 3" in held.waiting_for.detail
        assert held.current_step == "admit_quarantine"
        await _until_true(lambda: "held" in f.events("gpu-02"), "the held notification")
        held = await h2.query(NodeRemediation.status)  # as the notification said it
        assert held.waiting_for is not None
        assert (held.waiting_for.detail or "").endswith("(number 1 in the queue)")
        gpu02 = f.slurm.node_now("gpu-02")
        at_floor = "held: drain not allowed, the cluster is at its floor (3 of 4 in service)"
        if drained_while_held:
            # XID_79 is critical: no new jobs while it waits, its running job goes on.
            assert gpu02.drained
            assert gpu02.reason == f"{_our_reason(two)} (held)"
            assert (await f.guard_status()).state.held_drained == {"gpu-02": two.incident_id}
        else:
            # Not drained: gpu-02 stays in service while it waits.
            assert not gpu02.drained
            assert ("drain", "gpu-02") not in f.slurm.log
        # At the floor, the guard held the drain too: the incident and Slack say so.
        assert (at_floor in held.waiting_for.detail) == (drain_held and not below_floor)
        assert (at_floor in f.notes("gpu-02")[-1].text) == (drain_held and not below_floor)
        assert f.slurm.job_now(102).job_state == "RUNNING"
        assert f.slurm.requeue_count[102] == 0

        f.cloud.release.set()
        r1 = await h1.result()
        r2 = await h2.result()  # told by the guard once gpu-01 is back

    assert (r1.status, r2.status) == ("resolved", "resolved")
    log = f.slurm.log
    # The quarantine proper (our normal reason, then the requeue) came after gpu-01's return.
    last_drain = len(log) - 1 - log[::-1].index(("drain", "gpu-02"))
    assert log.index(("resume", "gpu-01")) < last_drain < log.index(("requeue", "102"))
    assert log.count(("drain", "gpu-02")) == (2 if drained_while_held else 1)
    assert f.slurm.requeue_count == {101: 1, 102: 1}
    assert [s.name for s in r2.steps][:5] == [
        "guard_register",
        "notify_opened",
        "admit_quarantine",
        *(["drain_held"] if drained_while_held else []),
        "notify_held",
        *([] if drained_while_held else ["drain"]),
    ]
    assert f.events("gpu-02") == ["opened", "held", "resolved"]
    assert not f.slurm.node_now("gpu-02").drained


async def test_a_held_drain_is_still_ours() -> None:
    """Return to service and the quarantine proper accept the held drain as ours."""
    slurm = FakeSlurm()
    slurm.add_node("gpu-01", state_flags=["DRAIN"], reason=held_drain_reason("INC-1", "XID_79"))
    acts = SlurmActivities(slurm)
    run = ActivityEnvironment().run

    drained = await run(
        acts.drain_node, DrainInput(node="gpu-01", reason=drain_reason("INC-1", "XID_79"))
    )
    assert drained.already_drained
    assert slurm.node_now("gpu-01").reason == "autoclusters: INC-1 XID_79"

    slurm.set_reason("gpu-01", held_drain_reason("INC-1", "XID_79"))
    back = await run(acts.return_to_service, ReturnInput(node="gpu-01", incident_id="INC-1"))
    assert back.returned, back.detail
    assert not slurm.node_now("gpu-01").drained


def _signals(history: Any, name: str) -> int:
    return sum(
        1
        for e in history.events
        if e.HasField("workflow_execution_signaled_event_attributes")
        and e.workflow_execution_signaled_event_attributes.signal_name == name
    )


def _activities(history: Any, name: str) -> int:
    return sum(
        1
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name == name
    )


async def test_an_incident_held_for_72_hours_keeps_a_small_history(
    env: WorkflowEnvironment,
) -> None:
    policy = _policy(
        mode="approve", guard=GuardPolicy(breaker_threshold=1, min_in_service_fraction=0.5)
    )
    async with _fleet(env, nodes=4) as f:
        one, two = f.request("gpu-01", policy=policy), f.request("gpu-02", policy=policy)
        h1 = await f.start(one, timedelta(days=7))
        await _until(h1, _waiting("approval"), "the first approval request")
        h2 = await f.start(two, timedelta(days=7))  # trips the breaker
        await _until(h2, _waiting("approval"), "the second approval request")
        await _approve(h1, "reboot")
        await _approve(h2, "reboot")
        for h in (h1, h2):
            await _until(
                h,
                lambda st: (
                    _waiting("admission", "repair")(st) and st.current_step == "admit_repair"
                ),
                "the repair held",
            )

        await skip_time(env, timedelta(hours=72))  # a weekend with the breaker tripped

        for h in (h1, h2):
            st = await h.query(NodeRemediation.status)
            assert _waiting("admission", "repair")(st)
            history = await h.fetch_history()
            assert len(history.events) < 2000, len(history.events)
            # One ask, then one safety re-ask an hour: not one every 30 s.
            assert _activities(history, "guard_admit_repair") <= 74
        assert f.events("gpu-02") == ["opened", "approval_needed", "held"]

        await f.guard.execute_update(FleetGuard.reset_breaker, await proven_reset(f.guard, "alice"))
        r1, r2 = await h1.result(), await h2.result()

        # Admitted by the guard's signal, not by asking again.
        for h in (h1, h2):
            history = await h.fetch_history()
            assert _signals(history, "guard_admitted") == 1
    assert (r1.status, r2.status) == ("resolved", "resolved")
    assert r2.step("admit_repair") is not None
    assert "admitted from the queue" in (r2.step("admit_repair").detail or "")  # type: ignore[union-attr]


async def test_a_cancelled_incident_frees_its_place_and_ends_cancelled(
    env: WorkflowEnvironment,
) -> None:
    # 4 nodes, at least 75 % in service: one node out at a time. Approve mode: gpu-01's
    # incident holds its node (quarantined) while it waits for a human.
    policy = _policy(mode="approve", guard=GuardPolicy(min_in_service_fraction=0.75))
    async with _fleet(env, nodes=4) as f:
        one, two = f.request("gpu-01", policy=policy), f.request("gpu-02", policy=policy)
        three = f.request("gpu-03", policy=policy)
        h1 = await f.start(one)
        await _until(h1, _waiting("approval"), "gpu-01 quarantined, waiting for approval")
        h2 = await f.start(two)
        await _until(h2, _waiting("admission", "quarantine"), "gpu-02 queued")
        h3 = await f.start(three)
        await _until(h3, _waiting("admission", "quarantine"), "gpu-03 queued")
        queue = (await f.guard_status()).state.queue
        queued = [w.incident_id for w in queue if w.kind == "quarantine"]
        assert queued == [two.incident_id, three.incident_id]

        # Cancelled while queued (the Temporal UI's cancel): its place goes, it ends cancelled.
        await h2.cancel()
        with pytest.raises(WorkflowFailureError):
            await h2.result()
        st2 = await h2.query(NodeRemediation.status)
        assert (st2.status, st2.waiting_for) == ("cancelled", None)
        queue = (await f.guard_status()).state.queue
        assert {w.incident_id for w in queue} == {three.incident_id}  # its drain waits too
        assert f.events("gpu-02")[-1] == "cancelled"

        # Cancelled while it holds its node: the node stays drained for a human and counts
        # as out of service only while Slurm shows it drained.
        await h1.cancel()
        with pytest.raises(WorkflowFailureError):
            await h1.result()
        st1 = await h1.query(NodeRemediation.status)
        assert st1.status == "cancelled"
        guard = (await f.guard_status()).state
        assert guard.out_of_service == {"gpu-01": one.incident_id}
        assert guard.left_out == {"gpu-01": one.incident_id}
        assert f.slurm.node_now("gpu-01").drained
        assert "left drained" in f.notes("gpu-01")[-1].text
        assert f.cloud.repair_calls == []

        # A human resumes gpu-01: the guard's own reconcile sees it and admits gpu-03.
        f.slurm.admin_resume("gpu-01")
        await env.sleep(timedelta(seconds=policy.guard.reconcile_interval_s + 1))
        await _until(h3, _waiting("approval"), "gpu-03 quarantined")
        guard = (await f.guard_status()).state
        assert guard.out_of_service == {"gpu-03": three.incident_id}
        assert (guard.left_out, guard.queue) == ({}, [])
        await _approve(h3, "reboot")
        r3 = await h3.result()

    assert r3.status == "resolved"
    assert not f.slurm.node_now("gpu-03").drained


# --- failures ------------------------------------------------------------------------------


async def test_failed_repair_leaves_node_drained_and_fails(env: WorkflowEnvironment) -> None:
    async with _fleet(env, cloud=lambda s: FakeCloud(s, fail=True)) as f:
        req = f.request()
        handle = await f.start(req)
        with pytest.raises(WorkflowFailureError) as caught:
            await handle.result()
        state = await handle.query(NodeRemediation.status)
        guard = (await f.guard_status()).state

    _app_error(caught.value, "RemediationFailed")
    _app_error(caught.value, "CloudError")
    node = f.slurm.node_now("gpu-01")
    assert node.drained
    assert node.reason == _our_reason(req)
    assert f.slurm.calls["resume"] == 0
    # CloudError is transient: the whole retry budget was spent before giving up.
    assert len(f.cloud.repair_calls) == RETRY.maximum_attempts
    assert f.events() == ["opened", "failed"]
    assert f.notes()[-1].severity == "critical"
    assert "gpu-01 left drained" in f.notes()[-1].text

    assert state.status == "failed"
    assert state.error and "no capacity" in state.error
    repair = state.step("repair")
    assert repair is not None and repair.outcome == "failed"
    assert state.step("wait_registered") is None
    assert state.step("health_gate") is None
    assert state.step("return_to_service") is None
    # The repair slot is free again; the node stays out of service.
    assert guard.repairing == {}
    assert guard.out_of_service == {"gpu-01": req.incident_id}


async def test_retried_requeue_does_not_requeue_twice(env: WorkflowEnvironment) -> None:
    async with _fleet(env, fail_after_requeue_once=True) as f:
        result = await (await f.start(f.request())).result()

    # The first attempt requeued and then "crashed"; the retry saw the marker and only
    # released the hold.
    assert f.slurm.injected_failures == 1
    assert f.slurm.requeue_count == {101: 1}
    assert f.slurm.release_count == {101: 1}
    job = f.slurm.job_now(101)
    assert (job.job_state, job.state_reason, job.restart_cnt) == ("PENDING", "None", 1)
    assert result.status == "resolved"
    assert result.requeued_jobs == [101]
    assert [s.name for s in result.steps] == RUNBOOK
    assert not f.slurm.node_now("gpu-01").drained


@pytest.mark.parametrize("before", [True, False], ids=["drained-before", "drained-during-repair"])
async def test_foreign_drain_is_kept(env: WorkflowEnvironment, before: bool) -> None:
    admin_reason = "hca flapping, keep out -- alice"
    cloud = FakeCloud if before else (lambda s: FakeCloud(s, admin_drain_reason=admin_reason))
    async with _fleet(env, cloud=cloud) as f:
        if before:
            f.slurm.set_reason("gpu-01", admin_reason)
        handle = await f.start(f.request())
        with pytest.raises(WorkflowFailureError) as caught:
            await handle.result()
        state = await handle.query(NodeRemediation.status)

    failure = _app_error(caught.value, "RemediationFailed")
    assert "not ours" in failure.message
    node = f.slurm.node_now("gpu-01")
    assert node.drained
    assert node.reason == admin_reason
    assert f.slurm.calls["resume"] == 0
    drain = state.step("drain")
    assert drain is not None and drain.outcome == "ok"
    if before:
        assert f.slurm.calls["drain"] == 0
        assert drain.detail == f"kept the drain already there: {admin_reason}"
    assert f.events() == ["opened", "failed"]
    assert state.status == "failed"
    back = state.step("return_to_service")
    assert back is not None and back.outcome == "ok"
    assert "not ours" in back.detail
    assert state.step("notify_resolved") is None


@pytest.mark.parametrize("lent", [True, False], ids=["lent-to-inference", "in-training"])
async def test_a_lent_node_is_taken_from_sharing_before_requeue(
    env: WorkflowEnvironment, lent: bool
) -> None:
    yields: list[YieldCall] = []
    slurm: list[FakeSlurm] = []

    @activity.defn(name="share_yield_node")
    async def share_yield_node(call: YieldCall) -> YieldResult:
        yields.append(call)
        slurm[0].record("share_yield_node", call.node)
        return YieldResult(held=True, pool_before=Pool.INFERENCE)

    async with _fleet(env, extra_activities=[share_yield_node]) as f:
        slurm.append(f.slurm)
        if lent:
            f.slurm.set_reason("gpu-01", LENT_REASON)
        req = f.request()
        result = await (await f.start(req)).result()

    assert result.status == "resolved"
    repair = [
        ("requeue", "101"),
        ("release_hold", "101"),
        ("cloud.reboot", "gpu-01"),
        ("registered", "gpu-01"),
        ("resume", "gpu-01"),
    ]
    if lent:
        assert yields == [YieldCall(cluster=f.cluster, node="gpu-01", incident_id=req.incident_id)]
        # Taken after the drain (under the incident's reason now), before the requeue.
        assert f.slurm.log == [
            ("admin_drain", "gpu-01"),
            ("drain", "gpu-01"),
            ("share_yield_node", "gpu-01"),
            *repair,
        ]
        assert [s.name for s in result.steps] == [
            *RUNBOOK[:4],
            "take_from_sharing",
            *RUNBOOK[4:],
        ]
        took = result.step("take_from_sharing")
        assert took is not None and took.outcome == "ok" and "inference" in took.detail
    else:
        assert yields == []
        assert f.slurm.log == [("drain", "gpu-01"), *repair]
        assert [s.name for s in result.steps] == RUNBOOK
    assert not f.slurm.node_now("gpu-01").drained


async def test_unknown_node_fails_at_once(env: WorkflowEnvironment) -> None:
    async with _fleet(env) as f:
        handle = await f.start(f.request(node="gpu-99"))
        with pytest.raises(WorkflowFailureError) as caught:
            await handle.result()
        state = await handle.query(NodeRemediation.status)

    act = next(e for e in _chain(caught.value) if isinstance(e, ActivityError))
    assert act.retry_state == RetryState.NON_RETRYABLE_FAILURE
    unknown = _app_error(act, "UnknownNode")
    assert unknown.non_retryable
    # One attempt: the drain activity looked the node up once and was not retried.
    assert f.slurm.calls["node"] == 1
    assert f.slurm.calls["drain"] == 0
    assert f.slurm.log == []
    assert f.cloud.repair_calls == []
    # The incident is closed as failed and a human hears of it.
    assert state.status == "failed"
    assert [s.name for s in state.steps] == [
        "guard_register",
        "notify_opened",
        "admit_quarantine",
        "drain",
        "notify_failed",
    ]
    assert f.events("gpu-99") == ["opened", "failed"]
    assert "gpu-99 not drained" in f.notes("gpu-99")[-1].text


# --- jobs that cannot be requeued ------------------------------------------------------------


async def test_requeue_jobs_reports_jobs_it_cannot_requeue() -> None:
    slurm = FakeSlurm()
    slurm.add_node("gpu-01")
    slurm.add_job(201, nodes="gpu-01", requeue=False)  # sbatch --no-requeue
    slurm.add_job(202, nodes="gpu-01")
    slurm.add_job(203, nodes="gpu-01", batch_flag=False)  # interactive srun
    slurm.add_job(204, nodes="gpu-01", job_state="COMPLETING")
    acts = SlurmActivities(slurm)

    result = await ActivityEnvironment().run(
        acts.requeue_jobs, RequeueInput(node="gpu-01", incident_id="INC-1")
    )

    assert result.not_requeueable == [201, 203]
    assert result.requeued == [202]
    assert result.holds_released == [202]
    assert slurm.requeue_count == {202: 1}
    assert slurm.job_now(201).job_state == "RUNNING"
    assert slurm.job_now(201).admin_comment == ""
    assert slurm.job_now(203).job_state == "RUNNING"


@pytest.mark.parametrize(
    "step",
    [
        StepPolicy(wait_for_idle=False),
        StepPolicy(idle_timeout_s=0.5, on_idle_timeout="force"),
    ],
    ids=["no-wait", "force-after-timeout"],
)
async def test_forced_wait_idle_cancels_what_cannot_be_requeued(
    env: WorkflowEnvironment, step: StepPolicy
) -> None:
    async with _fleet(env) as f:
        f.slurm.add_job(105, nodes="gpu-01", requeue=False)  # sbatch --no-requeue
        policy = _policy(steps={**STEPS, Rung.REBOOT: step})
        result = await (await f.start(f.request(policy=policy))).result()

    assert result.status == "resolved"
    assert result.requeued_jobs == [101]
    requeue, idle = result.step("requeue"), result.step("wait_idle")
    assert requeue is not None and "cannot requeue [105]" in requeue.detail
    assert idle is not None and idle.detail == "cancelled [105]"
    assert f.slurm.job_now(105).job_state == "CANCELLED"
    assert f.slurm.requeue_count == {101: 1}
    # Cancelled before the repair, never repaired under.
    assert f.slurm.log == [
        ("drain", "gpu-01"),
        ("requeue", "101"),
        ("release_hold", "101"),
        ("cancel", "105"),
        ("cloud.reboot", "gpu-01"),
        ("registered", "gpu-01"),
        ("resume", "gpu-01"),
    ]


async def test_busy_node_is_left_drained_when_idle_times_out(env: WorkflowEnvironment) -> None:
    async with _fleet(env) as f:
        f.slurm.add_job(105, nodes="gpu-01", requeue=False)
        req = f.request()  # idle_timeout_s 0.5, on_idle_timeout leave_drained
        handle = await f.start(req)
        with pytest.raises(WorkflowFailureError) as caught:
            await handle.result()
        state = await handle.query(NodeRemediation.status)

    act = next(e for e in _chain(caught.value) if isinstance(e, ActivityError))
    assert act.retry_state == RetryState.NON_RETRYABLE_FAILURE
    busy = _app_error(act, "NodeBusy")
    assert "still runs jobs [105]" in busy.message
    assert state.status == "failed"
    idle = state.step("wait_idle")
    assert idle is not None and idle.outcome == "failed"
    assert state.step("repair") is None
    assert f.cloud.repair_calls == []
    assert f.slurm.job_now(105).job_state == "RUNNING"
    assert f.slurm.calls["cancel"] == 0
    node = f.slurm.node_now("gpu-01")
    assert node.drained and node.reason == _our_reason(req)
    assert f.events() == ["opened", "failed"]
    assert f.notes()[-1].severity == "critical"


async def test_replacement_takes_a_hot_spare_into_service(env: WorkflowEnvironment) -> None:
    async with _fleet(env, nodes=4) as f:
        # gpu-04 waits as the cluster's hot spare.
        await f.slurm.drain("gpu-04", SPARE_REASON)
        spares = GuardPolicy(min_in_service_fraction=0.5, breaker_threshold=10, spares=["gpu-04"])
        req = f.request(fault="XID_61", policy=_policy(guard=spares))  # XID_61: replace
        result = await (await f.start(req)).result()
        guard = await f.guard_status()

    assert result.status == "resolved"
    assert result.spare_node == "gpu-04"
    names = [s.name for s in result.steps]
    # The spare serves before the replacement even starts; the replaced node is parked.
    assert names.index("take_spare") < names.index("repair")
    assert names[-3:] == ["park_as_spare", "refill_spare", "notify_resolved"]
    assert "return_to_service" not in names
    assert not f.slurm.node_now("gpu-04").drained
    parked = f.slurm.node_now("gpu-01")
    assert parked.drained and parked.reason == SPARE_REASON
    assert guard.state.spares == ["gpu-01"]
    assert guard.state.spare_claims == {req.incident_id: "gpu-04"}
    assert "spare_in_service" in f.events()


async def test_no_free_spare_falls_back_to_returning_the_node(env: WorkflowEnvironment) -> None:
    async with _fleet(env, nodes=4) as f:
        # The configured spare is not free: an admin has it drained for something else.
        await f.slurm.drain("gpu-04", "bad PSU -- bob")
        spares = GuardPolicy(min_in_service_fraction=0.5, breaker_threshold=10, spares=["gpu-04"])
        req = f.request(fault="XID_61", policy=_policy(guard=spares))
        result = await (await f.start(req)).result()

    assert result.status == "resolved"
    assert result.spare_node is None
    take = result.step("take_spare")
    assert take is not None and "not a free spare" in take.detail
    assert f.slurm.node_now("gpu-04").reason == "bad PSU -- bob"
    assert not f.slurm.node_now("gpu-01").drained  # returned to service the usual way


class _BrokenNotifier:
    """Slack (or any notifier) down: every send fails."""

    def __init__(self) -> None:
        self.calls = 0

    async def send(self, note: Notification) -> None:
        self.calls += 1
        raise ConnectionError("slack.com unreachable")


async def test_a_notifier_outage_leaves_the_remediation_unaffected(
    env: WorkflowEnvironment,
) -> None:
    broken = _BrokenNotifier()
    slurm = FakeSlurm()
    _add_nodes(slurm, 3)
    cloud = FakeCloud(slurm)
    tq = f"tq-{uuid.uuid4()}"
    guard = GuardActivities(env.client, slurm, tq, execution_timeout=timedelta(days=30))
    req = IncidentRequest(
        incident_id=f"INC-{uuid.uuid4().hex[:8]}",
        cluster=f"test-{uuid.uuid4().hex[:8]}",
        node="gpu-01",
        fault="XID_79",
        opened_at=datetime(2026, 1, 5, 3, 0, tzinfo=UTC),
        policy=_policy(),
    )
    async with Worker(
        env.client,
        task_queue=tq,
        workflows=WORKFLOWS,
        activities=activities_for(slurm, cloud, FakeHealth(cloud), guard, [broken]),
    ):
        handle = await env.client.start_workflow(
            NodeRemediation.run, req, id=workflow_id(req.cluster, req.node), task_queue=tq,
            execution_timeout=EXECUTION_TIMEOUT,
        )  # fmt: skip
        result = await handle.result()
        try:
            await env.client.get_workflow_handle(guard_workflow_id(req.cluster)).terminate()
        except RPCError as e:  # the guard already ended (time skipped past it under load)
            if e.status != RPCStatusCode.NOT_FOUND:
                raise

    assert result.status == "resolved"
    assert not slurm.node_now("gpu-01").drained
    notes = [s for s in result.steps if s.name.startswith("notify_")]
    assert notes and all(s.outcome == "failed" for s in notes)
    assert broken.calls >= 2 * len(notes)  # each notification was retried, then given up


class _NameMovesAfterPlan(FakeCloud):
    """Right after the plan looked the node's VM up, the name moves to another VM."""

    async def vm_id(self, node: str) -> str:
        recorded = await super().vm_id(node)
        self._vms[node] = self._new_vm()
        return recorded


async def test_the_planned_vm_reaches_the_repair_input(env: WorkflowEnvironment) -> None:
    async with _fleet(env, cloud=_NameMovesAfterPlan) as f:
        req = f.request()
        handle = await f.start(req)
        result = await handle.result()
        history = await handle.fetch_history()

    key = f"{req.incident_id}:1:reboot"
    planned = f.cloud.planned_vms[key]
    assert planned is not None and result.status == "resolved"
    # The repair acted on the recorded VM, not on the one that has the name now.
    assert result.old_vm_id == result.new_vm_id == planned != await f.cloud.vm_id("gpu-01")
    # The plan is in the history, before the repair, and the repair's input carries it.
    scheduled = [
        e.activity_task_scheduled_event_attributes
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    names = [a.activity_type.name for a in scheduled]
    assert names.index("plan_repair") == names.index("repair_node") - 1
    repair = scheduled[names.index("repair_node")]
    inp = json.loads(repair.input.payloads[0].data)
    assert (inp["vm_id"], inp["key"]) == (planned, key) and inp["planned_at"] > 0


async def test_every_activity_of_an_incident_has_a_summary_naming_the_node(
    env: WorkflowEnvironment,
) -> None:
    """The Temporal UI shows each activity's summary: an incident that escalates from a
    reboot to a replacement names its node (and the VM it replaces) on every one."""
    async with _fleet(env, fixed_by=Rung.REPLACE) as f:
        req = f.request()
        handle = await f.start(req)
        result = await handle.result()
        history = await handle.fetch_history()

    assert result.status == "resolved" and result.repair_attempts == 2
    scheduled = [
        e for e in history.events if e.HasField("activity_task_scheduled_event_attributes")
    ]
    summaries = []
    for e in scheduled:
        name = e.activity_task_scheduled_event_attributes.activity_type.name
        assert e.user_metadata.HasField("summary"), f"{name} has no summary"
        text = json.loads(e.user_metadata.summary.data)
        assert "gpu-01" in text, (name, text)
        summaries.append(text)
    assert "drain gpu-01 (XID_79)" in summaries
    assert "reboot gpu-01 (XID_79)" in summaries
    assert any(s.startswith("replace VM ") and s.endswith(" of gpu-01 (XID_79)") for s in summaries)
    assert "requeue the jobs on gpu-01" in summaries
