"""Hot spares: a replacement puts a healthy spare into service at once, and the replaced
node, once it has passed its health gate, waits as the new spare.

Capacity comes back in seconds instead of a VM boot; the fleet guard hands out the spares
so two incidents never take the same one.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.guard import GuardContext, SpareCall, SpareRequest
    from autoclusters.core.models import SpareInput

from autoclusters.workflows.incident import Incident

CALL = timedelta(seconds=60)


class Spares:
    """The cluster's hot spares, for one incident's replacement."""

    def __init__(self, incident: Incident, guard: GuardContext) -> None:
        self.incident = incident
        self.guard = guard

    async def into_service(self) -> str | None:
        """Claim a free spare and resume it; None when there is none."""
        inc = self.incident
        r = inc.request
        claim = await inc.steps.activity(
            "claim_spare",
            contracts.guard_claim_spare,
            SpareCall(
                guard=self.guard, request=SpareRequest(node=r.node, incident_id=r.incident_id)
            ),
            f"claim a hot spare for {r.node}",
            lambda c: c.spare or "no spare free",
            timeout=CALL,
        )
        if claim.spare is None:
            return None
        spare = claim.spare
        taken = await inc.steps.activity(
            "take_spare",
            contracts.take_spare,
            SpareInput(node=spare, incident_id=r.incident_id),
            f"put hot spare {spare} into service for {r.node}",
            lambda t: f"{spare} {t.state_after}" + (f" ({t.detail})" if t.detail else ""),
            timeout=CALL,
        )
        if not taken.returned:
            return None
        await inc.notify("spare_in_service", f"hot spare {spare} in service for {r.node}")
        return spare

    async def park(self) -> None:
        """The replaced node, healthy again, waits as the next spare."""
        inc = self.incident
        r = inc.request
        await inc.steps.activity(
            "park_as_spare",
            contracts.park_as_spare,
            SpareInput(node=r.node, incident_id=r.incident_id),
            f"park {r.node} as a hot spare",
            lambda p: p.state_after,
            timeout=CALL,
        )
        await inc.steps.activity(
            "refill_spare",
            contracts.guard_refill_spare,
            SpareCall(
                guard=self.guard, request=SpareRequest(node=r.node, incident_id=r.incident_id)
            ),
            f"give {r.node} to the fleet guard as a free spare",
            lambda free: f"free spares {free}",
            timeout=CALL,
        )
