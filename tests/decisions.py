"""Decisions as the API makes them: an ApprovalRequest with a proof signed by the key the
test's worker checks (core/decision_proof.py). A test that approves without going through
the API signs here; one that means to be refused leaves the proof out or forges it."""

from __future__ import annotations

from typing import Any

from autoclusters.core.decision_proof import Decision, sign
from autoclusters.core.models import ApprovalRequest
from autoclusters.workflows.remediation import NodeRemediation

# The workflow tests' workers check with this key (activities_for(approval_keys=...)).
APPROVAL_KEY = "tests-approval-key-0123456789abcdef-0123"


def signed(
    incident_id: str, step: str, approver: str, *, approve: bool = True,
    key: str = APPROVAL_KEY, comment: str = "", via: str = "token:tests",
) -> ApprovalRequest:  # fmt: skip
    proof = sign(Decision(incident_id, step, approver, approve, via), key)
    return ApprovalRequest(step=step, approver=approver, comment=comment, proof=proof)


async def proven(
    handle: Any, step: str, approver: str, *, approve: bool = True, key: str = APPROVAL_KEY
) -> ApprovalRequest:
    """A signed request for the incident `handle` runs (its id read from the workflow)."""
    state = await handle.query(NodeRemediation.status)
    return signed(state.request.incident_id, step, approver, approve=approve, key=key)
