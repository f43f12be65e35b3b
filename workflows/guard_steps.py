"""The incident's side of the fleet guard: wait to be admitted, without polling.

An incident asks once; held, the guard queues it (first come, first served) and tells it
with the `guard_admitted` signal when its turn comes. It asks again only as a safety net
(every `ADMISSION_REASK`: asking is idempotent, and answers "admitted" if a signal was
lost), so an incident held for days adds a handful of events per hour.

A node with a critical fault whose quarantine is held takes no new jobs meanwhile: it is
drained without requeueing (its running jobs go on) under `<our reason> (held)`, unless the
policy's `guard.drain_held_critical` says otherwise — and only once the guard admits the
drain too. A held drain takes the node out of service, so it asks against the guard's
floor like a quarantine; at the floor it waits its turn in the guard's queue (the incident
and its "held" notice say so), unless the policy names it in `guard.below_floor`. Once
the quarantine is admitted, the normal quarantine runs (our normal reason, requeue, wait
for idle), drained while held or not.

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
        GuardContext,
        ReleaseCall,
        ReleaseRequest,
    )
    from autoclusters.core.models import DrainInput, Waiting, drain_reason
    from autoclusters.core.systemic_member import Membership

from autoclusters.workflows.incident import Incident
from autoclusters.workflows.steps import RETRY

# A queued incident asks again this often, in case the guard's signal was lost.
ADMISSION_REASK = timedelta(hours=1)
HELD_SUFFIX = " (held)"
# The held critical drain asks the fleet guard first (it counts against the floor). The
# old path drained at once, whatever the floor.
HELD_DRAIN_ASKS_THE_GUARD = "remediation-0.2-held-drain-asks-the-guard"


def held_drain_reason(incident_id: str, fault: str) -> str:
    """Drained while the quarantine is held: still ours (it starts as our reason does)."""
    return drain_reason(incident_id, fault) + HELD_SUFFIX


class GuardSeat:
    """The incident's place with its cluster's fleet guard: admissions and their release.
    `tickets` are the queue tickets the guard said were admitted (the workflow's
    `guard_admitted` signal adds them). `systemic`: the systemic incident the guard said
    the node belongs to (the workflow's `systemic_member` signal sets it): a repair held
    in the queue is given up for it (docs/systemic.md)."""

    def __init__(self, incident: Incident, guard: GuardContext) -> None:
        self.incident = incident
        self.guard = guard
        self.tickets: set[int] = set()
        self.systemic: Membership | None = None

    async def admitted(
        self, what: str, act: Callable[[AdmitCall], Awaitable[Admission]]
    ) -> Admission:
        """Ask the fleet guard once; held, wait for its signal; tell the humans once. A
        repair refused for a systemic incident (`Admission.systemic`) returns at once."""
        inc = self.incident
        req = inc.request
        call = AdmitCall(
            guard=self.guard,
            node=req.node,
            incident_id=req.incident_id,
            workflow_id=workflow.info().workflow_id,
        )

        async def ask() -> Admission:
            return await inc.steps.call(
                act, call, f"ask the fleet guard to admit the {what} of {req.node}"
            )

        async def wait() -> Admission:
            adm = await ask()
            if adm.admitted or adm.systemic is not None:
                return adm
            since = workflow.now()
            waiting = inc.state.waiting_for = Waiting(
                kind="admission", step=what, detail=_held(adm), since=since
            )
            inc.publish()
            drain: Admission | None = None  # the held drain, while the guard holds it too
            if what == "quarantine" and self._drain_while_held():
                if workflow.patched(HELD_DRAIN_ASKS_THE_GUARD):
                    drain = await self._drain_if_admitted(call)
                else:
                    await self._hold_drain()  # runs started before the patch
            waiting.detail = _held(adm, drain)
            await inc.notify("held", _held_notice(what, req.node, adm, drain), "warning")
            while not adm.admitted:
                if adm.queued and adm.ticket is not None:
                    try:
                        await workflow.wait_condition(
                            self._told(adm.ticket, drain, what), timeout=ADMISSION_REASK
                        )
                    except TimeoutError:
                        adm = await ask()  # idempotent: a lost signal shows here
                        if drain is not None and not adm.admitted:
                            drain = await self._drain_if_admitted(call)
                        waiting.detail = _held(adm, drain)
                        continue
                    if what == "repair" and self.systemic is not None:
                        # A member of a systemic incident now: the guard dropped this
                        # repair from its queue; the incident yields.
                        adm = Admission(
                            admitted=False,
                            reason=f"a member of systemic incident {self.systemic.incident_id}",
                            systemic=self.systemic,
                        )
                        break
                    if adm.ticket in self.tickets:
                        waited = (workflow.now() - since).total_seconds()
                        adm = Admission(
                            admitted=True, reason=f"admitted from the queue after {waited:.0f}s"
                        )
                    else:  # the guard admitted the held drain first: drain, wait on
                        await self._hold_drain()
                        drain = None
                        waiting.detail = _held(adm)
                else:
                    # A guard that does not queue: ask again later.
                    await workflow.sleep(timedelta(seconds=req.timeouts.admission_poll_s))
                    adm = await ask()
            inc.state.waiting_for = None
            inc.publish()
            return adm

        return await inc.steps.step(f"admit_{what}", wait, _reason)

    def _told(self, ticket: int, drain: Admission | None, what: str) -> Callable[[], bool]:
        """The guard's signal came: for the quarantine, or for the held drain; for a repair,
        also that the node belongs to a systemic incident (no command: only a run told it
        ever wakes for it)."""
        tickets = {ticket} if drain is None or drain.ticket is None else {ticket, drain.ticket}
        return lambda: (
            not tickets.isdisjoint(self.tickets) or (what == "repair" and self.systemic is not None)
        )

    async def _drain_if_admitted(self, call: AdmitCall) -> Admission | None:
        """Ask the guard for the held drain (it counts against the floor) and drain if
        admitted; returns the guard's answer while it holds the drain (None: drained)."""
        asked = await self.incident.steps.call(
            contracts.guard_admit_held_drain,
            call,
            f"ask the fleet guard to drain {call.node} while its quarantine is held",
        )
        if not asked.admitted:
            return asked
        await self._hold_drain()
        return None

    def _drain_while_held(self) -> bool:
        inc = self.incident
        return inc.policy.guard.drain_held_critical and inc.severity() == "critical"

    async def _hold_drain(self) -> None:
        """No new jobs on a critical node while its quarantine is held: drain, no requeue."""
        inc = self.incident
        r = inc.request
        drained = await inc.steps.activity(
            "drain_held",
            contracts.drain_node,
            DrainInput(node=r.node, reason=held_drain_reason(r.incident_id, r.fault)),
            f"drain {r.node} ({r.fault}), held: no new jobs",
            lambda d: (
                f"kept the drain already there: {d.previous_reason}"
                if d.already_drained and d.previous_reason
                else "no new jobs; running jobs go on"
            ),
        )
        inc.note_drain(drained)

    async def give_back(self, back_in_service: bool, *, slot_only: bool = False) -> bool:
        """Tell the guard; False when it could not be told (the guard's reconcile and the
        safety re-asks of others cope)."""
        req = self.incident.request
        try:
            await self.incident.steps.call(
                contracts.guard_release,
                ReleaseCall(
                    guard=self.guard,
                    release=ReleaseRequest(
                        node=req.node,
                        incident_id=req.incident_id,
                        back_in_service=back_in_service,
                        slot_only=slot_only,
                    ),
                ),
                f"release {req.node} to the fleet guard"
                + (" (repair slot)" if slot_only else "")
                + (", back in service" if back_in_service else ""),
                retry=RETRY,
            )
        except ActivityError as e:  # never fail the incident here
            if is_cancelled_exception(e):
                raise
            workflow.logger.warning("fleet guard release for %s failed", req.incident_id)
            return False
        return True


def _held(adm: Admission, drain: Admission | None = None) -> str:
    """Why the incident waits: its admission, and its held drain when the guard holds that
    too (`held: drain not allowed, the cluster is at its floor (3 of 4 in service)`)."""
    where = f" (number {adm.position} in the queue)" if adm.queued and adm.position else ""
    held_drain = f"held: {drain.reason}; " if drain is not None else ""
    return held_drain + adm.reason + where


def _held_notice(what: str, node: str, adm: Admission, drain: Admission | None) -> str:
    text = f"{what} of {node} held: {_held(adm)}"
    if drain is not None:
        text += f"; {node} still takes new jobs, held: {drain.reason}"
    return text


def _reason(adm: Admission) -> str:
    return adm.reason
