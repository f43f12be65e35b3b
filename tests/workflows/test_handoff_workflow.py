"""The hand-off to the provider (docs/handoff.md) on the time-skipping test server: a fake
cluster, the real NodeRemediation and FleetGuard, and the sandbox's ticket desk on loopback
as the provider, which verifies each delivery and counts it.

Aspects covered:
- where the ladder ends with a failed gate, the incident hands off (once: one ticket, one
  delivery), waits drained, and `fixed` screens the node (the health gate) and returns it;
- a fault the policy says is the provider's is handed off right after the drain, with no
  repair of ours; `replaced` runs the new machine's bring-up (registration, the gate);
- `declined` leaves the node drained and closes the incident `handed_off`;
- while no answer comes, a reminder every `reminder_interval_s` (a durable timer);
- a desk that is away (503) is tried again by Temporal's retry policy: one ticket; a desk
  that refuses it (400) is not, and the incident fails with the node drained;
- a lemon goes to the provider instead of the approvers (policy `when: [lemon]`);
- `replaced` on Kubernetes waits for the new Node Ready before slurmd and the gate;
- a worker restart and an API restart between the request and the answer: the run resumes
  on the new worker, the answer comes through a new API, one delivery in all;
- the answer's validator: nothing to answer before a hand-off;
- observe mode plans the hand-off (at once, or at the ladder's end) and sends nothing.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import pytest_asyncio
from pydantic import SecretStr
from temporalio.client import Client, WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from autoclusters.activities.guard import GuardActivities
from autoclusters.activities.handoff import HandoffActivities
from autoclusters.clients import incidents
from autoclusters.clients.api.app import create_app
from autoclusters.clients.inventory import StaticInventory
from autoclusters.core.guard import guard_workflow_id
from autoclusters.core.handoff import ANSWER_PATH, signed_headers
from autoclusters.core.handoff_answer import HandoffAnswer
from autoclusters.core.models import IncidentRequest, IncidentState
from autoclusters.core.policy import HandoffPolicy, Rung
from autoclusters.core.settings_groups import HandoffSettings, TemporalSettings
from autoclusters.integrations.handoff import HandoffClient
from autoclusters.sandbox.crusoe.emulator import EmulatorServer
from autoclusters.sandbox.crusoe.ticket_desk import Desk, DeskFault
from autoclusters.sandbox.crusoe.ticket_desk import create_app as desk_app
from autoclusters.workers.remediation import WORKFLOWS, activities_for
from autoclusters.workflows.remediation import NodeRemediation
from tests.decisions import APPROVAL_KEY
from tests.fakes.systems import FakeCloud, FakeHealth, FakeSlurm, RecordingNotifier
from tests.helpers import HermeticSettings, time_skipping_env
from tests.histories.record import FakeKubernetes
from tests.workflows.test_remediation_workflow import (
    Fleet,
    Incident,
    _add_nodes,
    _policy,
    _until,
    _waiting,
)


@pytest_asyncio.fixture
async def env() -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping server per test, as in test_remediation_workflow (its `env` says
    why): the reminders' test skips hours of virtual time."""
    async with await time_skipping_env() as environment:
        yield environment


SECRET = "the-providers-shared-secret-0123456789"
API_URL = "http://api.test"
REMINDER_S = 3600


@dataclass
class Desked(Fleet):
    """A fake cluster whose provider is a ticket desk on loopback; `worker()` starts a
    worker for it (several, one after the other: a restart)."""

    desk: Desk | None = None
    desk_url: str = ""
    extra: list[Any] = field(default_factory=list)  # more activities (Kubernetes)

    def worker(self, *, cached: bool = True) -> Worker:
        """`cached=False`: no sticky cache, so a worker that stopped leaves nothing for the
        test server to wait out (a real server moves the run to the next worker itself)."""
        sender = HandoffActivities(
            HandoffClient(httpx.AsyncClient(timeout=10), SECRET), api_url=API_URL
        )
        guard = GuardActivities(self.env.client, self.slurm, self.task_queue)
        return Worker(
            self.env.client,
            task_queue=self.task_queue,
            workflows=WORKFLOWS,
            activities=[
                *activities_for(
                    self.slurm,
                    self.cloud,
                    self.health,
                    guard,
                    [self.notifier],
                    approval_keys=[APPROVAL_KEY],
                ),  # fmt: skip
                sender.send_handoff,
                *self.extra,
            ],
            **({} if cached else {"max_cached_workflows": 0}),
        )

    def request(self, node: str = "gpu-01", fault: str = "XID_79", **kw: Any) -> IncidentRequest:
        """With an id as the API gives them (the answer route refuses any other)."""
        kw.setdefault("incident_id", f"inc-20260105-{uuid.uuid4().int % 1_000_000:06d}-{node}")
        return super().request(node, fault, **kw)

    def handoff_policy(self, **changes: Any) -> HandoffPolicy:
        return HandoffPolicy(enabled=True, url=self.desk_url + "/tickets", **changes)

    def tickets(self) -> list[Any]:
        assert self.desk is not None
        return list(self.desk.tickets.values())


