"""Maintenance silences: from the drain to the close, the incident holds an Alertmanager
silence of every alert on its node except those routed to AutoClusters itself
(integrations/alertmanager.py). A reboot or a replacement makes a node's exporters vanish
and come back; nobody on call should be paged for a node the runbook is already repairing.

Alertmanager being away never stops a repair: the step answers "not silenced" and says
why, and the runbook goes on. Creating is idempotent: a retry finds the silence it made
before (by the incident id in its comment) instead of making a second one.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from temporalio import activity

from autoclusters.activities.heartbeat import heartbeating
from autoclusters.core.models import LiftSilenceInput, SilenceInput, SilenceResult
from autoclusters.integrations.alertmanager import (
    AlertmanagerClient,
    AlertmanagerUnavailable,
    node_matchers,
)

CREATED_BY = "autoclusters"
# The label the shipped alert rules carry to reach AutoClusters (deploy/prometheus): never
# silenced, so a worse fault on the node still reaches the runbook.
OWN_LABEL, OWN_VALUE = "autoclusters", "remediate"


class SilenceActivities:
    def __init__(
        self, alertmanager: AlertmanagerClient | None, *, node_label: str, max_s: float
    ) -> None:
        self._am = alertmanager
        self._label = node_label
        self._max_s = max_s

    @activity.defn(name="silence_node_alerts")
    async def silence_node_alerts(self, inp: SilenceInput) -> SilenceResult:
        if self._am is None:
            return SilenceResult(detail="no Alertmanager configured: not silenced")
        async with heartbeating(f"silence_node_alerts {inp.node}"):
            try:
                return await self._silence(self._am, inp)
            except AlertmanagerUnavailable as e:
                return SilenceResult(detail=f"not silenced, going on: {e}")

    async def _silence(self, am: AlertmanagerClient, inp: SilenceInput) -> SilenceResult:
        comment = f"{inp.incident_id}: {inp.node} under repair ({inp.fault})"
        for old in await am.silences_on(self._label, inp.node):
            state = (old.get("status") or {}).get("state")
            mine = old.get("createdBy") == CREATED_BY and str(old.get("comment", "")).startswith(
                f"{inp.incident_id}:"
            )
            if mine and state in ("active", "pending") and isinstance(old.get("id"), str):
                # A retry after the create went through: the same silence, not a second.
                return SilenceResult(
                    silence_id=old["id"], detail=f"silence {old['id']} (made before)"
                )
        now = datetime.now(UTC)
        ends = now + timedelta(seconds=self._max_s)
        silence_id = await am.create_silence(
            node_matchers(self._label, inp.node, except_label=OWN_LABEL, except_value=OWN_VALUE),
            starts_at=now,
            ends_at=ends,
            created_by=CREATED_BY,
            comment=comment,
        )
        return SilenceResult(
            silence_id=silence_id,
            detail=(
                f"silence {silence_id}: {self._label}={inp.node}, until {ends:%Y-%m-%d %H:%M} UTC"
            ),
        )

    @activity.defn(name="lift_silence")
    async def lift_silence(self, inp: LiftSilenceInput) -> str:
        if self._am is None:
            return "no Alertmanager configured"
        async with heartbeating(f"lift_silence {inp.silence_id}"):
            try:
                await self._am.expire_silence(inp.silence_id)
            except AlertmanagerUnavailable as e:
                return f"not lifted ({e}); it ends by itself at its end time"
            return f"silence {inp.silence_id} lifted"
