"""Recording a runbook as it runs: every step on the incident's timeline, every
notification sent without ever blocking the remediation."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.models import IncidentState, Notification, StepRecord
    from autoclusters.core.unavailable import OUTAGE_TYPES

from autoclusters.workflows.outage import ride_out

T = TypeVar("T")

# Slurm and cloud calls fail transiently (controller busy, 429s); an unknown node, a
# policy refusal or bad credentials do not.
RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
    non_retryable_error_types=["UnknownNode", "NodeBusy", "PolicyForbids", "BadCredentials"],
)
# A runbook step's own retry: the same, except that an outage (a dependency unreachable)
# is not retried here but reaches the step at once, which waits it out with the outage shown
# on the incident (Timeline._ride_out) for as long as the policy's budget allows.
STEP_RETRY = RetryPolicy(
    initial_interval=RETRY.initial_interval,
    backoff_coefficient=RETRY.backoff_coefficient,
    maximum_interval=RETRY.maximum_interval,
    maximum_attempts=RETRY.maximum_attempts,
    non_retryable_error_types=[*(RETRY.non_retryable_error_types or []), *OUTAGE_TYPES],
)
NOTIFY_RETRY = RetryPolicy(maximum_attempts=3)
# Every activity that can take more than a few seconds heartbeats (activities/heartbeat.py):
# a worker killed mid-step is noticed within this, and the retry starts on another worker.
HEARTBEAT = timedelta(seconds=10)


def cause_of(err: BaseException) -> BaseException:
    return err.cause if isinstance(err, ActivityError) and err.cause else err


class Timeline:
    """Base of runbook workflows: `self._state` is the incident, steps are recorded on it."""

    _state: IncidentState

    async def _step(
        self,
        name: str,
        run: Callable[[], Awaitable[T]],
        detail: Callable[[T], str] | None = None,
        *,
        ride_out: bool = True,
    ) -> T:
        """Run one runbook step and record it on the timeline, whatever its outcome. An
        outage of a system the step reads is waited out (`ride_out`; never for a
        notification, which must not hold the runbook)."""
        rec = StepRecord(name=name, started_at=workflow.now())
        self._state.steps.append(rec)
        # A step can run inside another (a notification while a step waits for a human or
        # the fleet guard): when it ends, the enclosing step is current again.
        enclosing = self._state.current_step
        self._state.current_step = name
        self._show_current(name)
        outages: list[str] = []
        try:
            out = await (self._ride_out(name, run, rec, outages) if ride_out else run())
        except GeneratorExit:
            raise  # the worker evicted this workflow from its cache: not the step's outcome
        except BaseException as e:
            rec.outcome, rec.finished_at = "failed", workflow.now()
            rec.detail = str(cause_of(e))
            # A failed outermost step stays current until the incident closes.
            self._state.current_step = enclosing or name
            if enclosing:
                self._show_current(enclosing)
            raise
        rec.outcome, rec.finished_at = "ok", workflow.now()
        rec.detail = "; ".join(p for p in [detail(out) if detail else "", *outages] if p)
        self._state.current_step = enclosing
        if enclosing:
            self._show_current(enclosing)
        return out

    def _show_current(self, step: str) -> None:
        """What the Temporal UI shows as the incident's current details (overridable)."""

    def _outage_budget(self) -> tuple[float, float]:
        """(budget, notify after) in seconds; the runbook's policy overrides these."""
        return 900.0, 60.0

    async def _ride_out(
        self,
        what: str,
        run: Callable[[], Awaitable[T]],
        rec: StepRecord | None = None,
        outages: list[str] | None = None,
    ) -> T:
        """`run()`, waiting out an outage of a system it reads (workflows/outage.py).

        Each outage is on the step's detail while it lasts ("slurmctld unreachable for 48 s;
        waiting up to 900 s") and after ("slurmctld unreachable for 62 s"), and in Slack
        once it lasted the policy's `outage_notify_after_s`. Past `outage_budget_s` the
        step fails, and the runbook's failure path leaves the node drained and pages a human.
        """
        budget_s, notify_after_s = self._outage_budget()
        told: list[bool] = []

        async def waiting(who: str, lasted: float) -> None:
            if rec is not None:
                rec.detail = f"{who} unreachable for {lasted:.0f} s; waiting up to {budget_s:.0f} s"
            if lasted >= notify_after_s and not told:
                told.append(True)
                await self._notify(
                    "dependency_unavailable",
                    f"{who} unreachable for {lasted:.0f} s during {what} of "
                    f"{self._state.request.node}; the incident waits for it (up to "
                    f"{budget_s:.0f} s) and acts on nothing it cannot read",
                    "warning",
                )

        async def back(who: str, lasted: float) -> None:
            note = f"{who} unreachable for {lasted:.0f} s"
            if outages is not None:
                outages.append(note)
            if told:
                await self._notify("dependency_back", f"{note}; back, {what} goes on", "info")

        return await ride_out(what, run, budget_s=budget_s, on_outage=waiting, on_back=back)

    async def _notify(self, event: str, text: str, severity: str = "info") -> None:
        req = self._state.request
        note = Notification(
            incident_id=req.incident_id,
            cluster=req.cluster,
            node=req.node,
            fault=req.fault,
            event=event,
            text=text,
            severity=severity,
        )
        # A notifier outage must never block the remediation itself.
        try:
            await self._step(
                f"notify_{event}",
                lambda: workflow.execute_activity(
                    contracts.notify,
                    note,
                    start_to_close_timeout=timedelta(seconds=30),
                    heartbeat_timeout=HEARTBEAT,
                    retry_policy=NOTIFY_RETRY,
                ),
                ride_out=False,
            )
        except ActivityError:
            workflow.logger.warning("notification %s for %s failed", event, req.incident_id)

    def _timeline_text(self) -> str:
        start = self._state.request.opened_at
        parts = [
            f"{s.name} +{(s.finished_at - start).total_seconds():.1f}s"
            for s in self._state.steps
            if s.finished_at is not None
        ]
        return ", ".join(parts)
