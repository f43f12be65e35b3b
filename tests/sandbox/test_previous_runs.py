"""A sandbox coming up again closes the runs its previous life left open, and only those:
closed histories stay readable (sandbox/previous_runs.py). On a real Temporal dev server."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import WorkflowExecutionStatus
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from autoclusters.sandbox.previous_runs import REASON, close_previous_runs
from tests.helpers import eventually, start_temporal

pytestmark = pytest.mark.integration  # a Temporal dev server of its own


@workflow.defn(name="LeftOpen")
class LeftOpen:
    @workflow.run
    async def run(self, finish: bool) -> str:
        if not finish:
            await workflow.wait_condition(lambda: False)
        return "done"


async def test_open_runs_are_terminated_and_closed_ones_kept() -> None:
    env = await start_temporal()
    try:
        client, tq = env.client, f"tq-{uuid.uuid4()}"
        # Unsandboxed: this module imports the API's test helpers, which a sandbox refuses.
        runner = UnsandboxedWorkflowRunner()
        async with Worker(client, task_queue=tq, workflows=[LeftOpen], workflow_runner=runner):
            done = await client.start_workflow(LeftOpen.run, True, id="finished", task_queue=tq)
            await done.result()
            left: list[Any] = [
                await client.start_workflow(LeftOpen.run, False, id=f"open-{i}", task_queue=tq)
                for i in range(2)
            ]

            # What it closes it finds through visibility, which lists a run a moment after
            # its start (a sandbox's previous runs are long listed when it comes up again).
            async def both_listed() -> bool:
                running = await client.count_workflows("ExecutionStatus = 'Running'")
                return running.count >= 2

            await eventually(both_listed, what="both open runs listed")
            closed = await close_previous_runs(client)
        assert sorted(closed) == ["open-0", "open-1"]
        for handle in left:
            desc = await handle.describe()
            assert desc.status == WorkflowExecutionStatus.TERMINATED
        assert (await done.describe()).status == WorkflowExecutionStatus.COMPLETED
        assert REASON.startswith("sandbox came up again")
        # Nothing open is left: a second pass closes nothing.
        assert await close_previous_runs(client) == []
    finally:
        await env.shutdown()
