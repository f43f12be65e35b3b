"""A decision is bound to the step it was shown for (time-skipping server, fake cluster):

- a click rendered for `reboot`, replayed while the incident waits on `replace`, is refused
  by `incidents.decide` (the path the Slack handler and the CLI take) and changes nothing;
- the decision for the step it waits on still goes through;
- the alert's evidence reaches the opening message (what the Slack card shows) intact.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from autoclusters.clients import incidents
from autoclusters.core.fault_evidence import FaultEvidence
from autoclusters.core.models import FaultReport
from autoclusters.core.policy import Rung
from autoclusters.core.settings import Settings
from autoclusters.core.settings_groups import ApprovalSettings
from autoclusters.workflows.remediation import NodeRemediation
from tests.decisions import APPROVAL_KEY
from tests.workflows.test_remediation_workflow import (
    _approval_pending,
    _approve,
    _fleet,
    _policy,
    _until,
    _waiting,
)

pytestmark = pytest.mark.workflow


async def test_a_replayed_click_for_an_earlier_step_is_refused(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _fleet(env) as f:
        f.health.fixed_by = Rung.REPLACE  # the reboot will not fix it: the ladder climbs
        req = f.request(policy=_policy(mode="approve"))
        handle = await _approval_pending(f, req)

        async def found(*_: Any) -> Any:  # the time-skipping server has no visibility
            return handle

        monkeypatch.setattr(incidents, "find_incident", found)
        settings = Settings(cluster=f.cluster, approval=ApprovalSettings(keys=[APPROVAL_KEY]))
        first = await incidents.decide(
            env.client, settings, req.incident_id, "alice", True, step="reboot", via="slack:U1"
        )
        assert first.step == "reboot"
        await _until(handle, _waiting("approval", "replace"), "the approval of the replacement")

        # The same "Approve reboot" click, delivered again now.
        with pytest.raises(incidents.DecisionRefused, match="on replace, not reboot"):
            await incidents.decide(
                env.client, settings, req.incident_id, "alice", True, step="reboot", via="slack:U1"
            )
        state = await handle.query(NodeRemediation.status)
        assert _waiting("approval", "replace")(state)
        assert [(a.step, a.approved) for a in state.approvals] == [("reboot", True)]
        assert [r.step for r in state.refusals] == ["reboot"]  # the attempt is on record
        assert [r for _, r, _ in f.cloud.repair_calls] == [Rung.REBOOT]

        await _approve(handle, "replace", "bob")
        result = await handle.result()
    assert result.status == "resolved"
    assert [r for _, r, _ in f.cloud.repair_calls] == [Rung.REBOOT, Rung.REPLACE]


async def test_the_alerts_summary_and_runbook_reach_the_opening_message(
    env: WorkflowEnvironment,
) -> None:
    summary = "GPU 3 が応答しません 🔥"
    runbook = "https://runbooks.example.com/xid-79#対処"
    async with _fleet(env) as f:
        req = f.request(policy=_policy(mode="approve"))
        evidence = FaultEvidence.from_alert(
            key="am:fp:2026",
            starts_at=datetime(2026, 1, 5, 2, 58, tzinfo=UTC),
            labels={"alertname": "GpuXidError", "UUID": "GPU-1"},
            annotations={"summary": summary, "runbook_url": runbook},
        )
        await env.client.execute_update_with_start_workflow(
            NodeRemediation.report_fault,
            FaultReport(
                incident_id=req.incident_id,
                fault=req.fault,
                source="alertmanager",
                at=evidence.starts_at or req.opened_at,
                evidence=evidence,
            ),
            start_workflow_operation=f.with_start(req),
        )
        handle = env.client.get_workflow_handle(f.started[-1])
        await _until(handle, _waiting("approval"), "the approval wait")
        await handle.terminate("test done")
    opened = next(n for n in f.notes() if n.event == "opened")
    assert summary in opened.text and runbook in opened.text
