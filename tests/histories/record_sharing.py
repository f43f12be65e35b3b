"""Record GpuSharing histories for the replay test (tests/workers/test_replay.py).

Run for each release, with the released code (docs/versioning.md):
    .venv/bin/python scripts/record-histories.py 0.1
    .venv/bin/python -m tests.histories.record_sharing 0.1 [case ...]
It runs the sharing workflow on the time-skipping server against the in-memory world of
tests/fakes/sharing.py: a sustained breach lends a node (its job checkpointed and requeued), a
calm spell returns it (gate, resume, regrow); a manual move and a rejected approval follow;
`proven_decision` (from 0.2): a forged decision refused, the old signal ignored, a proven
approval lends; `borrow` (tests/fakes/sharing_borrow.py): an incident takes a node of a 2-node job,
an inference node is lent to the job, and given back once the node is repaired.
Writes gpu_sharing_<version>_<case>.json beside this file.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
import uuid
from datetime import timedelta
from pathlib import Path

from temporalio.client import WorkflowUpdateFailedError
from temporalio.worker import Worker

from autoclusters.core.sharing import (
    InferenceTarget,
    MoveDecision,
    MoveRequest,
    SharePolicy,
    SharingInput,
    sharing_workflow_id,
)
from autoclusters.workflows.gpu_sharing import GpuSharing
from tests.decisions import proof_checks, signed_move
from tests.fakes.sharing import Node, ShareWorld
from tests.fakes.sharing_borrow import IncidentWorld
from tests.fakes.sharing_borrow import world as incident_world
from tests.helpers import eventually, time_skipping_env

HERE = Path(__file__).resolve().parent
HIGH, LOW = 0.9, 0.05


def _policy(**changes: object) -> SharePolicy:
    fields: dict[str, object] = {
        "inference": InferenceTarget(slo=0.5),
        "min_training_nodes": 1,
        "max_inference_nodes": 2,
        "sustain": 2,
        "cooldown_s": 0,
        "evaluate_every_s": 3600,
    }
    return SharePolicy.model_validate({**fields, **changes})


async def _run(case: str, version: str) -> None:
    env = await time_skipping_env()
    async with env:
        approval = case == "manual_and_rejected"
        proven = case == "proven_decision"
        borrow = case == "borrow"
        world = ShareWorld(
            [Node("gpu-01", jobs=[101]), Node("gpu-02", jobs=[102]), Node("gpu-03")],
            [HIGH, HIGH, LOW, LOW] if not (approval or proven) else [HIGH, HIGH, HIGH],
            agent=False,
        )
        policy = _policy(needs_approval=approval or proven)
        if borrow:
            world = incident_world()
            policy = _policy(borrow_from_inference=True, return_below=0.2, min_inference_nodes=1)
        cluster = f"rec-{uuid.uuid4().hex[:6]}"
        tq = f"tq-{uuid.uuid4()}"
        async with Worker(
            env.client,
            task_queue=tq,
            workflows=[GpuSharing],
            activities=[*world.activities(), *proof_checks()],
        ):
            handle = await env.client.start_workflow(
                GpuSharing.run,
                SharingInput(cluster=cluster, policy=policy),
                id=sharing_workflow_id(cluster),
                task_queue=tq,
                execution_timeout=timedelta(days=1),
            )

            async def evaluations(n: int) -> bool | None:
                s = await handle.query(GpuSharing.status)
                return True if s.evaluations >= n and s.current is None else None

            async def waiting() -> str | None:
                s = await handle.query(GpuSharing.status)
                cur = s.current
                return cur.move.move_id if cur and cur.status == "waiting_approval" else None

            if borrow:
                assert isinstance(world, IncidentWorld)
                for n, then in enumerate([None, "fault", None, "repair"], start=1):
                    if then == "fault":
                        world.fault("gpu-01", "inc-rec-1")
                    elif then == "repair":
                        world.repair("gpu-01")
                    await handle.signal(GpuSharing.evaluate_now, "record")
                    await eventually(functools.partial(evaluations, n), what=f"evaluation {n}")
                s = await handle.query(GpuSharing.status)
                assert [b.status for b in s.borrows] == ["returned"], s.borrows
            elif not (approval or proven):
                for n in range(1, 5):
                    await handle.signal(GpuSharing.evaluate_now, "record")
                    await eventually(functools.partial(evaluations, n), what=f"evaluation {n}")
            elif approval:
                await handle.signal(GpuSharing.evaluate_now, "record")
                await eventually(lambda: evaluations(1), what="a first look at the nodes")
                move_id = await handle.execute_update(
                    GpuSharing.request_move,
                    MoveRequest(node="gpu-03", to="inference", requested_by="alice"),
                )
                await handle.signal(GpuSharing.evaluate_now, "record")
                pending = await eventually(waiting, what="a move waiting for approval")
                decision = signed_move(cluster, pending, "bob", approve=False)
                await handle.execute_update(GpuSharing.decide_waiting_move, decision)
                await eventually(lambda: evaluations(2), what="the rejection")
                assert move_id and pending != move_id
            elif proven:
                await handle.signal(GpuSharing.evaluate_now, "record")
                await eventually(lambda: evaluations(1), what="a first look at the nodes")
                await handle.signal(GpuSharing.evaluate_now, "record")
                pending = await eventually(waiting, what="a move waiting for approval")
                forged = signed_move(cluster, pending, "alice", key="forged-" + "k" * 32)
                with contextlib.suppress(WorkflowUpdateFailedError):
                    await handle.execute_update(GpuSharing.decide_waiting_move, forged)
                # The old signal decides nothing on a run with proofs.
                await handle.signal(
                    GpuSharing.decide_move, MoveDecision(move_id=pending, approve=True, by="x")
                )
                ok = signed_move(cluster, pending, "alice")
                await handle.execute_update(GpuSharing.decide_waiting_move, ok)
                await eventually(lambda: evaluations(2), what="the approved lend")
                s = await handle.query(GpuSharing.status)
                assert s.moves[-1].approved_by == "alice", s.moves
            await handle.terminate(reason="recorded")
            history = await handle.fetch_history()
    out = HERE / f"gpu_sharing_{version}_{case}.json"
    out.write_text(history.to_json())
    print(f"wrote {out} ({len(history.events)} events)")


async def record(version: str) -> None:
    cases = ["lend_and_return", "manual_and_rejected", "borrow", "proven_decision"]
    for case in sys.argv[2:] or cases:
        await _run(case, version)


if __name__ == "__main__":
    asyncio.run(record(sys.argv[1]))
