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

import asyncio
import hashlib
import time
from typing import Any

import httpx
import jwt
import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner

from autoclusters.clients import incidents
from autoclusters.clients.api.app import create_app
from autoclusters.clients.cli.breaker import breaker_app
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
from autoclusters.core.policy import GuardPolicy
from autoclusters.core.settings_groups import ApprovalSettings, TemporalSettings
from autoclusters.sandbox.crusoe.emulator import EmulatorServer
from autoclusters.workflows.fleet_guard import FleetGuard
from autoclusters.workflows.gpu_sharing import GpuSharing
from autoclusters.workflows.remediation import NodeRemediation
from tests.decisions import APPROVAL_KEY, signed
from tests.fakes.sharing import ShareWorld
from tests.helpers import HermeticSettings, eventually
from tests.workflows.test_fleet_guard import _guard, _register
from tests.workflows.test_gpu_sharing import HIGH, running_sharing, waiting_approval
from tests.workflows.test_gpu_sharing import nodes as share_nodes
from tests.workflows.test_gpu_sharing import policy as share_policy
from tests.workflows.test_remediation_workflow import (
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
    with pytest.raises(ProofRefused, match="no approval keys"):
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
            temporal=TemporalSettings(task_queue=f.task_queue),
            api_tokens={"reader": "a-readers-token-0123456"},
            api_operators={
                "alice": hashlib.sha256(alice.encode()).hexdigest(),
                "mallory": hashlib.sha256(bob.encode()).hexdigest(),  # not an approver
            },
            api_inventory="static",
            approval=ApprovalSettings(keys=[APPROVAL_KEY]),
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


# --- the breaker's reset and a sharing move: the same door -------------------------------------


@pytest.mark.workflow
async def test_an_operator_resets_the_breaker_through_the_api_and_the_cli(
    env: WorkflowEnvironment,
) -> None:
    """`autoclusters breaker reset` posts to the real API (in uvicorn): the token says who
    resets, the API signs, the guard's worker checks; a reader's token, an unknown one, a
    body that names someone, and an operator who is no approver change nothing."""
    alice, mallory, reader = "alices-own-token-0123456", "mallorys-own-token-01234", "r" * 20
    target = env.client.service_client.config.target_host

    async def connect() -> Client:
        return await Client.connect(target, data_converter=pydantic_data_converter)

    async with _guard(env, policy=GuardPolicy(breaker_threshold=1), approvers=["alice"]) as g:
        cluster = (await g.query(FleetGuard.status)).cluster
        s = HermeticSettings(
            cluster=cluster,
            api_tokens={"reader": reader},
            api_operators={
                "alice": hashlib.sha256(alice.encode()).hexdigest(),
                "mallory": hashlib.sha256(mallory.encode()).hexdigest(),
            },
            api_inventory="static",
            approval=ApprovalSettings(keys=[APPROVAL_KEY]),
        )
        app = create_app(s, connect, StaticInventory(["gpu-01"]))
        with EmulatorServer(app) as api:
            runner = CliRunner()

            async def cli(token: str, *args: str) -> Any:
                run_env = {"AUTOCLUSTERS_API_URL": api.url, "AUTOCLUSTERS_API_TOKEN": token}
                return await asyncio.to_thread(
                    runner.invoke, breaker_app, ["reset", *args], env=run_env
                )

            out = await cli(alice)  # not tripped yet
            assert out.exit_code == 0 and "not tripped; nothing to reset" in out.output
            await _register(g, "gpu-01")
            await _register(g, "gpu-02")

            async with httpx.AsyncClient(base_url=api.url, trust_env=False) as http:
                path = "/v1/breaker/reset"
                r = await http.post(path, json={}, headers={"Authorization": f"Bearer {reader}"})
                assert r.status_code == 403
                r = await http.post(path, json={}, headers={"Authorization": "Bearer " + "x" * 20})
                assert r.status_code == 401
                r = await http.post(
                    path, json={"by": "alice"}, headers={"Authorization": f"Bearer {mallory}"}
                )
                assert r.status_code == 422 and "by" in r.text
            out = await cli(mallory)
            assert out.exit_code == 1 and "mallory is not an approver" in out.output, out.output
            assert (await g.query(FleetGuard.status)).state.breaker.tripped

            out = await cli(alice, "--cluster", cluster)
            assert out.exit_code == 0, out.output
            assert f"breaker of {cluster} reset by alice" in out.output
        breaker_now = (await g.query(FleetGuard.status)).state.breaker
        assert not breaker_now.tripped and breaker_now.reset_by == "alice"


@pytest.mark.workflow
async def test_a_move_decision_through_the_api_is_the_token_persons(
    env: WorkflowEnvironment,
) -> None:
    """`POST /v1/moves/{id}/decisions`: a reader's token is refused, a body cannot name
    anyone, and the move is decided as the operator the token names."""
    carol, reader = "carols-own-token-0123456", "r" * 20
    world = ShareWorld(share_nodes(4), [HIGH])
    pol = share_policy(needs_approval=True, max_inference_nodes=3)
    async with running_sharing(env, world, pol) as sh:
        await sh.evaluate()
        await sh.handle.signal(GpuSharing.evaluate_now, "breach")
        rec = await waiting_approval(sh)
        s = HermeticSettings(
            cluster=sh.cluster,
            api_tokens={"reader": reader},
            api_operators={"carol": hashlib.sha256(carol.encode()).hexdigest()},
            api_inventory="static",
            approval=ApprovalSettings(keys=[APPROVAL_KEY]),
        )

        async def client() -> Client:
            return env.client

        app = create_app(s, client, StaticInventory(["gpu-01"]))
        path = f"/v1/moves/{rec.move.move_id}/decisions"
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://api.test"
        ) as http:
            r = await http.post(
                path, json={"approve": True}, headers={"Authorization": f"Bearer {reader}"}
            )
            assert r.status_code == 403
            as_carol = {"Authorization": f"Bearer {carol}"}
            r = await http.post(path, json={"approve": True, "by": "alice"}, headers=as_carol)
            assert r.status_code == 422
            r = await http.post("/v1/moves/nope/decisions", json={"approve": True},
                                headers=as_carol)  # fmt: skip
            assert r.status_code == 409 and "no move nope" in r.json()["detail"]
            r = await http.post(path, json={"approve": False}, headers=as_carol)
            assert r.status_code == 200, r.text
            assert r.json() == {
                "cluster": sh.cluster, "move_id": rec.move.move_id, "outcome": "rejected",
                "by": "carol",
            }  # fmt: skip

        async def ended() -> Any:
            st = await sh.status()
            return st.moves[-1] if st.current is None and st.moves else None

        done = await eventually(ended, what="the rejected move")
    assert (done.status, done.error) == ("rejected", "rejected by carol")
