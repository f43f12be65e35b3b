"""A run a worker dropped issues nothing into another run (time-skipping server, fake cluster).

A worker that stops with runs still open in its cache does not evict them (sdk-core evicts
no idle run at shutdown; sdk-python#494, #1849): their coroutines are left to the garbage
collector, which closes each by throwing GeneratorExit into it, on whatever thread collects
it. A `finally` that issues a command then issues it on the workflow loop that is current
there: another run's, whose next task then fails its replay ("UpsertWorkflowSearchAttributesMachine
does not handle ... ActivityTaskScheduled", seen in `make test`'s workers). So the runbook's
clean-ups issue no command on the way out of a coroutine being closed.

Each test leaves an incident open in a worker that stops (waiting for an approval: its
clean-up publishes the state; mid-repair: its clean-up gives back the guard's slot), then
runs a probe workflow that collects garbage inside its own activation, and reads the
probe's history: only the probe's own commands, and the dropped run's coroutine was
closed there.
"""

from __future__ import annotations

import asyncio
import gc
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from types import CoroutineType
from typing import Any

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from autoclusters.workflows.remediation import NodeRemediation
from tests.fakes.systems import FakeCloud
from tests.workflows.test_remediation_workflow import _approval_pending, _fleet, _policy

pytestmark = pytest.mark.workflow


@workflow.defn(sandboxed=False)
class CollectsGarbage:
    """Collects the process's garbage inside its own activation, as the collector may at
    any allocation of any run; says how many suspended `frame` coroutines were closed."""

    @workflow.run
    async def run(self, frame: str) -> int:
        before = len(_suspended(frame))
        gc.collect()
        return before - len(_suspended(frame))


def _suspended(name: str) -> list[CoroutineType[Any, Any, Any]]:
    """The process's suspended coroutines of workflows/ named `name`. `type()`, not
    isinstance: the process also holds the sandbox's restricted proxies, which refuse
    a read of their `__class__`."""
    return [
        c
        for c in gc.get_objects()
        if type(c) is CoroutineType
        and c.cr_frame is not None
        and c.cr_code.co_name == name
        and "/workflows/" in c.cr_code.co_filename
    ]


@contextmanager
def _no_collection() -> Iterator[None]:
    """Only the probe collects: a collection anywhere else would close the dropped run
    outside any workflow loop (what the test is not about)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def _probe(env: WorkflowEnvironment, frame: str) -> tuple[int, list[str]]:
    """Run the probe on a worker of its own: the coroutines it closed, and its history's
    command events."""
    queue = f"probe-{uuid.uuid4()}"
    async with Worker(
        env.client,
        task_queue=queue,
        workflows=[CollectsGarbage],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        handle = await env.client.start_workflow(
            CollectsGarbage.run, frame, id=queue, task_queue=queue
        )
        closed = await handle.result()
    commands = [
        EventType.Name(e.event_type)
        async for e in handle.fetch_history_events()
        if e.event_type
        in (
            EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES,
            EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
            EventType.EVENT_TYPE_TIMER_STARTED,
            EventType.EVENT_TYPE_MARKER_RECORDED,
        )
    ]
    return closed, commands


async def test_an_approval_left_open_publishes_nothing_into_another_run(
    env: WorkflowEnvironment,
) -> None:
    with _no_collection():
        async with _fleet(env) as f:
            req = f.request(policy=_policy(mode="approve"))
            handle = await _approval_pending(f, req)
            await handle.terminate(reason="its worker stops with it open")
        assert _suspended("repair"), "the approval's coroutine is still suspended"
        closed, commands = await _probe(env, "repair")
    assert closed >= 1  # the dropped run's approval was closed inside the probe's activation
    assert commands == []


async def test_a_repair_left_in_flight_gives_back_nothing_into_another_run(
    env: WorkflowEnvironment,
) -> None:
    with _no_collection():
        async with _fleet(env, cloud=lambda s: FakeCloud(s, hold=True)) as f:
            handle = await f.start(f.request())
            await asyncio.wait_for(f.cloud.started.wait(), timeout=30)  # guard-ed repair
            state = await handle.query(NodeRemediation.status)
            assert state.current_step == "repair"
            await handle.terminate(reason="its worker stops with it open")
        assert _suspended("_repair_until_healthy")
        closed, commands = await _probe(env, "_repair_until_healthy")
    assert closed >= 1
    assert commands == []
