"""Re-verify the quarantine right before every destructive step.

Between the first quarantine and a reboot or replacement the incident can wait a long time
(an approval, the fleet guard's admission). Meanwhile a human or a tool may undrain the node
(`scontrol update nodename=X state=resume`), Slurm may schedule a job on it, or someone may
uncordon its Kubernetes Node. Right before the repair the runbook checks again that the node
is still drained for this incident, runs no job and (Slinky) is still cordoned. If not, it
quarantines again (drain, requeue what landed there, wait for idle, cordon) and checks once
more; where that is impossible (someone else drained it since, under another reason; the
node does not go idle) it stops, leaves the node drained and pages a human. A machine that
runs a job is never power-cycled or deleted.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.kubernetes import NodeIdentityInput
    from autoclusters.core.models import (
        REASON_PREFIX,
        DrainResult,
        IncidentRequest,
        drain_reason,
    )
    from autoclusters.core.quarantine import QuarantineStatus, VerifyQuarantineInput

from autoclusters.workflows.timeline import HEARTBEAT, STEP_RETRY, Timeline


@dataclass
class Found:
    slurm: QuarantineStatus
    cordoned: bool | None  # None off Kubernetes

    @property
    def intact(self) -> bool:
        return self.slurm.intact and self.cordoned is not False

    def describe(self) -> str:
        text = self.slurm.describe()
        return text + ("; Kubernetes Node not cordoned" if self.cordoned is False else "")


class QuarantineCheck(Timeline):
    _k8s: bool
    # A drain that was already there when the incident quarantined the node (an admin's,
    # kept as it was): it holds the node for this incident as well as our own reason does.
    _kept_drain: str = ""

    async def _quarantine(self, req: IncidentRequest) -> None:
        raise NotImplementedError  # the runbook's: drain, requeue, wait for idle, cordon

    def _note_drain(self, r: DrainResult) -> DrainResult:
        if r.already_drained and r.previous_reason:
            if not r.previous_reason.startswith(f"{REASON_PREFIX} "):
                self._kept_drain = r.previous_reason
        return r

    async def _recheck_quarantine(self) -> None:
        """Call right before a reboot or replacement (after every wait)."""
        r = self._state.request
        found = await self._quarantine_now()
        if found.intact:
            return
        what = found.describe()
        if not found.slurm.restorable:
            raise ApplicationError(
                f"{r.node} is no longer quarantined for {r.incident_id} ({what}): "
                "someone else holds it now; not repairing",
                type="QuarantineLost",
                non_retryable=True,
            )
        await self._notify(
            "quarantine_lost",
            f"{r.node} lost its quarantine while the incident waited ({what}); "
            "quarantining it again before the repair",
            "warning",
        )
        await self._step("requarantine", lambda: self._quarantine(r), detail=lambda _: what)
        again = await self._quarantine_now()
        if not again.intact:
            raise ApplicationError(
                f"{r.node} could not be quarantined again for {r.incident_id} "
                f"({again.describe()}); not repairing",
                type="QuarantineLost",
                non_retryable=True,
            )

    async def _quarantine_now(self) -> Found:
        """What Slurm (and Kubernetes) show now; an outage is waited out, never read as
        "not drained" or "no jobs"."""
        return await self._ride_out("verify_quarantine", self._read_quarantine)

    async def _read_quarantine(self) -> Found:
        r = self._state.request
        reasons = [drain_reason(r.incident_id, r.fault)]
        if self._kept_drain:
            reasons.append(self._kept_drain)
        slurm = await workflow.execute_activity(
            contracts.verify_quarantine,
            VerifyQuarantineInput(node=r.node, incident_id=r.incident_id, reasons=reasons),
            start_to_close_timeout=timedelta(seconds=r.timeouts.slurm_step_s),
            heartbeat_timeout=HEARTBEAT,
            retry_policy=STEP_RETRY,
        )
        cordoned: bool | None = None
        if self._k8s:
            ident = await workflow.execute_activity(
                contracts.k8s_node_identity,
                NodeIdentityInput(node=r.node),
                start_to_close_timeout=timedelta(seconds=60),
                heartbeat_timeout=HEARTBEAT,
                retry_policy=STEP_RETRY,
            )
            cordoned = ident.unschedulable
        return Found(slurm=slurm, cordoned=cordoned)
