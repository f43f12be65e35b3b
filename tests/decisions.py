"""Decisions as the API makes them: an ApprovalRequest (an incident's step), a ResetRequest
(the fleet guard's breaker) or a MoveDecision (a sharing workflow's move) with a proof signed by
the key the test's worker checks (core/decision_proof.py). A test that decides without going
through the API signs here; one that means to be refused leaves the proof out or forges it."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from autoclusters.activities.decisions import DecisionActivities
from autoclusters.core.decision_proof import Decision, sign
from autoclusters.core.guard import BREAKER_RESET_STEP, ResetRequest, reset_subject
from autoclusters.core.models import ApprovalRequest
from autoclusters.core.sharing import MOVE_APPROVAL_STEP, MoveDecision, move_subject
from autoclusters.workflows.fleet_guard import FleetGuard
from autoclusters.workflows.remediation import NodeRemediation

# The workflow tests' workers check with this key (activities_for(approval_keys=...)).
APPROVAL_KEY = "tests-approval-key-0123456789abcdef-0123"
# A key the workers do not hold: what a forger signs with.
FORGED_KEY = "a-forgers-key-0123456789abcdefghijklmn"


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


def proof_checks(keys: Sequence[str] = (APPROVAL_KEY,)) -> list[Any]:
    """The worker's check of proofs (a local activity), for a test's own worker."""
    return [DecisionActivities(keys).check_decision_proof]


def signed_reset(
    cluster: str, tripped_at: datetime | None, by: str, *, key: str = APPROVAL_KEY,
    via: str = "token:tests",
) -> ResetRequest:  # fmt: skip
    """A reset of the trip at `tripped_at` (None: a breaker that is not tripped; the proof
    is then for no trip at all)."""
    at = tripped_at or datetime(2000, 1, 1, tzinfo=UTC)
    proof = sign(Decision(reset_subject(cluster, at), BREAKER_RESET_STEP, by, True, via), key)
    return ResetRequest(by=by, proof=proof)


async def proven_reset(handle: Any, by: str, *, key: str = APPROVAL_KEY) -> ResetRequest:
    """A signed reset of the trip the guard `handle` shows now."""
    st = await handle.query(FleetGuard.status)
    return signed_reset(st.cluster, st.state.breaker.tripped_at, by.strip(), key=key)


def signed_move(
    cluster: str, move_id: str, by: str, *, approve: bool = True, key: str = APPROVAL_KEY,
    via: str = "token:tests",
) -> MoveDecision:  # fmt: skip
    d = Decision(move_subject(cluster, move_id), MOVE_APPROVAL_STEP, by, approve, via)
    return MoveDecision(move_id=move_id, approve=approve, by=by, proof=sign(d, key))
