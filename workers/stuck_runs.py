"""A run whose history our own workflow code cannot replay is reset to its last point that
replays, so the incident goes on instead of waiting forever.

Why: Temporal can write a history that its own SDK cannot replay. Seen here (CI, the outage
matrix's "Temporal away at repair"): after a server restart, an update (an agent's health
snapshot, an alert's repeat) reached a run in the same workflow task as its repair step's
completion. The worker, still holding the run in its cache, answered with the next step's
command before the update's acceptance; replaying the same events from the start, the SDK
accepts the update first. Any eviction then fails every workflow task with a
nondeterminism error: the incident stays open at its step, its node drained, and nothing
says so. The same stops a run after a deploy that changed a step already taken.

What an SRE would do by hand (`temporal workflow reset`), done by the worker: a running
workflow of our task queue whose last event is a failed workflow task (a failing task's
retries are not written), older than `grace_s`, is replayed here against the code this
worker runs. If it replays, it is left alone (whatever fails it is not a replay problem).
If not, the newest workflow-task completion whose history before it replays becomes the
reset point: the run restarts there, the steps after it run again (activities are
idempotent: requeue keeps its marker, a repair adopts its cloud operation), and the
signals and updates after it are applied again. At most `max_resets` per workflow id,
so code that cannot replay at all is left to a human, loudly.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflowservice.v1 import (
    GetWorkflowExecutionHistoryReverseRequest,
    ResetWorkflowExecutionRequest,
)
from temporalio.client import Client, WorkflowHistory
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

log = logging.getLogger(__name__)

REASON = (
    "autoclusters: history not replayable by this worker's code; "
    "reset to the last point that replays"
)


@dataclass(frozen=True)
class StuckRun:
    workflow_id: str
    run_id: str
    workflow_type: str
    failed_for_s: float


@dataclass(frozen=True)
class ResetOutcome:
    """What was done about one stuck run: `outcome` is reset; not_replay (its failure is
    not a replay problem: left alone); no_reset_point or limit (left to a human)."""

    run: StuckRun
    outcome: str
    reset_to: int | None = None
    new_run_id: str | None = None
    detail: str = ""


async def find_stuck(client: Client, task_queue: str, grace_s: float) -> list[StuckRun]:
    """Running workflows of `task_queue` whose last event is a failed workflow task."""
    stuck = []
    query = f'TaskQueue="{task_queue}" AND ExecutionStatus="Running"'
    async for wf in client.list_workflows(query):
        resp = await client.workflow_service.get_workflow_execution_history_reverse(
            GetWorkflowExecutionHistoryReverseRequest(
                namespace=client.namespace,
                execution=WorkflowExecution(workflow_id=wf.id, run_id=wf.run_id),
                maximum_page_size=1,
            )
        )
        events = resp.history.events
        if not events or events[0].event_type != EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            continue
        age = _age_s(events[0])
        if age >= grace_s:
            stuck.append(StuckRun(wf.id, wf.run_id, wf.workflow_type, age))
    return stuck


def _age_s(event: HistoryEvent) -> float:
    return time.time() - event.event_time.ToSeconds()


async def replay_failure(replayer: Replayer, history: WorkflowHistory) -> Exception | None:
    """Why this worker's code cannot replay `history` (a NondeterminismError when its
    commands differ from the history's); None when it replays."""
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    return result.replay_failure


async def reset_point(replayer: Replayer, history: WorkflowHistory) -> int | None:
    """The newest workflow-task-completed event whose history before it replays (None: no
    such point). A reset there keeps the events before it and runs that task again."""
    events = list(history.events)
    completed = [
        e.event_id for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    ]
    for point in reversed(completed):
        prefix = WorkflowHistory(history.workflow_id, [e for e in events if e.event_id < point])
        if await replay_failure(replayer, prefix) is None:
            return point
    return None


class StuckRunDoctor:
    """Finds stuck runs of `task_queue` and resets those whose history this code cannot
    replay (the module's docstring says when and why)."""

    def __init__(
        self,
        client: Client,
        task_queue: str,
        workflows: Sequence[type],
        *,
        grace_s: float = 10.0,
        max_resets: int = 3,
        on_outcome: Callable[[ResetOutcome], None] | None = None,
    ) -> None:
        self._client = client
        self._task_queue = task_queue
        self._replayer = Replayer(
            workflows=workflows, data_converter=client.data_converter, namespace=client.namespace
        )
        self._grace_s = grace_s
        self._max_resets = max_resets
        self._resets: dict[str, int] = {}
        self._on_outcome = on_outcome

    async def check_once(self) -> list[ResetOutcome]:
        outcomes = []
        for run in await find_stuck(self._client, self._task_queue, self._grace_s):
            outcome = await self._treat(run)
            level = {"reset": logging.WARNING, "not_replay": logging.INFO}.get(
                outcome.outcome, logging.ERROR
            )
            log.log(
                level,
                "stuck run %s/%s (%s, failing for %.0fs): %s%s",
                run.workflow_id,
                run.run_id,
                run.workflow_type,
                run.failed_for_s,
                outcome.outcome,
                f" to event {outcome.reset_to} as run {outcome.new_run_id}"
                if outcome.outcome == "reset"
                else f": {outcome.detail}",
            )
            if self._on_outcome is not None:
                self._on_outcome(outcome)
            outcomes.append(outcome)
        return outcomes

    async def _treat(self, run: StuckRun) -> ResetOutcome:
        handle = self._client.get_workflow_handle(run.workflow_id, run_id=run.run_id)
        history = await handle.fetch_history()
        failure = await replay_failure(self._replayer, history)
        if not isinstance(failure, NondeterminismError):
            # A step that raises, a sandbox violation: a reset would only fail again.
            detail = (
                "this code replays its history"
                if failure is None
                else f"{type(failure).__name__}: {failure}"
            )
            return ResetOutcome(run, "not_replay", detail=detail)
        why = str(failure)
        if self._resets.get(run.workflow_id, 0) >= self._max_resets:
            return ResetOutcome(
                run, "limit", detail=f"reset {self._max_resets} times already; {why}"
            )
        point = await reset_point(self._replayer, history)
        if point is None:
            return ResetOutcome(run, "no_reset_point", detail=why)
        resp = await self._client.workflow_service.reset_workflow_execution(
            ResetWorkflowExecutionRequest(
                namespace=self._client.namespace,
                workflow_execution=WorkflowExecution(
                    workflow_id=run.workflow_id, run_id=run.run_id
                ),
                reason=REASON,
                workflow_task_finish_event_id=point,
                # One request id per (run, point): a retried check resets once.
                request_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{run.run_id}/{point}")),
                identity="autoclusters-worker stuck-run doctor",
            )
        )
        self._resets[run.workflow_id] = self._resets.get(run.workflow_id, 0) + 1
        return ResetOutcome(run, "reset", reset_to=point, new_run_id=resp.run_id, detail=why)

    async def watch(self, interval_s: float, stop: asyncio.Event) -> None:
        """Check every `interval_s` until `stop`; a failed check (Temporal away) is logged
        and tried again next time."""
        while not stop.is_set():
            try:
                await self.check_once()
            except Exception as e:  # noqa: BLE001 - the next check tries again
                log.warning("stuck-run check failed: %s: %s", type(e).__name__, e)
            try:
                await asyncio.wait_for(stop.wait(), timeout=interval_s)
            except TimeoutError:
                pass
