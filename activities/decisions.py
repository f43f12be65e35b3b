"""Is this decision a person's? The worker checks the proof that comes with an approve or
reject (core/decision_proof.py) with the keys it holds: the workflow itself holds no secret,
and a check done here is recorded in the history (a local activity's marker), so a replay
never asks again with keys that may have rotated since."""

from __future__ import annotations

from collections.abc import Sequence

from temporalio import activity

from autoclusters.core.decision_proof import ProofRefused, mismatch, verify
from autoclusters.core.models import ProofCheck, ProofVerdict


class DecisionActivities:
    def __init__(self, keys: Sequence[str]) -> None:
        self._keys = list(keys)

    @activity.defn(name="check_decision_proof")
    async def check_decision_proof(self, c: ProofCheck) -> ProofVerdict:
        try:
            d = verify(c.proof, self._keys)
        except ProofRefused as e:
            return ProofVerdict(ok=False, reason=str(e))
        why = mismatch(d, subject=c.subject, step=c.step, approver=c.approver, approve=c.approve)
        return ProofVerdict(ok=not why, reason=why, via=d.via)
