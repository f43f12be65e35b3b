"""GpuSharing borrowing from inference, on the time-skipping test server against the
in-memory world of tests/fakes/sharing.py, with a remediation incident's side added: a fault
drains a training node and requeues its job (it waits to start), a repair brings it back.

Aspects covered:
- an incident takes a node of a 2-node job, no spare: the inference node serving least goes
  to training through a return's steps (health gate included), the job starts on it at
  its width, the incident's Slack thread says so, the sharing workflow's status shows it;
- re-evaluating borrows nothing more (one borrow per incident);
- the repaired node back: the borrowed node goes back to inference through a lend's steps
  (its job asked to checkpoint and requeue once), within one evaluation interval (timer
  driven, time skipped), told in the incident's thread;
- inference breaching its SLO gives the node back before the repair ends;
- a free spare, or the policy off, borrows nothing.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from autoclusters.clients.sharing import MoveRefused, request_move
from autoclusters.core.sharing import MoveRequest, Pool
from tests.fakes.sharing import LEND_STEPS, RETURN_STEPS
from tests.fakes.sharing_borrow import HIGH, JOB, OK, world
from tests.helpers import eventually
from tests.workflows.test_gpu_sharing import policy, running_sharing

pytestmark = pytest.mark.workflow


def borrowing(**changes: Any) -> Any:
    fields: dict[str, Any] = {
        "borrow_from_inference": True,
        "borrow_headroom": 0.5,
        "return_below": 0.2,  # OK is inside the band: no return on calm
        "min_inference_nodes": 1,
    }
    return policy(**{**fields, **changes})


async def test_an_incident_borrows_an_inference_node_and_the_repair_gives_it_back(
    env: WorkflowEnvironment,
) -> None:
    w = world()
    async with running_sharing(env, w, borrowing()) as r:
        s = await r.evaluate()
        assert w.names() == [] and s.lost == []
        w.fault("gpu-01", "inc-1")
        s = await r.evaluate()
        borrow_move = r.move(s, "gpu-03")
        assert borrow_move.move.to == "training" and borrow_move.status == "done"
        # A return's steps (the gate's call names no move), then the incident is told.
        assert w.names() == [*RETURN_STEPS, "notify"]
        # Off inference with its pod cheapest first, the other replica stays.
        assert [c.replicas for c in w.of("share_k8s_release")] == [1]
        assert w.regrown == [{JOB: 2}]
        assert w.width(JOB) == 2 and JOB in w.nodes["gpu-03"].jobs
        (b,) = s.borrows
        assert (b.node, b.for_node, b.incident_id, b.status) == (
            "gpu-03",
            "gpu-01",
            "inc-1",
            "lent",
        )
        assert b.jobs == {JOB: 2} and b.lent_at is not None
        assert [lost.node for lost in s.lost] == ["gpu-01"]
        assert s.pools["gpu-03"] == Pool.TRAINING
        (told,) = [n for n in w.notes if n.incident_id == "inc-1"]
        assert told.event == "borrowed_from_inference" and told.node == "gpu-01"
        assert "gpu-03" in told.text and told.fault == "XID_79"

        # A person cannot move it meanwhile: the borrow gives it back on its own.
        with pytest.raises(MoveRefused, match="lent to training while gpu-01 is repaired"):
            await request_move(
                env.client, r.cluster, MoveRequest(node="gpu-03", to="inference", requested_by="al")
            )
        # The repair is not done: nothing more moves, and no second borrow.
        calls = len(w.names())
        s = await r.evaluate(2)
        assert len(w.names()) == calls and len(s.borrows) == 1

        w.repair("gpu-01")
        s = await r.evaluate()
    back = r.move(s, "gpu-03")
    assert back.move.to == "inference" and back.status == "done"
    assert w.names()[calls:] == [*LEND_STEPS, "notify"]
    assert w.requeued == {JOB: 1}  # asked to checkpoint and requeue once, to leave gpu-03
    assert w.replicas == 2 and s.pools["gpu-03"] == Pool.INFERENCE
    (b,) = s.borrows
    assert b.status == "returned" and b.give_back_move == back.move.move_id
    assert b.returned_at is not None and s.lost == []
    assert [n.event for n in w.notes if n.incident_id == "inc-1"] == [
        "borrowed_from_inference",
        "borrow_returned",
    ]
    assert w.violations == []


async def test_the_node_goes_back_within_one_interval_of_the_repair(
    env: WorkflowEnvironment,
) -> None:
    w = world()
    every = 30.0
    async with running_sharing(env, w, borrowing(evaluate_every_s=every)) as r:
        await env.sleep(timedelta(seconds=every + 1))
        w.fault("gpu-01", "inc-1")

        async def lent() -> Any:
            s = await r.status()
            return s if s.borrows and s.borrows[0].status == "lent" else None

        await env.sleep(timedelta(seconds=every))
        await eventually(lent, what="the borrow, on the timer")
        w.repair("gpu-01")
        repaired_at = (await env.get_current_time()).timestamp()
        await env.sleep(timedelta(seconds=every))

        async def returned() -> Any:
            s = await r.status()
            return s if s.borrows[0].status == "returned" else None

        s = await eventually(returned, what="the give-back, on the timer")
    b = s.borrows[0]
    assert b.returned_at is not None
    assert 0 < b.returned_at - repaired_at <= every + 5


async def test_inference_breaching_takes_its_node_back_before_the_repair_ends(
    env: WorkflowEnvironment,
) -> None:
    w = world([OK, OK, OK, HIGH, HIGH])
    async with running_sharing(env, w, borrowing()) as r:
        await r.evaluate()
        w.fault("gpu-01", "inc-1")
        s = await r.evaluate()
        assert s.borrows[0].status == "lent"
        s = await r.evaluate(3)  # OK, then the SLO breached twice: sustain 2
    assert [m.move.to for m in s.moves] == ["training", "inference"]
    assert s.borrows[0].status == "returned" and "breached" in s.moves[-1].move.reason
    assert w.nodes["gpu-01"].in_incident  # the repair goes on; inference came first


@pytest.mark.parametrize("case", ["spare", "off"])
async def test_a_free_spare_or_the_policy_off_borrows_nothing(
    env: WorkflowEnvironment, case: str
) -> None:
    w = world(spares=1 if case == "spare" else 0)
    pol = borrowing(borrow_from_inference=case != "off")
    async with running_sharing(env, w, pol) as r:
        await r.evaluate()
        w.fault("gpu-01", "inc-1")
        s = await r.evaluate(2)
    assert w.names() == [] and s.borrows == []
    if case == "spare":
        assert "spare(s) free" in s.last_borrow_verdict
    else:
        assert s.lost == []  # not even watched: older runs replay as they were
