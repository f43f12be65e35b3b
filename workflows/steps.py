"""The step kernel every workflow runs its runbook on: each step recorded on the workflow's
timeline (started, outcome, detail), shown as the workflow's current step (its status and
the Temporal UI's current details), and an outage of what it reads waited out
(workflows/outage.py) with the outage shown on the step while it lasts and noted after.

`Steps.activity` is the usual step: one activity with the workflow's standard timeouts and
retry policy, and a summary in the operator's words that the Temporal UI shows for the
activity (`drain gpu-02 (XID_79)`). `Steps.call` runs an activity the same way outside a
step (a read inside a larger step). Every workflow runs every activity through one of the
two: this module is the only caller of `workflow.execute_activity`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from autoclusters.core.models import StepRecord
    from autoclusters.core.unavailable import OUTAGE_TYPES

from autoclusters.workflows import outage
from autoclusters.workflows.own_run import OwnRun

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
# on the step for as long as the budget allows.
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


class StepLog(Protocol):
    """Where a workflow keeps its steps: `begin` records a step that starts, `end` is told
    when it ended (its record filled in), `current_step` is the step running now."""

    current_step: str | None

    def begin(self, name: str) -> StepRecord: ...

    def end(self, rec: StepRecord) -> None: ...


class Timeline(Protocol):
    """A workflow state with its steps on it (IncidentState, ClusterState, OpsState)."""

    steps: list[StepRecord]
    current_step: str | None


class OnState:
    """The StepLog of a state that holds its steps itself."""

    def __init__(self, state: Timeline) -> None:
        self._state = state

    @property
    def current_step(self) -> str | None:
        return self._state.current_step

    @current_step.setter
    def current_step(self, name: str | None) -> None:
        self._state.current_step = name

    def begin(self, name: str) -> StepRecord:
        rec = StepRecord(name=name, started_at=workflow.now())
        self._state.steps.append(rec)
        return rec

    def end(self, rec: StepRecord) -> None:
        pass


class Unrecorded:
    """The StepLog of a workflow that keeps no timeline (FleetGuard; GpuSharing outside a
    move): its activities run as `Steps.call`, and a step it ran would be kept nowhere."""

    def __init__(self) -> None:
        self.current_step: str | None = None

    def begin(self, name: str) -> StepRecord:
        return StepRecord(name=name, started_at=workflow.now())

    def end(self, rec: StepRecord) -> None:
        pass


Tell = Callable[[str, str, str], Awaitable[None]]  # (event, text, severity)


@dataclass(frozen=True)
class Defaults:
    """A workflow's standard activity options, and how long an outage is waited out."""

    timeout: timedelta
    retry: RetryPolicy = field(default_factory=lambda: STEP_RETRY)
    heartbeat: timedelta | None = HEARTBEAT
    outage_budget_s: float = outage.DEFAULT_BUDGET_S
    # An outage that lasts this long is told (`tell`), and told again once it is over.
    outage_notify_after_s: float = 60.0


async def _tell_nobody(event: str, text: str, severity: str) -> None:
    pass