@asynccontextmanager
async def _desked(env: WorkflowEnvironment, fixed_by: Rung | None = None) -> AsyncIterator[Desked]:
    slurm = FakeSlurm()
    _add_nodes(slurm, 3)
    cloud = FakeCloud(slurm)
    desk = Desk(SECRET)
    with EmulatorServer(desk_app(desk)) as server:
        f = Desked(
            env=env,
            cluster=f"test-{hashlib.sha256(str(id(desk)).encode()).hexdigest()[:8]}",
            task_queue=f"tq-handoff-{id(desk)}",
            slurm=slurm,
            cloud=cloud,
            health=FakeHealth(cloud, fixed_by=fixed_by),
            notifier=RecordingNotifier(),
            desk=desk,
            desk_url=server.url,
        )
        try:
            yield f
        finally:
            for wf_id in [*dict.fromkeys(f.started), guard_workflow_id(f.cluster)]:
                try:
                    await env.client.get_workflow_handle(wf_id).terminate(reason="test over")
                except RPCError:
                    pass  # finished already, or never started


def _handing_off(s: IncidentState) -> bool:
    return _waiting("handoff")(s) and s.handoff is not None and s.handoff.sent_at is not None


async def _answer(handle: Incident, answer: str, **extra: Any) -> None:
    rec = await handle.execute_update(
        NodeRemediation.handoff_answer, HandoffAnswer(answer=answer, **extra)
    )
    assert rec.answer == answer


def _ladder_ends(f: Desked, **handoff: Any) -> IncidentRequest:
    """XID_79: reboot, then replace, each failing its gate (the machine stays broken)."""
    return f.request(policy=_policy(handoff=f.handoff_policy(**handoff)))


async def test_the_ladders_end_hands_off_and_fixed_returns_the_node(
    env: WorkflowEnvironment,
) -> None:
    async with _desked(env) as f, f.worker():
        req = _ladder_ends(f)
        handle = await f.start(req)
        state = await _until(handle, _handing_off, "the hand-off", timeout_s=60)
        node = f.slurm.node_now("gpu-01")
        assert node.drained, "handed off: drained until the provider answers"
        [ticket] = f.tickets()
        assert (ticket.key, ticket.deliveries) == (req.incident_id, 1)
        sent = ticket.request
        assert sent["reason"] == "health_gate_failed"
        assert sent["answer_url"] == API_URL + ANSWER_PATH.format(incident_id=req.incident_id)
        # The evidence bundle: the gates' verdicts, the steps, the faults.
        assert [g["passed"] for g in sent["health_gates"]] == [False, False]
        assert {"repair", "health_gate", "drain"} <= {s["name"] for s in sent["steps"]}
        assert [x["fault"] for x in sent["faults"]] == ["XID_79"]
        assert state.handoff is not None and state.handoff.ticket == ticket.ticket

        f.health.fixed_by = Rung.REBOOT  # the provider mended the machine
        await _answer(handle, "fixed", note="reseated GPU 3")
        result = await handle.result()

    assert result.status == "resolved"
    names = [s.name for s in result.steps]
    assert names[names.index("handoff") :] == [
        "handoff",
        "notify_handoff_sent",
        "handoff_answer",
        "notify_handoff_answered",
        "health_gate",
        "return_to_service",
        "notify_resolved",
    ]
    assert [h.passed for h in result.health] == [False, False, True]
    assert result.handoff is not None and result.handoff.note == "reseated GPU 3"
    assert not f.slurm.node_now("gpu-01").drained
    assert [t.deliveries for t in f.tickets()] == [1]


async def test_a_providers_fault_is_handed_off_at_once_and_replaced_is_brought_up(
    env: WorkflowEnvironment,
) -> None:
    async with _desked(env, fixed_by=Rung.REPLACE) as f, f.worker():
        req = f.request(policy=_policy(handoff=f.handoff_policy(faults=["XID_79"])))
        handle = await f.start(req)
        await _until(handle, _handing_off, "the hand-off")
        assert f.cloud.repair_calls == [], "the provider's fault: no repair of ours"
        assert f.tickets()[0].request["reason"] == "provider_fault"
        # The provider puts a new machine behind the node, then answers.
        await f.cloud.repair("gpu-01", Rung.REPLACE, "the-providers-own")
        await _answer(handle, "replaced", new_vm_id="vm-new-1")
        result = await handle.result()

    assert result.status == "resolved"
    names = [s.name for s in result.steps]
    after = names[names.index("handoff_answer") :]
    assert after[:4] == [
        "handoff_answer",
        "notify_handoff_answered",
        "wait_registered",
        "health_gate",
    ]
    assert "repair" not in names
    assert result.new_vm_id == "vm-new-1"
    assert not f.slurm.node_now("gpu-01").drained


