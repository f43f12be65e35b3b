"""The hand-off to the provider as steps of a runbook (docs/handoff.md): send the evidence
bundle once (the `send_handoff` activity, retried by Temporal while the receiver is away),
then wait durably for the provider's answer, reminding in Slack at the policy's interval.

Any workflow that ends where automation cannot help uses it: NodeRemediation at the end of
its ladder, a lemon, a fault the policy says is the provider's; a systemic incident for
its members. It holds no state of the workflow's: `show` is told of every change of the
hand-off's record and of what the workflow waits for, and the workflow keeps them where
its queries read them. The answer reaches `take` through the workflow's update, which
checks it first with `check`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.handoff import HandoffCall, HandoffRequest, HandoffSent
    from autoclusters.core.handoff_answer import HandoffAnswer, HandoffRecord
    from autoclusters.core.models import Waiting
    from autoclusters.core.policy import HandoffPolicy

from autoclusters.workflows.steps import Steps, Tell

# One try: a webhook that has not answered in this long is tried again.
SEND_TIMEOUT = timedelta(seconds=30)
STEP = "handoff"
ANSWER_STEP = "handoff_answer"
# What the workflow shows of the hand-off: its record, and the wait (None: none).
Show = Callable[[HandoffRecord, Waiting | None], None]


class Declined(Exception):
    """The provider declined the hand-off: the node stays drained; the incident closes
    `handed_off`."""


def send_retry(p: HandoffPolicy) -> RetryPolicy:
    """5 s, doubling up to 5 min between tries, `send_attempts` tries; a refusal or a
    worker with no secret is not retried (it would be refused again)."""
    return RetryPolicy(
        initial_interval=timedelta(seconds=5),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(minutes=5),
        maximum_attempts=p.send_attempts,
        non_retryable_error_types=["HandoffRefused", "HandoffNotConfigured"],
    )


class ProviderHandoff:
    def __init__(self, policy: HandoffPolicy, steps: Steps, tell: Tell, show: Show) -> None:
        self.policy = policy
        self._steps = steps
        self._tell = tell
        self._show = show
        self.record: HandoffRecord | None = None
        # True ends the wait for an answer unanswered (a member of a systemic incident
        # yields to it, docs/systemic.md); `given_up` says why, and no answer is taken then.
        self.interrupt: Callable[[], bool] = lambda: False
        self.given_up = ""

    def may(self, when: str) -> bool:
        """Does the policy hand off at `when` (health_gate_failed, lemon), and is none made
        yet? One hand-off per incident: its id is the idempotency key."""
        p = self.policy
        return p.enabled and when in p.when and self.record is None

    # --- the answer (the workflow's update) --------------------------------------------------

    def check(self, answer: HandoffAnswer) -> None:
        rec = self.record
        if rec is None:
            raise ValueError("no hand-off was made: there is nothing to answer")
        if rec.answer is not None:
            raise ValueError(f"the hand-off was answered already: {rec.answer}")
        if self.given_up:
            raise ValueError(f"the hand-off was given up: {self.given_up}")

    def take(self, answer: HandoffAnswer) -> HandoffRecord:
        rec = self.record
        assert rec is not None  # check() ran first
        rec.answer, rec.answered_at = answer.answer, workflow.now()
        rec.note, rec.new_vm_id = answer.note, answer.new_vm_id
        rec.ticket = answer.ticket or rec.ticket
        return rec

    # --- the hand-off ------------------------------------------------------------------------

    async def hand_off(self, request: HandoffRequest, subject: str) -> HandoffRecord:
        """Send `request` and wait, for as long as it takes, for the answer; the record
        with its answer. A send that fails for good raises (the caller fails the incident:
        a human is paged)."""
        rec = HandoffRecord(
            reason=request.reason, summary=request.summary, started_at=request.handed_off_at
        )
        self.record = rec
        self._show(rec, None)
        await self._send(request, subject, rec)
        return await self._await_answer(rec, subject)

    async def ask_a_human(self, request: HandoffRequest, subject: str) -> HandoffRecord:
        """No provider's webhook (policy handoff off): page a human and wait, as for the
        provider, for the same answer (`handoff_answer`: the Temporal UI, the API)."""
        rec = HandoffRecord(
            reason=request.reason, summary=request.summary, started_at=request.handed_off_at
        )
        self.record = rec
        self._show(rec, None)
        await self._tell(
            "handoff_sent",
            f"{subject}: {request.summary}; no provider hand-off is configured (policy "
            "handoff): a human fixes it and answers fixed or declined",
            "critical",
        )
        return await self._await_answer(rec, subject)

    async def _send(self, request: HandoffRequest, subject: str, rec: HandoffRecord) -> None:
        p = self.policy
        sent: HandoffSent = await self._steps.activity(
            STEP,
            contracts.send_handoff,
            HandoffCall(url=p.url, request=request),
            f"hand off {subject} to the provider ({request.reason})",
            lambda r: f"{r.status}" + (f", ticket {r.ticket}" if r.ticket else "")
            + (" (it had it already)" if r.duplicate else ""),
            timeout=SEND_TIMEOUT,
            retry=send_retry(p),
        )  # fmt: skip
        rec.sent_at, rec.accepted_at = workflow.now(), sent.accepted_at
        rec.ticket = rec.ticket or sent.ticket
        self._show(rec, None)
        ticket = f" (ticket {rec.ticket})" if rec.ticket else ""
        await self._tell(
            "handoff_sent",
            f"{subject} handed off to the provider{ticket}: {request.summary}; "
            "it stays drained until the provider answers fixed, replaced or declined",
            "warning",
        )

    async def _await_answer(self, rec: HandoffRecord, subject: str) -> HandoffRecord:
        ticket = f" (ticket {rec.ticket})" if rec.ticket else ""
        await self._steps.step(
            ANSWER_STEP,
            lambda: self._answered(rec, subject),
            detail=lambda r: (
                f"{r.answer or 'none: the wait was given up'}" + (f": {r.note}" if r.note else "")
            ),
        )
        if rec.answer is None:  # interrupted: the caller says why
            return rec
        await self._tell(
            "handoff_answered",
            f"the provider answered {rec.answer} for {subject}{ticket}"
            + (f": {rec.note}" if rec.note else ""),
            "warning" if rec.answer == "declined" else "info",
        )
        return rec

    async def _answered(self, rec: HandoffRecord, subject: str) -> HandoffRecord:
        every = self.policy.reminder_interval_s
        self._show(
            rec,
            Waiting(
                kind="handoff",
                step=ANSWER_STEP,
                detail=f"the provider's answer (fixed, replaced, declined); reminded every "
                f"{every:.0f}s",
                since=workflow.now(),
            ),
        )
        # No `finally`: a run evicted from the worker's cache unwinds through here outside
        # the workflow's event loop, where nothing may be shown; a cancelled run's close
        # clears what it waits for itself.
        while rec.answer is None and not self.interrupt():
            try:
                await workflow.wait_condition(
                    lambda: rec.answer is not None or self.interrupt(),
                    timeout=timedelta(seconds=every),
                )
            except TimeoutError:
                rec.reminders += 1
                waited = (workflow.now() - rec.started_at).total_seconds()
                await self._tell(
                    "handoff_reminder",
                    f"still waiting for the provider's answer on {subject}"
                    + (f" (ticket {rec.ticket})" if rec.ticket else "")
                    + f", handed off {_ago(waited)} ago; it stays drained",
                    "warning",
                )
        self._show(rec, None)
        return rec


def _ago(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"
