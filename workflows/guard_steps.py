"""The incident's side of the fleet guard: wait to be admitted, without polling.

An incident asks once; held, the guard queues it (first come, first served) and tells it
with the `guard_admitted` signal when its turn comes. It asks again only as a safety net
(every `ADMISSION_REASK`: asking is idempotent, and answers "admitted" if a signal was
lost), so an incident held for days adds a handful of events per hour.

A node with a critical fault whose quarantine is held takes no new jobs meanwhile: it is
drained without requeueing (its running jobs go on) under `<our reason> (held)`, unless the
policy's `guard.drain_held_critical` says otherwise. Once admitted, the normal quarantine
runs (our normal reason, requeue, wait for idle).

Cancelling the incident (workflow cancellation, e.g. from the Temporal UI) gives back its
place in the guard's queue or its slot and closes it `cancelled`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.guard import (
        Admission,
        AdmitCall,
        AdmittedNotice,
        GuardContext,
        ReleaseCall,
        ReleaseRequest,
    )
    from autoclusters.core.models import (
        DrainInput,
        DrainResult,
        IncidentState,
        IncidentStatus,
        Waiting,
        drain_reason,
    )
    from autoclusters.core.policy import Policy

from autoclusters.workflows.timeline import HEARTBEAT, RETRY, STEP_RETRY, Timeline

# A queued incident asks again this often, in case the guard's signal was lost.
ADMISSION_REASK = timedelta(hours=1)
HELD_SUFFIX = " (held)"


def held_drain_reason(incident_id: str, fault: str) -> str:
    """Drained while the quarantine is held: still ours (it starts as our reason does)."""
    return drain_reason(incident_id, fault) + HELD_SUFFIX


class GuardSteps(Timeline):
    _guard: GuardContext | None = None
    _guard_tickets: set[int]  # the queue tickets the guard said were admitted
    _policy: Policy

    # --- provided by the runbook ---------------------------------------------------------

    def _publish(self) -> None:
        raise NotImplementedError

    def _slurm_timeout(self) -> timedelta:
        raise NotImplementedError

    def _severity(self) -> str:
        raise NotImplementedError

    def _note_drain(self, r: DrainResult) -> DrainResult:
        raise NotImplementedError

    async def _close(
        self, status: IncidentStatus, text: str, severity: str = "info"
    ) -> IncidentState:
        raise NotImplementedError

    # --- the guard's signal ----------------------------------------------------------------

    @workflow.signal
    def guard_admitted(self, notice: AdmittedNotice) -> None:
        """The fleet guard admitted this incident from its queue (the ticket it was given)."""
        if notice.incident_id == self._state.request.incident_id:
            self._guard_tickets.add(notice.ticket)

    # --- admission -------------------------------------------------------------------------

    async def _admitted(
        self,
        what: str,
        act: Callable[[AdmitCall], Awaitable[Admission]],
        guard: GuardContext,
    ) -> None:
        """Ask the fleet guard once; held, wait for its signal; tell the humans once."""
        req = self._state.request
        call = AdmitCall(
            guard=guard,
            node=req.node,
            incident_id=req.incident_id,
            workflow_id=workflow.info().workflow_id,
        )

        async def ask() -> Admission:
            return await workflow.execute_activity(
                act,
                call,
                start_to_close_timeout=self._slurm_timeout(),
                heartbeat_timeout=HEARTBEAT,
                retry_policy=STEP_RETRY,
            )

        async def wait() -> Admission:
            adm = await ask()
            if adm.admitted:
                return adm
            since = workflow.now()
            self._state.waiting_for = Waiting(
                kind="admission", step=what, detail=_held(adm), since=since
            )
            self._publish()
            if what == "quarantine" and self._drain_while_held():
                await self._hold_drain()
            await self._notify("held", f"{what} of {req.node} held: {_held(adm)}", "warning")
            while not adm.admitted:
                if adm.queued and adm.ticket is not None:
                    try:
                        await workflow.wait_condition(
                            self._told(adm.ticket), timeout=ADMISSION_REASK
                        )
                        waited = (workflow.now() - since).total_seconds()
                        adm = Admission(
                            admitted=True, reason=f"admitted from the queue after {waited:.0f}s"
                        )
                    except TimeoutError:
                        adm = await ask()  # idempotent: a lost signal shows here
                else:
                    # A guard started before the queue: it does not queue, ask again later.
                    await workflow.sleep(timedelta(seconds=req.timeouts.admission_poll_s))
                    adm = await ask()
            self._state.waiting_for = None
            self._publish()
            return adm

        await self._step(f"admit_{what}", wait, _reason)

    def _told(self, ticket: int) -> Callable[[], bool]:
        return lambda: ticket in self._guard_tickets

    def _drain_while_held(self) -> bool:
        return self._policy.guard.drain_held_critical and self._severity() == "critical"

    async def _hold_drain(self) -> None:
        """No new jobs on a critical node while its quarantine is held: drain, no requeue."""
        r = self._state.request
        drained = await self._step(
            "drain_held",
            lambda: workflow.execute_activity(
                contracts.drain_node,
                DrainInput(node=r.node, reason=held_drain_reason(r.incident_id, r.fault)),
                start_to_close_timeout=self._slurm_timeout(),
                heartbeat_timeout=HEARTBEAT,
                retry_policy=STEP_RETRY,
            ),
            detail=lambda d: (
                f"kept the drain already there: {d.previous_reason}"
                if d.already_drained and d.previous_reason
                else "no new jobs; running jobs go on"
            ),
        )
        self._note_drain(drained)

    # --- release and cancellation ----------------------------------------------------------

    async def _give_back(
        self, guard: GuardContext, back_in_service: bool, *, slot_only: bool = False
    ) -> bool:
        """Tell the guard; False when it could not be told (the guard's reconcile and the
        safety re-asks of others cope)."""
        req = self._state.request
        try:
            await workflow.execute_activity(
                contracts.guard_release,
                ReleaseCall(
                    guard=guard,
                    release=ReleaseRequest(
                        node=req.node,
                        incident_id=req.incident_id,
                        back_in_service=back_in_service,
                        slot_only=slot_only,
                    ),
                ),
                start_to_close_timeout=self._slurm_timeout(),
                heartbeat_timeout=HEARTBEAT,
                retry_policy=RETRY,
            )
        except ActivityError as e:  # never fail the incident here
            if is_cancelled_exception(e):
                raise
            workflow.logger.warning("fleet guard release for %s failed", req.incident_id)
            return False
        return True

    def _cancelling(self, err: BaseException) -> bool:
        """Is `err` this incident's cancellation (closed `cancelled`)?"""
        return self._state.status == "open" and is_cancelled_exception(err)

    async def _close_cancelled(self) -> None:
        """Cancelled (e.g. from the Temporal UI): give back the guard's slot or queue place,
        leave the node as it is (drained by us: for a human), close `cancelled`."""
        s, r = self._state, self._state.request
        drained = any(
            st.outcome == "ok" and st.name in ("drain", "drain_held", "requarantine")
            for st in s.steps
        )
        s.waiting_for = None
        if self._guard is not None:
            await self._give_back(self._guard, back_in_service=not drained)
        where = (
            f"{r.node} left drained under {r.incident_id} for a human"
            if drained
            else f"{r.node} was not drained"
        )
        await self._close("cancelled", f"cancelled; {where}", "warning")


def _held(adm: Admission) -> str:
    where = f" (number {adm.position} in the queue)" if adm.queued and adm.position else ""
    return adm.reason + where


def _reason(adm: Admission) -> str:
    return adm.reason