async def test_replaced_on_kubernetes_waits_for_the_new_node_first(
    env: WorkflowEnvironment,
) -> None:
    k8s = FakeKubernetes()
    async with _desked(env, fixed_by=Rung.REPLACE) as f:
        f.extra = k8s.activities()
        async with f.worker():
            policy = _policy(handoff=f.handoff_policy(faults=["XID_79"]))
            req = f.request(policy=policy).model_copy(update={"kubernetes": True})
            handle = await f.start(req)
            await _until(handle, _handing_off, "the hand-off")
            await f.cloud.repair("gpu-01", Rung.REPLACE, "the-providers-own")
            await _answer(handle, "replaced")
            result = await handle.result()

    assert result.status == "resolved"
    names = [s.name for s in result.steps]
    after = names[names.index("handoff_answer") :]
    # As after a replacement of ours: the new Node Ready (and cordoned for the gate), then
    # slurmd, then the gate; the node is given back (uncordoned) only after it passed.
    assert (
        after.index("k8s_wait_ready") < after.index("wait_registered") < after.index("health_gate")
    )
    assert k8s.calls.count("wait_ready") == 1 and k8s.calls[-1] == "uncordon"


async def test_a_lemon_goes_to_the_provider_instead_of_the_approvers(
    env: WorkflowEnvironment,
) -> None:
    async with _desked(env, fixed_by=Rung.REBOOT) as f, f.worker():
        policy = _policy(
            lemon_repairs=2, handoff=f.handoff_policy(when=["health_gate_failed", "lemon"])
        )
        req = f.request(policy=policy).model_copy(update={"prior_repairs": 1})
        handle = await f.start(req)
        state = await _until(handle, _handing_off, "the hand-off")
        assert state.lemon and state.step("release_lemon") is None
        [ticket] = f.tickets()
        assert ticket.request["reason"] == "lemon"
        assert ticket.request["summary"].startswith("gpu-01 is a lemon: repaired 2 times")
        assert [g["passed"] for g in ticket.request["health_gates"]] == [True]
        # The provider looks at the machine and restarts it (its agent reports a new boot).
        await f.cloud.repair("gpu-01", Rung.REBOOT, "the-providers-own")
        await _answer(handle, "fixed")
        result = await handle.result()

    assert result.status == "resolved"
    assert [h.passed for h in result.health] == [True, True]  # gated again after the answer
    assert not f.slurm.node_now("gpu-01").drained


async def test_declined_leaves_the_node_drained_and_closes_handed_off(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _desked(env) as f, f.worker():
        req = f.request(policy=_policy(handoff=f.handoff_policy(faults=["XID_79"])))
        handle = await f.start(req)
        await _until(handle, _handing_off, "the hand-off")
        await _answer(handle, "declined", note="not a hardware fault")
        result = await handle.result()

        # The provider's retry of the same answer (its response lost) is a 200 `repeat`;
        # another answer to a closed hand-off is refused.
        async def found(*_: Any) -> Any:  # the time-skipping server has no visibility
            return handle

        monkeypatch.setattr(incidents, "find_incident", found)
        path = ANSWER_PATH.format(incident_id=req.incident_id)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=_api(f, env.client)), base_url=API_URL
        ) as http:
            said = {}
            for answer in ("declined", "fixed"):
                body = HandoffAnswer(answer=answer).model_dump_json().encode()
                said[answer] = await http.post(path, content=body, headers=_signed(body))
        assert said["declined"].status_code == 200, said["declined"].text
        assert said["declined"].json()["repeat"] is True
        assert said["fixed"].status_code == 409, said["fixed"].text

    assert result.status == "handed_off"
    assert result.handoff is not None and result.handoff.answer == "declined"
    node = f.slurm.node_now("gpu-01")
    assert node.drained and node.reason == f"autoclusters: {req.incident_id} {req.fault}"
    assert f.slurm.calls["resume"] == 0
    closing = f.notes()[-1]
    assert closing.event == "handed_off"
    assert "declined" in closing.text and "not a hardware fault" in closing.text


async def test_no_answer_is_reminded_at_the_policys_interval(env: WorkflowEnvironment) -> None:
    async with _desked(env) as f, f.worker():
        policy = f.handoff_policy(faults=["XID_79"], reminder_interval_s=REMINDER_S)
        handle = await f.start(f.request(policy=_policy(handoff=policy)))
        await _until(handle, _handing_off, "the hand-off")
        assert "handoff_reminder" not in f.events()
        await env.sleep(2.5 * REMINDER_S)
        state = await _until(
            handle, lambda s: s.handoff is not None and s.handoff.reminders == 2, "2 reminders"
        )
        assert f.events().count("handoff_reminder") == 2
        assert state.status == "open" and _waiting("handoff")(state)
        await _answer(handle, "declined")
        result = await handle.result()
    assert result.status == "handed_off"
    assert [t.deliveries for t in f.tickets()] == [1]


