"""The fleet guard's batched calls (core/guard_batch.py, activities/guard_batch.py).

At a thousand concurrent incidents, one update per guard call ran into Temporal's 10
updates in flight per workflow, and most incidents failed their registration (measured
with bench/scale.py: 179 of 200). Aspects covered:
- many incidents registering and asking at once through one worker's GuardActivities all
  get their own answers, in fewer updates (and Slurm reads) than calls, and the guard's
  limits hold exactly;
- a malformed call in a batch is refused alone: the others in it still count;
- the batcher keeps at most two batches in flight, and waits out "too many updates in
  flight" instead of failing the calls;
- against a guard that knows no `batch` (a rolling upgrade) it falls back to one update
  per call, with each call's own update name;
- a GuardCall carries exactly the argument of its update;
- a batch carries Slurm's view once, the newest, ahead of the calls that brought one;
- a recorded guard history with batches replays on the current code.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from temporalio.client import WorkflowHistory, WorkflowUpdateFailedError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from autoclusters.activities.guard import GuardActivities
from autoclusters.activities.guard_batch import GuardBatcher, one_view
from autoclusters.core.guard import (
    Admission,
    AdmitCall,
    AdmitRequest,
    GuardContext,
    IncidentOpened,
    RegisterCall,
    Registration,
    ReleaseRequest,
    SlurmView,
    guard_workflow_id,
)
from autoclusters.core.guard_batch import GuardAnswer, GuardBatch, GuardCall
from autoclusters.core.policy import GuardPolicy
from autoclusters.workflows.fleet_guard import FleetGuard
from tests.fakes.systems import FakeSlurm

EXECUTION_TIMEOUT = timedelta(days=7)


def _context(**policy: Any) -> GuardContext:
    return GuardContext(cluster=f"test-{uuid.uuid4().hex[:8]}", policy=GuardPolicy(**policy))


async def test_many_incidents_at_once_each_get_their_answer_in_few_updates(
    env: WorkflowEnvironment,
) -> None:
    nodes = [f"gpu-{i:02d}" for i in range(1, 41)]
    slurm = FakeSlurm()
    for n in nodes:
        slurm.add_node(n)
    # 40 nodes, 75 % in service: 10 may be out at once; 2 repairs at once.
    ctx = _context(max_concurrent_repairs=2, breaker_threshold=100)
    tq = f"tq-{uuid.uuid4()}"
    acts = GuardActivities(env.client, slurm, tq, execution_timeout=EXECUTION_TIMEOUT)
    run = ActivityEnvironment().run
    handle = env.client.get_workflow_handle_for(FleetGuard.run, guard_workflow_id(ctx.cluster))
    async with Worker(env.client, task_queue=tq, workflows=[FleetGuard]):
        try:
            regs: list[Registration] = await asyncio.gather(
                *(
                    run(
                        acts.register,
                        RegisterCall(
                            guard=ctx,
                            incident=IncidentOpened(node=n, incident_id=f"INC-{n}", fault="X"),
                        ),
                    )
                    for n in nodes
                )
            )
            assert [r.recent_on_node for r in regs] == [0] * 40
            quarantine: list[Admission] = await asyncio.gather(
                *(
                    run(acts.admit_quarantine, AdmitCall(guard=ctx, node=n, incident_id=f"INC-{n}"))
                    for n in nodes
                )
            )
            admitted = [n for n, a in zip(nodes, quarantine, strict=True) if a.admitted]
            held = [a for a in quarantine if not a.admitted]
            assert len(admitted) == 10
            assert sorted(a.position for a in held if a.position) == list(range(1, 31))
            repair: list[Admission] = await asyncio.gather(
                *(
                    run(acts.admit_repair, AdmitCall(guard=ctx, node=n, incident_id=f"INC-{n}"))
                    for n in admitted
                )
            )
            assert sum(a.admitted for a in repair) == 2

            st = (await handle.query(FleetGuard.status)).state
            assert sorted(st.out_of_service) == sorted(admitted)
            assert len(st.repairing) == 2 and len(st.opens) == 40
            # Fewer updates than calls: concurrent calls went out together.
            calls = 40 + 40 + len(admitted)
            assert 0 < acts._batcher.batches < calls
            # Calls that came while Slurm was being read shared the read.
            assert slurm.calls["nodes"] < calls
        finally:
            await handle.terminate()


async def test_a_malformed_call_is_refused_alone(env: WorkflowEnvironment) -> None:
    ctx = _context()
    tq = f"tq-{uuid.uuid4()}"
    handle = env.client.get_workflow_handle_for(FleetGuard.run, guard_workflow_id(ctx.cluster))
    good = AdmitRequest(node="gpu-01", incident_id="INC-1", cluster_nodes=8)
    bad = AdmitRequest(node=" ", incident_id="INC-2", cluster_nodes=8)
    release = ReleaseRequest(node="gpu-01", incident_id="INC-1", back_in_service=True)
    async with Worker(env.client, task_queue=tq, workflows=[FleetGuard]):
        try:
            await env.client.start_workflow(
                FleetGuard.run,
                ctx.guard_input(),
                id=handle.id,
                task_queue=tq,
                execution_timeout=EXECUTION_TIMEOUT,
            )
            batch = GuardBatch(
                calls=[
                    GuardCall(update="admit_quarantine", admit=good),
                    GuardCall(update="admit_repair", admit=bad),
                    GuardCall(update="admit_repair", admit=good),
                ]
            )
            answers = await handle.execute_update(FleetGuard.batch, batch)
            assert answers[0].admission is not None and answers[0].admission.admitted
            assert answers[1].refused == "node must not be empty"
            assert answers[2].admission is not None and answers[2].admission.admitted
            st = (await handle.query(FleetGuard.status)).state
            assert (st.out_of_service, st.repairing) == ({"gpu-01": "INC-1"}, {"gpu-01": "INC-1"})

            done = await handle.execute_update(
                FleetGuard.batch, GuardBatch(calls=[GuardCall(update="release", release=release)])
            )
            assert done == [GuardAnswer()]
            st = (await handle.query(FleetGuard.status)).state
            assert (st.out_of_service, st.repairing) == ({}, {})
        finally:
            await handle.terminate()


async def test_a_refused_call_fails_its_activity_for_good(env: WorkflowEnvironment) -> None:
    slurm = FakeSlurm()
    slurm.add_node("gpu-01")
    ctx = _context()
    tq = f"tq-{uuid.uuid4()}"
    acts = GuardActivities(env.client, slurm, tq, execution_timeout=EXECUTION_TIMEOUT)
    handle = env.client.get_workflow_handle_for(FleetGuard.run, guard_workflow_id(ctx.cluster))
    async with Worker(env.client, task_queue=tq, workflows=[FleetGuard]):
        try:
            with pytest.raises(ApplicationError) as err:
                await ActivityEnvironment().run(
                    acts.admit_quarantine, AdmitCall(guard=ctx, node="", incident_id="INC-1")
                )
            assert err.value.type == "GuardRejected" and err.value.non_retryable
        finally:
            await handle.terminate()


# --- the batcher alone, with a scripted Temporal -----------------------------------------


def _admit(n: int) -> GuardCall:
    return GuardCall(
        update="admit_repair",
        admit=AdmitRequest(node=f"gpu-{n:02d}", incident_id=f"INC-{n}", cluster_nodes=8),
    )


async def test_the_batcher_waits_out_too_many_updates_in_flight() -> None:
    sent: list[int] = []

    async def send(guard: GuardContext, update: str, arg: Any, result: type) -> Any:
        if len(sent) < 2:
            sent.append(0)
            raise RPCError("limit on number of concurrent in-flight updates has been reached",
                           RPCStatusCode.RESOURCE_EXHAUSTED, b"")  # fmt: skip
        assert update == "batch" and isinstance(arg, GuardBatch)
        sent.append(len(arg.calls))
        return [GuardAnswer(admission=Admission(admitted=True)) for _ in arg.calls]

    batcher = GuardBatcher(send)
    ctx = _context()
    answers = await asyncio.gather(*(batcher.call(ctx, _admit(n)) for n in range(5)))
    assert all(a.admission is not None and a.admission.admitted for a in answers)
    assert sent[:2] == [0, 0] and sum(sent) == 5  # refused twice, then all of them


async def test_the_batcher_falls_back_to_one_update_per_call_on_an_older_guard() -> None:
    sent: list[str] = []

    async def send(guard: GuardContext, update: str, arg: Any, result: type) -> Any:
        sent.append(update)
        if update == "batch":
            raise WorkflowUpdateFailedError(
                ApplicationError("Update handler for 'batch' expected but not found")
            )
        if update == "register":
            assert result is Registration
            return Registration.model_validate({"recent_on_node": 1, "breaker": {}})
        return None if update == "release" else Admission(admitted=False, reason=update)

    batcher = GuardBatcher(send)
    ctx = _context()
    opened = IncidentOpened(node="gpu-01", incident_id="INC-1", fault="X")
    release = ReleaseRequest(node="gpu-01", incident_id="INC-1", back_in_service=True)
    reg, adm, rel = await asyncio.gather(
        batcher.call(ctx, GuardCall(update="register", opened=opened)),
        batcher.call(ctx, _admit(1)),
        batcher.call(ctx, GuardCall(update="release", release=release)),
    )
    assert reg.registration is not None and reg.registration.recent_on_node == 1
    assert adm.admission == Admission(admitted=False, reason="admit_repair")
    assert rel == GuardAnswer()
    assert sent == ["batch", "register", "admit_repair", "release"]
    await batcher.call(ctx, _admit(2))  # from now on, never batched again
    assert sent[-1] == "admit_repair"


def test_a_guard_call_carries_exactly_its_updates_argument() -> None:
    admit = AdmitRequest(node="gpu-01", incident_id="INC-1", cluster_nodes=8)
    with pytest.raises(ValidationError, match="register takes `opened` only"):
        GuardCall(update="register", admit=admit)
    with pytest.raises(ValidationError, match="admit_quarantine takes `admit` only"):
        GuardCall(update="admit_quarantine")


def test_a_batch_carries_slurms_view_once_the_newest_first() -> None:
    def admit(n: int, out: list[str]) -> GuardCall:
        req = AdmitRequest(
            node=f"gpu-{n:02d}", incident_id=f"INC-{n}", cluster_nodes=8, out_of_service=out
        )
        return GuardCall(update="admit_quarantine", admit=req)

    release = ReleaseRequest(node="gpu-09", incident_id="INC-9", back_in_service=True)
    opened = IncidentOpened(
        node="gpu-03", incident_id="INC-3", fault="X", slurm=SlurmView(cluster_nodes=8)
    )
    calls = [
        GuardCall(update="release", release=release),
        admit(1, ["gpu-05"]),
        GuardCall(update="register", opened=opened),
        admit(2, ["gpu-05", "gpu-06"]),  # the newest
    ]
    sent = one_view(calls)
    assert sent[0] == calls[0]
    assert sent[1].admit is not None and sent[1].admit.out_of_service == ["gpu-05", "gpu-06"]
    assert sent[2].opened is not None and sent[2].opened.slurm is None
    assert sent[3].admit is not None and sent[3].admit.out_of_service is None
    assert [c.admit.cluster_nodes for c in sent if c.admit] == [8, 8]
    assert one_view(calls[:2]) == calls[:2]  # one view: nothing to share


async def test_the_batcher_keeps_at_most_two_batches_in_flight() -> None:
    in_flight, most, sizes = 0, 0, []
    gate = asyncio.Event()

    async def send(guard: GuardContext, update: str, arg: Any, result: type) -> Any:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        sizes.append(len(arg.calls))
        await gate.wait()
        in_flight -= 1
        return [GuardAnswer(admission=Admission(admitted=True)) for _ in arg.calls]

    batcher = GuardBatcher(send, max_items=3)
    ctx = _context()
    calls = [asyncio.ensure_future(batcher.call(ctx, _admit(n))) for n in range(10)]
    while len(sizes) < 2:
        await asyncio.sleep(0)
    assert most == 2 and sizes == [3, 3]  # the rest wait for a batch to come back
    gate.set()
    answers = await asyncio.gather(*calls)
    assert len(answers) == 10 and most == 2 and sum(sizes) == 10


ACCEPTED = "workflow_execution_update_accepted_event_attributes"
BATCH_HISTORY = Path(__file__).parents[1] / "histories" / "fleet_guard_0.1_batch.json"


async def test_a_guard_history_with_batches_replays() -> None:
    """Recorded for the 0.1 baseline (registrations, admissions with a queue, a release, in
    three batches): later guard code must replay it."""
    replayer = Replayer(workflows=[FleetGuard], data_converter=pydantic_data_converter)
    history = WorkflowHistory.from_json("fleet-guard-0.1-batch", BATCH_HISTORY.read_text())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure
    updates = [e for e in history.events if e.WhichOneof("attributes") == ACCEPTED]
    assert len(updates) == 3