class Steps:
    """The kernel. `show` puts the current step in the UI (None: there is none);
    `keep_last`: an outermost step stays current once it ended, until the next one starts
    (a cluster's progress line); otherwise the step it ran in is current again (or none).
    `tell` notifies humans of a long outage; `subject` names what the workflow acts on in
    that message."""

    def __init__(
        self,
        log: StepLog,
        defaults: Defaults,
        *,
        show: Callable[[str | None], None] | None = None,
        keep_last: bool = False,
        tell: Tell = _tell_nobody,
        subject: str = "",
    ) -> None:
        self.log = log
        self.defaults = defaults
        self._show = show or (lambda _: None)
        self._keep_last = keep_last
        self._tell = tell
        self._subject = subject
        self.own_run = OwnRun()  # commands only on it (workflows/own_run.py)

    async def step(
        self,
        name: str,
        run: Callable[[], Awaitable[T]],
        detail: Callable[[T], str] | None = None,
        *,
        ride_out: bool = True,
    ) -> T:
        """Run one step and record it on the timeline, whatever its outcome. An outage of
        a system the step reads is waited out (never for a notification, `ride_out=False`,
        which must not hold the runbook)."""
        rec = self.log.begin(name)
        # A step can run inside another (a notification while a step waits for a human or
        # the fleet guard): when it ends, the enclosing step is current again.
        enclosing = self.log.current_step
        self.log.current_step = name
        self._show(name)
        notes: list[str] = []
        try:
            out = await (self.ride_out(name, run, rec, notes) if ride_out else run())
        except GeneratorExit:
            raise  # a dropped run closed by the collector (workflows/own_run.py): no outcome
        except BaseException as e:
            rec.outcome, rec.finished_at = "failed", workflow.now()
            rec.detail = str(cause_of(e))
            self.log.end(rec)
            # A failed outermost step stays current until the workflow closes.
            self.log.current_step = enclosing or name
            if enclosing:
                self._show(enclosing)
            raise
        rec.outcome, rec.finished_at = "ok", workflow.now()
        rec.detail = "; ".join(p for p in [detail(out) if detail else "", *notes] if p)
        self.log.end(rec)
        if enclosing or not self._keep_last:
            self.log.current_step = enclosing
            if enclosing:
                self._show(enclosing)
        return out

    async def activity(
        self,
        name: str,
        fn: Callable[..., Awaitable[T]],
        arg: Any,
        summary: str,
        detail: Callable[[T], str] | None = None,
        **options: Any,
    ) -> T:
        """A step that is one activity (`call`'s options)."""
        return await self.step(name, lambda: self.call(fn, arg, summary, **options), detail)

    async def call(
        self,
        fn: Callable[..., Awaitable[T]],
        arg: Any,
        summary: str,
        *,
        timeout: timedelta | None = None,
        heartbeat: timedelta | None | bool = True,
        retry: RetryPolicy | None = None,
    ) -> T:
        """Run one activity with the workflow's standard options (each may be overridden;
        `heartbeat=None`: none) and `summary`, what the Temporal UI shows for it."""
        d = self.defaults
        self.own_run.check()
        return await workflow.execute_activity(
            fn,
            arg,
            start_to_close_timeout=d.timeout if timeout is None else timeout,
            heartbeat_timeout=d.heartbeat if heartbeat is True else heartbeat or None,
            retry_policy=d.retry if retry is None else retry,
            summary=summary,
        )

    async def ride_out(
        self,
        what: str,
        run: Callable[[], Awaitable[T]],
        rec: StepRecord | None = None,
        notes: list[str] | None = None,
    ) -> T:
        """`run()`, waiting out an outage of a system it reads (workflows/outage.py).

        Each outage is on the step's detail while it lasts ("slurmctld unreachable for 48 s;
        waiting up to 900 s") and after ("slurmctld unreachable for 62 s"), and told once it
        lasted `outage_notify_after_s`. Past `outage_budget_s` the step fails.
        """
        budget_s = self.defaults.outage_budget_s
        told: list[bool] = []

        # `said`: "slurmctld unreachable", or what a controller that answers refuses
        # (core/unavailable.py outage_said).
        async def waiting(said: str, lasted: float) -> None:
            if rec is not None:
                rec.detail = f"{said} for {lasted:.0f} s; waiting up to {budget_s:.0f} s"
            if lasted >= self.defaults.outage_notify_after_s and not told:
                told.append(True)
                await self._tell(
                    "dependency_unavailable",
                    f"{said} for {lasted:.0f} s during {what} of "
                    f"{self._subject}; the incident waits for it (up to "
                    f"{budget_s:.0f} s) and acts on nothing it cannot read",
                    "warning",
                )

        async def back(said: str, lasted: float) -> None:
            note = f"{said} for {lasted:.0f} s"
            if notes is not None:
                notes.append(note)
            if told:
                await self._tell("dependency_back", f"{note}; back, {what} goes on", "info")

        return await outage.ride_out(what, run, budget_s=budget_s, on_outage=waiting, on_back=back)