async def test_a_desk_that_is_away_is_tried_again_and_gets_one_ticket(
    env: WorkflowEnvironment,
) -> None:
    async with _desked(env) as f, f.worker():
        assert f.desk is not None
        f.desk.faults.append(DeskFault(status=503, count=2))
        handle = await f.start(
            f.request(policy=_policy(handoff=f.handoff_policy(faults=["XID_79"])))
        )
        await _until(handle, _handing_off, "the hand-off", timeout_s=60)
        assert f.desk.faults == []  # both refusals were met: three tries in all
        assert [t.deliveries for t in f.tickets()] == [1]


async def test_a_refused_hand_off_fails_the_incident_with_the_node_drained(
    env: WorkflowEnvironment,
) -> None:
    async with _desked(env) as f, f.worker():
        assert f.desk is not None
        f.desk.faults.append(DeskFault(status=400, count=1))  # not a retry's to mend
        policy = _policy(handoff=f.handoff_policy(faults=["XID_79"]))
        handle = await f.start(f.request(policy=policy))
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        state = await handle.query(NodeRemediation.status)

    assert state.status == "failed"
    assert state.error is not None and "refused the hand-off: 400" in state.error
    assert f.slurm.node_now("gpu-01").drained
    assert f.tickets() == [] and f.events()[-1] == "failed"


async def test_a_worker_and_an_api_restart_between_request_and_answer(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _desked(env) as f:
        req = _ladder_ends(f)
        async with f.worker(cached=False):
            handle = await f.start(req)
            await _until(handle, _handing_off, "the hand-off", timeout_s=60)
        # The first worker is gone; the next one replays the run from its history.
        async with f.worker(cached=False):

            async def found(*_: Any) -> Any:  # the time-skipping server has no visibility
                return handle

            monkeypatch.setattr(incidents, "find_incident", found)
            f.health.fixed_by = Rung.REBOOT
            for _ in range(2):  # an API restarted: a fresh app, nothing kept between them
                app = _api(f, env.client)
            body = HandoffAnswer(answer="fixed", ticket="TKT-0001").model_dump_json().encode()
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url=API_URL
            ) as http:
                r = await http.post(
                    ANSWER_PATH.format(incident_id=req.incident_id),
                    content=body,
                    headers=_signed(body),
                )
            assert r.status_code == 200, r.text
            result = await handle.result()

    assert result.status == "resolved"
    assert [(t.key, t.deliveries) for t in f.tickets()] == [(req.incident_id, 1)]
    assert [s.name for s in result.steps].count("handoff") == 1


async def test_an_answer_before_any_hand_off_is_refused(
    env: WorkflowEnvironment,
) -> None:
    async with _desked(env) as f, f.worker():
        req = f.request(policy=_policy(mode="approve", handoff=f.handoff_policy()))
        handle = await f.start(req)
        await _until(handle, _waiting("approval"), "the approval")
        with pytest.raises(WorkflowUpdateFailedError) as caught:
            await _answer(handle, "fixed")
        assert "no hand-off was made" in str(caught.value.cause)
    assert f.tickets() == []


def _signed(body: bytes) -> dict[str, str]:
    return signed_headers(SECRET, int(time.time()), body)


def _api(f: Fleet, client: Client) -> Any:
    s = HermeticSettings(
        cluster=f.cluster,
        temporal=TemporalSettings(task_queue=f.task_queue),
        api_inventory="static",
        handoff=HandoffSettings(secret=SecretStr(SECRET)),
    )

    async def connect() -> Client:
        return client

    return create_app(s, connect, StaticInventory(["gpu-01"]))


async def test_observe_mode_plans_the_hand_off_and_sends_nothing(
    env: WorkflowEnvironment,
) -> None:
    async with _desked(env) as f, f.worker():
        at_once = _policy(mode="observe", handoff=f.handoff_policy(faults=["XID_79"]))
        at_the_end = _policy(mode="observe", handoff=f.handoff_policy())
        first = await (await f.start(f.request(policy=at_once))).result()
        second = await (await f.start(f.request("gpu-02", policy=at_the_end))).result()

    assert first.status == second.status == "observed"
    assert first.planned_steps[-1].startswith("hand gpu-01 off to the provider")
    assert not any("reboot" in step for step in first.planned_steps)
    assert second.planned_steps[-2].startswith("where the ladder ends with a failed gate")
    assert second.planned_steps[-1] == "return to service"
    assert f.tickets() == []
