"""What wakes the chaos and outage drivers (sandbox/drivers/history_ticks.py), on a dev server: each
new event of a run's history wakes the watcher at once, nothing wakes it while the run
waits, and the run closing is its last wake-up."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

from temporalio import workflow
from temporalio.api.history.v1 import HistoryEvent
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from autoclusters.sandbox.drivers.history_ticks import HistoryTicks
from tests.helpers import dev_server_env

env = dev_server_env
# Long enough that a wait that returns True within WOKEN_S was woken by an event.
QUIET_S, WOKEN_S = 60.0, 10.0


@workflow.defn(sandboxed=False)
class Waits:
    def __init__(self) -> None:
        self.go = False

    @workflow.run
    async def run(self) -> str:
        await workflow.wait_condition(lambda: self.go)
        return "done"

    @workflow.signal
    def proceed(self) -> None:
        self.go = True


async def _quiet(ticks: HistoryTicks) -> None:
    """Until no event comes for a while: the start's events have all been seen."""
    while await ticks.wait(0.5):
        pass


async def test_each_event_wakes_the_watcher_and_a_waiting_run_does_not(
    env: WorkflowEnvironment,
) -> None:
    queue = f"ticks-{uuid.uuid4()}"
    async with Worker(env.client, task_queue=queue, workflows=[Waits]):
        handle = await env.client.start_workflow(Waits.run, id=queue, task_queue=queue)
        async with HistoryTicks(handle) as ticks:
            assert await asyncio.wait_for(ticks.wait(QUIET_S), WOKEN_S)  # the start
            await _quiet(ticks)
            assert ticks.following
            assert await ticks.wait(0.5) is False  # waiting for its signal: no event
            await handle.signal(Waits.proceed)
            assert await asyncio.wait_for(ticks.wait(QUIET_S), WOKEN_S)
            assert await handle.result() == "done"
            await _quiet(ticks)
            assert not ticks.following  # closed: nothing more to follow


def _scheduled(event_id: int, activity_type: str) -> HistoryEvent:
    e = HistoryEvent(event_id=event_id)
    e.activity_task_scheduled_event_attributes.activity_type.name = activity_type
    return e


async def test_a_watcher_of_an_activity_returns_once_it_is_scheduled_closed_or_not() -> None:
    """What the chaos driver strikes a short step by (sandbox/drivers/chaos.py): the step's
    activity scheduled, seen even when it closed before the watcher looked."""
    ticks = HistoryTicks(handle=None)  # type: ignore[arg-type]  # _note reads no handle
    drain = asyncio.create_task(ticks.scheduled("drain_node"))
    gate = asyncio.create_task(ticks.scheduled("health_gate"))
    await asyncio.sleep(0)  # both waiting
    assert not drain.done() and not gate.done()
    ticks._note(_scheduled(5, "drain_node"))
    await asyncio.wait_for(drain, WOKEN_S)
    assert not gate.done()  # another activity's scheduling wakes nobody else's watcher
    done = HistoryEvent(event_id=7)
    done.activity_task_completed_event_attributes.scheduled_event_id = 5
    ticks._note(done)
    # Scheduled and closed before anyone asked: a later watcher returns at once.
    await asyncio.wait_for(ticks.scheduled("drain_node"), WOKEN_S)
    gate.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await gate
