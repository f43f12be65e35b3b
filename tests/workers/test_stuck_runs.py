"""The stuck-run doctor (workers/stuck_runs.py) on a real Temporal dev server: a run whose
history the worker's code cannot replay is reset to the last point that replays and goes
on to its end; a run that fails for another reason is left alone.

The unreplayable history is made the way a deploy makes one: the run takes two steps
under one version of the code, and a worker with another second step picks it up cold
(Temporal's own update-ordering race, seen in CI, writes the same kind of history).
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker
from temporalio.workflow import NondeterminismError

from autoclusters.workers.metrics import WorkerMetrics
from autoclusters.workers.remediation import WORKFLOWS
from autoclusters.workers.stuck_runs import (
    StuckRunDoctor,
    find_stuck,
    replay_failure,
    reset_point,
)
from tests.helpers import (
    dev_server_env,  # noqa: F401  (this module's `env`: a dev server)
    eventually,
)

pytestmark = pytest.mark.integration  # a Temporal dev server of its own

STEP = timedelta(seconds=10)
HISTORIES = Path(__file__).parents[1] / "histories" / "unreplayable"


@activity.defn
async def drain() -> str:
    return "drain"


@activity.defn
async def reboot() -> str:
    return "reboot"


@activity.defn
async def replace() -> str:
    return "replace"


STEPS = [drain, reboot, replace]


class _Probe:
    def __init__(self) -> None:
        self.go = False

    @workflow.signal
    def proceed(self) -> None:
        self.go = True


@workflow.defn(name="StuckRunProbe", sandboxed=False)
class ProbeBefore(_Probe):
    @workflow.run
    async def run(self) -> list[str]:
        done = [await workflow.execute_activity(drain, start_to_close_timeout=STEP)]
        done.append(await workflow.execute_activity(reboot, start_to_close_timeout=STEP))
        await workflow.wait_condition(lambda: self.go)
        return done


@workflow.defn(name="StuckRunProbe", sandboxed=False)
class ProbeAfter(_Probe):
    """The same first step, another second one: the history of a run of ProbeBefore past
    its second step does not replay here."""

    @workflow.run
    async def run(self) -> list[str]:
        done = [await workflow.execute_activity(drain, start_to_close_timeout=STEP)]
        done.append(await workflow.execute_activity(replace, start_to_close_timeout=STEP))
        await workflow.wait_condition(lambda: self.go)
        return done


@workflow.defn(name="StuckRunBroken", sandboxed=False)
class Broken(_Probe):
    """Fails its workflow task on every try, the same way replayed or not."""

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: self.go)
        raise RuntimeError("a bug in a step, not a replay problem")


async def _waiting_for_signal(handle: WorkflowHandle[Any, Any]) -> bool:
    events = [e async for e in handle.fetch_history_events()]
    done = sum(e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED for e in events)
    return done == 2 and events[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED


async def _two_steps_taken(client: Client, queue: str) -> WorkflowHandle[Any, Any]:
    """A run of ProbeBefore waiting for its signal, its worker gone (no cache left)."""
    async with Worker(client, task_queue=queue, workflows=[ProbeBefore], activities=STEPS):
        handle = await client.start_workflow(
            ProbeBefore.run, id=f"probe-{uuid.uuid4()}", task_queue=queue
        )
        await eventually(lambda: _waiting_for_signal(handle), what="two steps taken")
    return handle


async def _failing(client: Client, queue: str) -> bool:
    return bool(await find_stuck(client, queue, grace_s=0))


async def test_unreplayable_run_is_reset_and_finishes(env: WorkflowEnvironment) -> None:
    client, queue = env.client, f"stuck-{uuid.uuid4()}"
    handle = await _two_steps_taken(client, queue)
    async with Worker(client, task_queue=queue, workflows=[ProbeAfter], activities=STEPS):
        await handle.signal(ProbeAfter.proceed)
        await eventually(lambda: _failing(client, queue), what="the workflow task failing")
        metrics = WorkerMetrics()
        doctor = StuckRunDoctor(
            client, queue, [ProbeAfter], grace_s=0, on_outcome=metrics.stuck_run
        )
        [outcome] = await doctor.check_once()
        assert outcome.outcome == "reset", outcome
        counted = metrics.registry.get_sample_value(
            "autoclusters_worker_stuck_runs_total",
            {"workflow_type": "StuckRunProbe", "outcome": "reset"},
        )
        assert counted == 1
        assert "Nondeterminism" in outcome.detail
        # The point after the first step (the last one both versions agree on).
        events = [e async for e in handle.fetch_history_events()]
        first_done = next(
            e.event_id
            for e in events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
        )
        assert outcome.reset_to == first_done + 3  # WFT scheduled, started, completed
        assert outcome.new_run_id and outcome.new_run_id != handle.result_run_id
        # The signal after the reset point is applied again: the new run ends by itself.
        new_run = client.get_workflow_handle(handle.id, run_id=outcome.new_run_id)
        assert await new_run.result() == ["drain", "replace"]
        assert await doctor.check_once() == []


async def test_a_run_failing_for_another_reason_is_left_alone(env: WorkflowEnvironment) -> None:
    client, queue = env.client, f"stuck-{uuid.uuid4()}"
    async with Worker(client, task_queue=queue, workflows=[Broken], activities=STEPS):
        handle = await client.start_workflow(
            Broken.run, id=f"broken-{uuid.uuid4()}", task_queue=queue
        )
        await handle.signal(Broken.proceed)
        await eventually(lambda: _failing(client, queue), what="the workflow task failing")
        doctor = StuckRunDoctor(client, queue, [Broken], grace_s=0)
        [outcome] = await doctor.check_once()
        assert outcome.outcome == "not_replay", outcome
        assert outcome.detail == "this code replays its history"
        # Nothing was reset: the same run, still failing.
        desc = await handle.describe()
        assert desc.run_id == handle.result_run_id
        assert await _failing(client, queue)


async def test_a_run_past_the_reset_limit_is_left_to_a_human(env: WorkflowEnvironment) -> None:
    """The limit is checked before a reset point is even looked for: at the limit (0 here),
    an unreplayable run is reported `limit` and not reset."""
    client, queue = env.client, f"stuck-{uuid.uuid4()}"
    handle = await _two_steps_taken(client, queue)
    async with Worker(client, task_queue=queue, workflows=[ProbeAfter], activities=STEPS):
        await handle.signal(ProbeAfter.proceed)
        await eventually(lambda: _failing(client, queue), what="the workflow task failing")
        doctor = StuckRunDoctor(client, queue, [ProbeAfter], grace_s=0, max_resets=0)
        [outcome] = await doctor.check_once()
        assert outcome.outcome == "limit", outcome
        desc = await handle.describe()
        assert desc.run_id == handle.result_run_id  # not reset


async def test_the_update_race_history_from_ci_resets_before_the_repair_completion() -> None:
    """The history CI's outage matrix left (Temporal away at repair): the repair's
    completion and two updates in one workflow task, written with the next step's command
    before the updates' acceptance. Our code cannot replay it; the reset point is that
    workflow task's completion, so the new run keeps the repair and takes the next step."""
    text = (HISTORIES / "remediation_update_race.json").read_text()
    history = WorkflowHistory.from_json("remediation-outages-gpu-03", text)
    replayer = Replayer(workflows=WORKFLOWS, data_converter=pydantic_data_converter)
    assert isinstance(await replay_failure(replayer, history), NondeterminismError)
    point = await reset_point(replayer, history)
    assert point is not None
    by_id = {e.event_id: e for e in history.events}
    assert by_id[point].event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    # The events kept: the repair done, nothing after it.
    kept = [e for e in history.events if e.event_id < point]
    assert kept[-3].activity_task_completed_event_attributes.scheduled_event_id
    repair = by_id[kept[-3].activity_task_completed_event_attributes.scheduled_event_id]
    assert repair.activity_task_scheduled_event_attributes.activity_type.name == "repair_node"
