"""A decision counts only with proof of who made it (core/decision_proof.py): whoever can
reach Temporal cannot approve as a listed approver (time-skipping server, fake cluster).

- no proof: the update's validator refuses it, before anything is recorded;
- a forged proof (another key), or a valid one for another incident, step, person or
  verdict: the worker's check refuses it, the refusal is in the incident's history, and
  the incident still waits;
- a proof signed with the older of two keys (a rotation) is accepted;
- proofs in isolation: expiry, the `none` algorithm, tampering, the mismatch reasons.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import httpx
import jwt
import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from autoclusters.clients import incidents
from autoclusters.clients.api.app import create_app
from autoclusters.clients.inventory import StaticInventory
from autoclusters.core.decision_proof import (
    LIFETIME_S,
    Decision,
    ProofRefused,
    mismatch,
    sign,
    verify,
)
from autoclusters.core.models import ApprovalRequest
from autoclusters.workflows.remediation import NodeRemediation
from tests.decisions import APPROVAL_KEY, signed
from tests.helpers import HermeticSettings
from tests.test_remediation_workflow import (
    _approval_pending,
    _fleet,
    _policy,
    _refused,
    _until,
    _waiting,
)

OTHER_KEY = "not-the-workers-key-0123456789abcdefghij"
D = Decision("inc-1", "reboot", "alice", True, "token:alice")


@pytest.mark.workflow
async def test_an_approval_without_a_valid_proof_is_refused_at_the_workflow(
    env: WorkflowEnvironment,
) -> None:
    async with _fleet(env) as f:
        req = f.request(policy=_policy(mode="approve"))
        handle = await _approval_pending(f, req)
        inc = req.incident_id

        # What `approve --as alice` against Temporal did before: a name, nothing else.
        why = await _refused(handle, ApprovalRequest(step="reboot", approver="alice"))
        assert "no proof of who decides" in why
        forged = signed(inc, "reboot", "alice", key=OTHER_KEY)
        assert "not signed by our key" in await _refused(handle, forged)
        # Valid proofs, for something else than this decision.
        cases = [
            (signed("inc-other", "reboot", "alice"), False, "is for inc-other"),
            (signed(inc, "replace", "alice").model_copy(update={"step": "reboot"}), False,
             "for step replace, not reboot"),
            (signed(inc, "reboot", "bob").model_copy(update={"approver": "alice"}), False,
             "bob's, not alice's"),
            (signed(inc, "reboot", "alice", approve=False), False, "to reject"),
        ]  # fmt: skip
        for bad, reject, said in cases:
            assert said in await _refused(handle, bad, reject=reject)

        state = await handle.query(NodeRemediation.status)
        assert _waiting("approval", "reboot")(state), "still waiting after every refusal"
        assert state.approvals == []
        # The worker's refusals are in the history (the validator's leave none).
        assert len(state.refusals) == 1 + len(cases)
        assert all(r.approver == "alice" for r in state.refusals)
        assert f.cloud.repair_calls == []

        ok = await handle.execute_update(NodeRemediation.approve, signed(inc, "reboot", "alice"))
        assert (ok.approver, ok.approved) == ("alice", True)
        result = await handle.result()
    assert result.status == "resolved"
    assert [(a.approver, a.step) for a in result.approvals] == [("alice", "reboot")]


@pytest.mark.workflow
async def test_a_proof_from_the_previous_key_still_counts_during_a_rotation(
    env: WorkflowEnvironment,
) -> None:
    async with _fleet(env, approval_keys=[OTHER_KEY, APPROVAL_KEY]) as f:
        req = f.request(policy=_policy(mode="approve"))
        handle = await _approval_pending(f, req)
        rec = await handle.execute_update(
            NodeRemediation.reject, signed(req.incident_id, "reboot", "bob", approve=False)
        )
        assert (rec.approver, rec.approved) == ("bob", False)
        await _until(handle, lambda s: s.status == "rejected", "the rejection")


def test_a_proof_says_who_decided_what() -> None:
    proof = sign(D, APPROVAL_KEY)
    assert verify(proof, [OTHER_KEY, APPROVAL_KEY]) == D
    assert mismatch(D, subject="inc-1", step="reboot", approver="alice", approve=True) == ""
    assert "not inc-2" in mismatch(D, subject="inc-2", step="reboot", approver="alice",
                                   approve=True)  # fmt: skip


BAD_PROOFS = {
    "none": (lambda: "", "no proof"),
    "not a jwt": (lambda: "not.a.jwt", "invalid proof"),
    "expired": (lambda: sign(D, APPROVAL_KEY, now=time.time() - LIFETIME_S - 120), "expired"),
    "from the future": (lambda: sign(D, APPROVAL_KEY, now=time.time() + 600), "invalid proof"),
    "alg none": (
        lambda: jwt.encode(
            {"sub": "alice", "aud": "autoclusters:decision"}, None, algorithm="none"
        ),
        "invalid proof",
    ),
    "another key": (lambda: sign(D, OTHER_KEY), "not signed by our key"),
}


# The ids are names, not the proofs: a proof differs in each process (its time and jti), and
# xdist's workers must collect the same tests.
@pytest.mark.parametrize("case", list(BAD_PROOFS))
def test_a_bad_proof_is_refused_saying_why(case: str) -> None:
    make, said = BAD_PROOFS[case]
    with pytest.raises(ProofRefused, match=said):
        verify(make(), [APPROVAL_KEY])


def test_a_tampered_proof_is_refused() -> None:
    head, body, mac = sign(D, APPROVAL_KEY).split(".")
    other_body = sign(Decision("inc-1", "reboot", "mallory", True, "x"), APPROVAL_KEY)
    tampered = ".".join([head, other_body.split(".")[1], mac])
    with pytest.raises(ProofRefused, match="not signed by our key"):
        verify(tampered, [APPROVAL_KEY])


def test_without_keys_every_proof_is_refused() -> None:
    with pytest.raises(ProofRefused, match="no approval_keys"):
        verify(sign(D, APPROVAL_KEY), [])


@pytest.mark.workflow
async def test_an_operator_decides_through_the_api_as_the_person_their_token_names(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`autoclusters approve` posts here: the token says who decides, the API signs."""
    alice, bob = "alices-own-token-0123456", "bobs-own-token-012345678"
    async with _fleet(env) as f:
        req = f.request(policy=_policy(mode="approve"))
        handle = await _approval_pending(f, req)

        async def found(*_: Any) -> Any:  # the time-skipping server has no visibility
            return handle

        monkeypatch.setattr(incidents, "find_incident", found)
        s = HermeticSettings(
            cluster=f.cluster,
            task_queue=f.task_queue,
            api_tokens={"reader": "a-readers-token-0123456"},
            api_operators={
                "alice": hashlib.sha256(alice.encode()).hexdigest(),
                "mallory": hashlib.sha256(bob.encode()).hexdigest(),  # not an approver
            },
            api_inventory="static",
            approval_keys=[APPROVAL_KEY],
        )

        async def client() -> Client:
            return env.client

        app = create_app(s, client, StaticInventory(["gpu-01"]))
        path = f"/v1/incidents/{req.incident_id}/decisions"
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://api.test"
        ) as http:
            reader = {"Authorization": "Bearer a-readers-token-0123456"}
            r = await http.post(path, json={"approve": True}, headers=reader)
            assert r.status_code == 403
            # Nothing in the body names anyone: an `approver` field is refused.
            r = await http.post(
                path, json={"approve": True, "approver": "alice"},
                headers={"Authorization": f"Bearer {bob}"},
            )  # fmt: skip
            assert r.status_code == 422 and "approver" in r.text
            r = await http.post(
                path, json={"approve": True}, headers={"Authorization": f"Bearer {bob}"}
            )
            assert r.status_code == 409 and "mallory is not an approver" in r.json()["detail"]
            r = await http.post(
                path,
                json={"approve": True, "step": "reboot", "comment": "go"},
                headers={"Authorization": f"Bearer {alice}"},
            )
            assert r.status_code == 200, r.text
            assert (r.json()["approver"], r.json()["approved"]) == ("alice", True)
        result = await handle.result()
    assert [(a.approver, a.comment) for a in result.approvals] == [("alice", "go")]
    assert [x.approver for x in result.refusals] == ["mallory"]
