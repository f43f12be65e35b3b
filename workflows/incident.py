"""What every part of an incident's runbook is given: the incident's state and policy, its
steps (workflows/steps.py) and its notifications, and how it is shown (search attributes
and the Temporal UI's current details). The parts (guard, quarantine, approvals, repair,
Kubernetes, spares, health gate) take this explicitly and never call back into the
workflow; they return what the runbook acts on.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.ladder import choose_rung
    from autoclusters.core.models import (
        REASON_PREFIX,
        DrainResult,
        IncidentRequest,
        IncidentState,
        Notification,
    )
    from autoclusters.core.policy import Policy, Rung
    from autoclusters.core.why_named import why_named
    from autoclusters.integrations import temporal

from autoclusters.workflows.steps import NOTIFY_RETRY, Defaults, OnState, Steps

NOTIFY_TIMEOUT = timedelta(seconds=30)


class Rejected(Exception):
    """A human said no: the node stays drained, the incident ends `rejected`."""


class Unattended(Exception):
    """Nobody decided in time and the policy says leave the node drained."""


class Incident:
    """One incident: its state, policy and kernel."""

    def __init__(self, state: IncidentState, policy: Policy) -> None:
        self.state = state
        self.policy = policy
        self.recent = 0  # earlier incidents on this node within the recurrence window
        self.skipped: list[str] = []  # rungs the last choice skipped, and why
        # A drain that was already there when the incident quarantined the node (an
        # admin's, kept as it was): it holds the node for this incident as our reason does.
        self.kept_drain = ""
        r = state.request
        self.steps = Steps(
            OnState(state),
            Defaults(
                timeout=timedelta(seconds=r.timeouts.slurm_step_s),
                outage_budget_s=policy.outage_budget_s,
                outage_notify_after_s=policy.outage_notify_after_s,
            ),
            show=lambda step: self.show(step or "-"),
            tell=self.notify,
            subject=r.node,
        )

    @property
    def request(self) -> IncidentRequest:
        return self.state.request

    @property
    def node(self) -> str:
        return self.state.request.node

    def slurm_timeout(self) -> timedelta:
        return timedelta(seconds=self.request.timeouts.slurm_step_s)

    # --- what the incident says ------------------------------------------------------------

    async def notify(self, event: str, text: str, severity: str = "info") -> None:
        """A notification, on the timeline; a notifier outage never blocks the runbook."""
        req = self.request
        note = Notification(
            incident_id=req.incident_id,
            cluster=req.cluster,
            node=req.node,
            fault=req.fault,
            event=event,
            text=text,
            severity=severity,
            runbook_url=self.runbook_url(),
        )
        try:
            await self.steps.step(
                f"notify_{event}",
                lambda: self.steps.call(
                    contracts.notify,
                    note,
                    f"notify {event.replace('_', ' ')}: {req.node} ({req.incident_id})",
                    timeout=NOTIFY_TIMEOUT,
                    retry=NOTIFY_RETRY,
                ),
                ride_out=False,
            )
        except ActivityError:
            workflow.logger.warning("notification %s for %s failed", event, req.incident_id)

    def publish(self) -> None:
        """Search attributes and UI details follow the incident's state."""
        s = self.state
        self.steps.own_run.check()
        workflow.upsert_search_attributes(
            [
                temporal.INCIDENT_STATUS.value_set(
                    "waiting_approval"
                    if s.waiting_for and s.waiting_for.kind == "approval"
                    else s.status
                ),
                temporal.REPAIR_ACTION.value_set(s.rung or "none"),
            ]
        )
        self.show(s.current_step or "-")

    def show(self, step: str) -> None:
        s = self.state
        workflow.set_current_details(
            f"**{s.request.node}** {s.request.fault}: step **{step}**, "
            f"rung {s.rung or '-'}, status {s.status}"
            + (f"\n\n{line}" if (line := self.headline()) else "")
        )

    def headline(self) -> str:
        """The first fault's summary and runbook link, for the UI and the messages; for a
        silent fault, why the agent named this node (core/why_named.py)."""
        for f in self.state.faults:
            for e in f.evidence:
                if line := e.headline():
                    why = why_named(f.fault, e.readings)
                    return f"{line}\n{why}" if why else line
        return ""

    def runbook_url(self) -> str:
        """The first fault's runbook link, kept apart from the words: a field meant to be a
        link is the only outside text a notifier may show as one."""
        for f in self.state.faults:
            for e in f.evidence:
                if e.runbook_url:
                    return e.runbook_url
        return ""

    def timeline_text(self) -> str:
        start = self.request.opened_at
        parts = [
            f"{s.name} +{(s.finished_at - start).total_seconds():.1f}s"
            for s in self.state.steps
            if s.finished_at is not None
        ]
        return ", ".join(parts)

    # --- what the policy says about it -------------------------------------------------------

    def worst_rung(self) -> Rung:
        """The worst of the faults' rungs, past any rung the ladder's figures rule out
        (`skip_rung_below`); why each was skipped is in `skipped`."""
        choice = choose_rung(self.policy, [f.fault for f in self.state.faults], self.recent)
        self.skipped = choice.skipped
        return choice.rung

    def severity(self) -> str:
        order = {"info": 0, "warning": 1, "critical": 2}
        return max(
            (self.policy.rule_for(f.fault).severity for f in self.state.faults),
            key=order.__getitem__,
        )

    def note_drain(self, r: DrainResult) -> DrainResult:
        """Keep a drain that was there before ours (not one of ours) as holding the node."""
        if r.already_drained and r.previous_reason:
            if not r.previous_reason.startswith(f"{REASON_PREFIX} "):
                self.kept_drain = r.previous_reason
        return r
