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

from autoclusters.workflows.timeline import HEARTBEAT, STEP_RETRY, Timeline

CALL = timedelta(seconds=60)


class SpareSteps(Timeline):
    async def _spare_into_service(self, guard: GuardContext) -> str | None:
        """Claim a free spare and resume it; None when there is none."""
        r = self._state.request
        claim = await self._step(
            "claim_spare",
            lambda: workflow.execute_activity(
                contracts.guard_claim_spare,
                SpareCall(
                    guard=guard, request=SpareRequest(node=r.node, incident_id=r.incident_id)
                ),
                start_to_close_timeout=CALL,
                heartbeat_timeout=HEARTBEAT,
                retry_policy=STEP_RETRY,
            ),
            detail=lambda c: c.spare or "no spare free",
        )
        if claim.spare is None:
            return None
        spare = claim.spare
        taken = await self._step(
            "take_spare",
            lambda: workflow.execute_activity(
                contracts.take_spare,
                SpareInput(node=spare, incident_id=r.incident_id),
                start_to_close_timeout=CALL,
                heartbeat_timeout=HEARTBEAT,
                retry_policy=STEP_RETRY,
            ),
            detail=lambda t: f"{spare} {t.state_after}" + (f" ({t.detail})" if t.detail else ""),
        )
        if not taken.returned:
            return None
        await self._notify("spare_in_service", f"hot spare {spare} in service for {r.node}")
        return spare

    async def _park_as_spare(self, guard: GuardContext) -> None:
        r = self._state.request
        await self._step(
            "park_as_spare",
            lambda: workflow.execute_activity(
                contracts.park_as_spare,
                SpareInput(node=r.node, incident_id=r.incident_id),
                start_to_close_timeout=CALL,
                heartbeat_timeout=HEARTBEAT,
                retry_policy=STEP_RETRY,
            ),
            detail=lambda p: p.state_after,
        )
        await self._step(
            "refill_spare",
            lambda: workflow.execute_activity(
                contracts.guard_refill_spare,
                SpareCall(
                    guard=guard, request=SpareRequest(node=r.node, incident_id=r.incident_id)
                ),
                start_to_close_timeout=CALL,
                heartbeat_timeout=HEARTBEAT,
                retry_policy=STEP_RETRY,
            ),
            detail=lambda free: f"free spares {free}",
        )
