"""NodeRemediation: the runbook for one faulty node, one incident per node.

notify → drain → requeue the node's jobs (restart at once elsewhere) → replace the machine
→ wait until it registers → return it to service → close with the timeline.

A failed repair leaves the node drained (never return an unproven node) and fails the
incident so a human looks at it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.cloud import CloudActivities
    from activities.notify import NotifyActivities
    from activities.slurm import SlurmActivities
    from autoclusters.models import (
        DrainInput,
        IncidentRequest,
        IncidentState,
        Notification,
        ReplaceInput,
        ReplaceResult,
        RequeueInput,
        ReturnInput,
        StepRecord,
        WaitRegisteredInput,
        drain_reason,
    )

T = TypeVar("T")

# Slurm and cloud calls fail transiently (controller busy, 429s); an unknown node does not.
RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
    non_retryable_error_types=["UnknownNode"],
)
NOTIFY_RETRY = RetryPolicy(maximum_attempts=3)


@workflow.defn
class NodeRemediation:
    @workflow.init
    def __init__(self, req: IncidentRequest) -> None:
        # Built from the input so the `status` query answers from the first moment.
        self._state = IncidentState(request=req)

    @workflow.query
    def status(self) -> IncidentState:
        return self._state

    @workflow.run
    async def run(self, req: IncidentRequest) -> IncidentState:
        state = self._state
        t = req.timeouts
        slurm = timedelta(seconds=t.slurm_step_s)

        await self._notify("opened", f"fault {req.fault} on {req.node}; remediation started")
        try:
            await self._step(
                "drain",
                lambda: workflow.execute_activity_method(
                    SlurmActivities.drain_node,
                    DrainInput(node=req.node, reason=drain_reason(req.incident_id, req.fault)),
                    start_to_close_timeout=slurm,
                    retry_policy=RETRY,
                ),
            )
            requeued = await self._step(
                "requeue",
                lambda: workflow.execute_activity_method(
                    SlurmActivities.requeue_jobs,
                    RequeueInput(node=req.node, incident_id=req.incident_id),
                    start_to_close_timeout=slurm,
                    retry_policy=RETRY,
                ),
                detail=lambda r: f"requeued {r.requeued or 'no jobs'}",
            )
            state.requeued_jobs = requeued.requeued

            repair = await self._step(
                "repair",
                lambda: workflow.execute_activity_method(
                    CloudActivities.replace_node,
                    ReplaceInput(node=req.node, incident_id=req.incident_id),
                    start_to_close_timeout=timedelta(seconds=t.repair_s),
                    heartbeat_timeout=timedelta(seconds=30),
                    retry_policy=RETRY,
                ),
                detail=lambda r: f"{r.old_vm_id} -> {r.new_vm_id}",
            )
            state.old_vm_id, state.new_vm_id = repair.old_vm_id, repair.new_vm_id
            await self._wait_registered(req, repair)
            back = await self._step(
                "return_to_service",
                lambda: workflow.execute_activity_method(
                    SlurmActivities.return_to_service,
                    ReturnInput(node=req.node, incident_id=req.incident_id),
                    start_to_close_timeout=slurm,
                    retry_policy=RETRY,
                ),
                detail=lambda r: r.state_after + (f" ({r.detail})" if r.detail else ""),
            )
            if not back.returned:
                raise ApplicationError(f"{req.node} not returned to service: {back.detail}")
        except (ActivityError, ApplicationError) as err:
            cause = err.cause if isinstance(err, ActivityError) and err.cause else err
            state.status, state.error = "failed", str(cause)
            state.closed_at = workflow.now()
            drain = state.step("drain")
            left = "left drained" if drain and drain.outcome == "ok" else "not drained"
            await self._notify("failed", f"{cause}; {req.node} {left}, needs a human")
            raise ApplicationError(
                f"remediation of {req.node} failed: {cause}",
                type="RemediationFailed",
                non_retryable=True,
            ) from err

        state.status, state.closed_at = "resolved", workflow.now()
        await self._notify("resolved", self._timeline_text())
        return state

    async def _wait_registered(self, req: IncidentRequest, repair: ReplaceResult) -> None:
        await self._step(
            "wait_registered",
            lambda: workflow.execute_activity_method(
                SlurmActivities.wait_node_registered,
                WaitRegisteredInput(node=req.node, since=repair.stopped_at),
                start_to_close_timeout=timedelta(seconds=req.timeouts.wait_registered_s),
                heartbeat_timeout=timedelta(seconds=30),
                retry_policy=RETRY,
            ),
            detail=lambda n: n.display_state,
        )

    async def _step(
        self,
        name: str,
        run: Callable[[], Awaitable[T]],
        detail: Callable[[T], str] | None = None,
    ) -> T:
        """Run one runbook step and record it on the timeline, whatever its outcome."""
        rec = StepRecord(name=name, started_at=workflow.now())
        self._state.steps.append(rec)
        self._state.current_step = name
        try:
            out = await run()
        except BaseException as e:
            rec.outcome, rec.finished_at = "failed", workflow.now()
            cause = e.cause if isinstance(e, ActivityError) and e.cause else e
            rec.detail = str(cause)
            raise
        rec.outcome, rec.finished_at = "ok", workflow.now()
        rec.detail = detail(out) if detail else ""
        self._state.current_step = None
        return out

    async def _notify(self, event: str, text: str) -> None:
        req = self._state.request
        note = Notification(
            incident_id=req.incident_id,
            cluster=req.cluster,
            node=req.node,
            fault=req.fault,
            event=event,
            text=text,
        )
        # A notifier outage must never block the remediation itself.
        try:
            await self._step(
                f"notify_{event}",
                lambda: workflow.execute_activity_method(
                    NotifyActivities.notify,
                    note,
                    start_to_close_timeout=timedelta(seconds=30),
                    retry_policy=NOTIFY_RETRY,
                ),
            )
        except ActivityError:
            workflow.logger.warning("notification %s for %s failed", event, req.incident_id)

    def _timeline_text(self) -> str:
        start = self._state.request.opened_at
        parts: list[Any] = []
        for s in self._state.steps:
            if s.finished_at is not None:
                parts.append(f"{s.name} +{(s.finished_at - start).total_seconds():.1f}s")
        return "resolved; " + ", ".join(parts)
