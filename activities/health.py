"""The health gate step: the node proves itself healthy before it takes jobs again."""

from __future__ import annotations

from temporalio import activity

from autoclusters.activities.heartbeat import heartbeating
from autoclusters.core.models import HealthGateInput, HealthReport
from autoclusters.integrations.health import HealthGate


class HealthActivities:
    def __init__(self, gate: HealthGate) -> None:
        self._gate = gate

    @activity.defn(name="health_gate")
    async def health_gate(self, inp: HealthGateInput) -> HealthReport:
        # A failed check is an answer, not an error: the workflow escalates on it.
        async with heartbeating(f"health gate of {inp.node}"):
            return await self._gate.check(inp.node)
