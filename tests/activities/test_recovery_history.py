"""Reading the recoveries a cluster's closed incidents measured (issue 42;
activities/recovery_history.py):

- on a Temporal dev server: the cluster's completed NodeRemediation runs are listed by
  their search attributes and each one's measured recoveries read from its result (another
  cluster's, and a run still open, are not);
- each closed run's result is read once per worker: a second read lists again and fetches
  only the runs closed since;
- a list that fails raises (unknown, never "none measured"); a result this code cannot read
  is skipped and counted;
- a loss that was not measured is no measurement; a job is counted on the path its plan
  expected;
- the activity turns the read into the plan's figures over the policy's.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio import workflow
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Worker

from autoclusters.activities.recovery_history import (
    HistoryRead,
    RecoveryHistoryActivities,
    TemporalRecoveries,
)
from autoclusters.core.models import IncidentRequest, IncidentState
from autoclusters.core.recovery_cost import RecoveryFigures
from autoclusters.core.recovery_history import (
    FiguresFromHistory,
    MeasuredRecovery,
    RecoveryFiguresCall,
    measured_from,
)
from autoclusters.core.recovery_loss import RecoveryLoss
from autoclusters.integrations import temporal
from tests.helpers import dev_server_env, eventually

env = dev_server_env  # a Temporal dev server for this module (visibility lists runs)
CLOSED = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def _state(cluster: str, *losses: RecoveryLoss) -> IncidentState:
    req = IncidentRequest(
        incident_id=f"INC-{uuid.uuid4().hex[:6]}", cluster=cluster, node="gpu-01",
        fault="XID_79", opened_at=CLOSED,
    )  # fmt: skip
    return IncidentState(request=req, status="resolved", recovery_losses=list(losses))


def _loss(path: str, resume_s: float | None, expected: str = "") -> RecoveryLoss:
    return RecoveryLoss(
        job_id=1, path=path, estimated_path=expected, gpus=8, resume_s=resume_s,
        redo_s=0.0 if resume_s is not None else None,
    )  # fmt: skip


def test_unmeasured_losses_are_no_measurement_and_the_plans_path_counts() -> None:
    state = _state("c", _loss("requeue", 17.0, "spare"), _loss("in-job", None))
    assert measured_from(state.recovery_losses, CLOSED) == [
        MeasuredRecovery(path="spare", resume_s=17.0, closed_at=CLOSED)
    ]


# --- on a dev server -----------------------------------------------------------------------


@workflow.defn(name="NodeRemediation", sandboxed=False)
class ClosedIncident:
    """Stands in for a NodeRemediation run: returns the incident state it is given."""

    @workflow.run
    async def run(self, state: IncidentState) -> IncidentState:
        await workflow.wait_condition(lambda: self.close)
        return state

    def __init__(self) -> None:
        self.close = False

    @workflow.signal
    def done(self) -> None:
        self.close = True


async def _listed(env: WorkflowEnvironment, query: str, n: int) -> None:
    """Visibility lists a run a moment after it changed: wait until it lists `n`."""

    async def enough() -> bool:
        return len([w async for w in env.client.list_workflows(query)]) >= n

    await eventually(enough, 20, f"visibility to list {n} for {query}")


async def test_the_clusters_closed_incidents_are_read_from_temporal(
    env: WorkflowEnvironment,
) -> None:
    cluster, other = f"c-{uuid.uuid4().hex[:6]}", f"c-{uuid.uuid4().hex[:6]}"
    queue = f"tq-{uuid.uuid4()}"
    async with Worker(env.client, task_queue=queue, workflows=[ClosedIncident]):
        handles = []
        for c, state in [
            (cluster, _state(cluster, _loss("in-job", 1.2), _loss("requeue", 16.0))),
            (cluster, _state(cluster, _loss("in-job", 1.4))),
            (other, _state(other, _loss("in-job", 9.9))),
            (cluster, _state(cluster, _loss("in-job", 7.7))),  # still open
        ]:
            handles.append(
                await env.client.start_workflow(
                    ClosedIncident.run,
                    state,
                    id=f"wf-{uuid.uuid4()}",
                    task_queue=queue,
                    search_attributes=TypedSearchAttributes(
                        [SearchAttributePair(temporal.CLUSTER, c)]
                    ),
                    execution_timeout=timedelta(minutes=5),
                )  # fmt: skip
            )
        for h in handles[:3]:
            await h.signal(ClosedIncident.done)
            await h.result()
        await _listed(env, f"Cluster = '{cluster}' AND ExecutionStatus = 'Completed'", 2)
        read = await TemporalRecoveries(env.client).recent(cluster, timedelta(days=1))
        await handles[3].terminate()
    assert read.incidents == 2 and read.unreadable == 0
    assert sorted((s.path, s.resume_s) for s in read.samples) == [
        ("in-job", 1.2), ("in-job", 1.4), ("requeue", 16.0)
    ]  # fmt: skip


# --- the reads, on a stand-in client -------------------------------------------------------


@dataclass
class _Run:
    id: str
    run_id: str
    close_time: datetime


class _Handle:
    def __init__(self, client: _Client, run_id: str) -> None:
        self._client, self._run_id = client, run_id

    async def result(self, follow_runs: bool = True) -> IncidentState:
        self._client.fetched.append(self._run_id)
        found = self._client.results[self._run_id]
        if isinstance(found, Exception):
            raise found
        return found


class _Client:
    def __init__(self) -> None:
        self.results: dict[str, IncidentState | Exception] = {}
        self.fetched: list[str] = []
        self.fail: Exception | None = None

    async def _runs(self) -> AsyncIterator[_Run]:
        if self.fail is not None:
            raise self.fail
        for run_id in reversed(list(self.results)):  # newest first, as Temporal lists
            yield _Run(id="wf", run_id=run_id, close_time=CLOSED)

    def list_workflows(self, query: str, limit: int | None = None) -> AsyncIterator[_Run]:
        return self._runs()

    def get_workflow_handle(self, wf_id: str, run_id: str, result_type: Any) -> _Handle:
        return _Handle(self, run_id)


async def test_each_closed_run_is_read_once() -> None:
    client = _Client()
    client.results["r1"] = _state("c", _loss("requeue", 15.0))
    reader = TemporalRecoveries(client)  # type: ignore[arg-type]
    first = await reader.recent("c", timedelta(days=1))
    client.results["r2"] = _state("c", _loss("requeue", 31.0))
    second = await reader.recent("c", timedelta(days=1))
    assert client.fetched == ["r1", "r2"]
    assert [s.resume_s for s in first.samples] == [15.0]
    assert sorted(s.resume_s for s in second.samples) == [15.0, 31.0]


async def test_a_failed_list_raises_and_an_unreadable_result_is_counted() -> None:
    client = _Client()
    client.results["r1"] = ValueError("not an incident state")
    client.results["r2"] = _state("c", _loss("in-job", 1.3))
    reader = TemporalRecoveries(client)  # type: ignore[arg-type]
    read = await reader.recent("c", timedelta(days=1))
    assert read.incidents == 2 and read.unreadable == 1 and len(read.samples) == 1
    client.fail = RPCError("visibility down", RPCStatusCode.UNAVAILABLE, b"")
    with pytest.raises(RPCError):
        await reader.recent("c", timedelta(days=1))


async def test_the_activity_gives_the_figures_over_the_policys() -> None:
    asked: list[tuple[str, timedelta]] = []

    async def recent(cluster: str, within: timedelta) -> HistoryRead:
        asked.append((cluster, within))
        at = [CLOSED + timedelta(minutes=i) for i in range(4)]
        return HistoryRead(
            incidents=4,
            samples=[
                MeasuredRecovery(path="requeue", resume_s=s, closed_at=t)
                for s, t in zip([30.0, 28.0, 32.0, 90.0], at, strict=True)
            ],
        )

    acts = RecoveryHistoryActivities(recent)
    call = RecoveryFiguresCall(
        cluster="c1",
        prior=RecoveryFigures(in_job_s=1.5, requeue_s=20),
        spec=FiguresFromHistory(last=10, enough=3, within_days=7),
    )
    read = await ActivityEnvironment().run(acts.recovery_figures, call)
    assert asked == [("c1", timedelta(days=7))]
    assert read.figures.requeue_s == 31.0  # median of 28, 30, 32, 90
    assert read.figures.in_job_s == 1.5  # none measured: the policy's
    assert read.incidents == 4
