"""Record NodeRemediation and FleetGuard histories for the replay test
(tests/workers/test_replay.py).

Run for each release, with the released code (docs/versioning.md):
    .venv/bin/python scripts/record-histories.py 0.1            # every workflow type
    .venv/bin/python -m tests.histories.record 0.1 [case ...]   # these two only
It runs incidents on the time-skipping server against the in-memory Slurm, cloud and health
gate of the workflow tests (tests/workflows/test_remediation_workflow.py's harness) and writes
remediation_<release>_<case>.json and fleet_guard_<release>_<case>.json beside this file.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.client import WorkflowFailureError, WorkflowHistory, WorkflowUpdateFailedError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from autoclusters.core.guard import (
    AdmitRequest,
    GuardInput,
    IncidentOpened,
    ReleaseRequest,
    guard_workflow_id,
)
from autoclusters.core.guard_batch import GuardBatch, GuardCall
from autoclusters.core.handoff import HandoffCall, HandoffSent
from autoclusters.core.handoff_answer import HandoffAnswer
from autoclusters.core.kubernetes import (
    CordonNodeInput,
    CordonNodeResult,
    EvictPodsInput,
    EvictPodsResult,
    NodeIdentity,
    NodeIdentityInput,
    SetNodeConditionInput,
    SetNodeConditionResult,
    UncordonNodeInput,
    UncordonNodeResult,
    WaitNewNodeInput,
)
from autoclusters.core.models import RETURNED_JOBS_STEP, SPARE_REASON, ScreenInput, ScreenResult
from autoclusters.core.policy import FaultRule, GuardPolicy, HandoffPolicy, Rung, StepPolicy
from autoclusters.workflows.fleet_guard import FleetGuard
from autoclusters.workflows.remediation import NodeRemediation
from tests.decisions import proof_checks, proven, proven_reset
from tests.fakes.systems import FakeCloud
from tests.helpers import time_skipping_env
from tests.workflows.test_remediation_workflow import (
    Fleet,
    Incident,
    _fleet,
    _policy,
    _until,
    _until_true,
    _waiting,
)

HERE = Path(__file__).resolve().parent
# Long enough that only a job's end, never the idle timeout, ends wait_idle.
PATIENT = {r: StepPolicy(idle_timeout_s=3600) for r in (Rung.RESET_GPU, Rung.REBOOT, Rung.REPLACE)}


@dataclass
class FakeKubernetes:
    """The Slinky side of the runbook, in memory: a Node that is cordoned, marked, emptied,
    replaced by a new machine (a new providerID) and uncordoned."""

    cordoned: bool = False
    machine: int = 1
    calls: list[str] = field(default_factory=list)

    def _identity(self, node: str) -> NodeIdentity:
        return NodeIdentity(
            node=node,
            uid=f"uid-{self.machine}",
            provider_id=f"crusoe://vm-{self.machine}",
            boot_id=f"boot-{self.machine}",
            instance_id="",
            ready=True,
            unschedulable=self.cordoned,
        )

    def activities(self) -> list[Callable[..., Any]]:
        @activity.defn(name="k8s_cordon")
        async def cordon(inp: CordonNodeInput) -> CordonNodeResult:
            self.calls.append(f"cordon {inp.phase}")
            changed, self.cordoned = not self.cordoned, True
            return CordonNodeResult(cordoned=True, changed=changed)

        @activity.defn(name="k8s_uncordon")
        async def uncordon(inp: UncordonNodeInput) -> UncordonNodeResult:
            self.calls.append("uncordon")
            self.cordoned = False
            return UncordonNodeResult(uncordoned=True, changed=True, detail="uncordoned")

        @activity.defn(name="k8s_evict_pods")
        async def evict(inp: EvictPodsInput) -> EvictPodsResult:
            self.calls.append("evict")
            return EvictPodsResult(evicted=["inference/llm-0"], skipped={"slurm/slurmd": "ds"})

        @activity.defn(name="k8s_wait_new_node_ready")
        async def wait_ready(inp: WaitNewNodeInput) -> NodeIdentity:
            self.calls.append("wait_ready")
            self.machine += 1
            self.cordoned = False  # a new machine registers as a fresh Node
            return self._identity(inp.node)

        @activity.defn(name="k8s_set_condition")
        async def condition(inp: SetNodeConditionInput) -> SetNodeConditionResult:
            self.calls.append(f"condition {inp.unhealthy}")
            return SetNodeConditionResult(changed=True, status=str(inp.unhealthy))

        @activity.defn(name="k8s_node_identity")
        async def identity(inp: NodeIdentityInput) -> NodeIdentity:
            return self._identity(inp.node)

        return [cordon, uncordon, evict, wait_ready, condition, identity]


async def _result(handle: Incident) -> None:
    try:
        await handle.result()
    except WorkflowFailureError:
        pass  # a failed incident is a case too


async def _ask(handle: Incident, step: str, *, reject: bool = False) -> None:
    await _until(handle, _waiting("approval", step), f"the approval of {step}")
    update = NodeRemediation.reject if reject else NodeRemediation.approve
    await handle.execute_update(update, await proven(handle, step, "alice", approve=not reject))


# --- the cases: each runs one incident on a fresh fake cluster and returns its handle ---------


async def reboot_resolved(f: Fleet) -> Incident:
    handle = await f.start(f.request())  # XID_79: reboot, which the health gate passes
    await _result(handle)
    return handle


async def reset_gpu_resolved(f: Fleet) -> Incident:
    handle = await f.start(f.request(fault="XID_46"))  # XID_46: a GPU reset
    await _result(handle)
    return handle


async def replace_escalated(f: Fleet) -> Incident:
    # The reboot does not pass the gate (FakeHealth fixed by a replacement): one rung up.
    handle = await f.start(f.request())
    await _result(handle)
    return handle


async def repair_failed(f: Fleet) -> Incident:
    handle = await f.start(f.request())
    await _result(handle)
    return handle


async def approved(f: Fleet) -> Incident:
    handle = await f.start(f.request(policy=_policy(mode="approve")))
    await _ask(handle, "reboot")
    await _result(handle)
    return handle


async def rejected(f: Fleet) -> Incident:
    handle = await f.start(f.request(policy=_policy(mode="approve")))
    await _ask(handle, "reboot", reject=True)
    await _result(handle)
    return handle


async def hot_spare(f: Fleet) -> Incident:
    await f.slurm.drain("gpu-04", SPARE_REASON)
    spares = GuardPolicy(min_in_service_fraction=0.5, breaker_threshold=10, spares=["gpu-04"])
    handle = await f.start(f.request(fault="XID_61", policy=_policy(guard=spares)))
    await _result(handle)
    return handle


async def kubernetes(f: Fleet) -> Incident:
    req = f.request(fault="XID_61").model_copy(update={"kubernetes": True})  # a replacement
    handle = await f.start(req)
    await _result(handle)
    return handle


async def quarantine_recheck(f: Fleet) -> Incident:
    """The node is resumed and filled again while the incident waits for approval: it is
    quarantined again before the repair."""
    steps = {**PATIENT, Rung.REBOOT: StepPolicy(idle_timeout_s=60)}
    handle = await f.start(f.request(policy=_policy(mode="approve", steps=steps)))
    await _until(handle, _waiting("approval", "reboot"), "the approval wait")
    f.slurm.admin_resume("gpu-01")
    f.slurm.add_job(201, nodes="gpu-01")
    f.slurm.add_job(202, nodes="gpu-01", requeue=False)
    await handle.execute_update(NodeRemediation.approve, await proven(handle, "reboot", "alice"))
    await _until(handle, lambda s: s.step("requarantine") is not None, "the requarantine")
    f.slurm.finish_job(202)
    await _result(handle)
    return handle


async def returned_jobs(f: Fleet) -> Incident:
    """A requeued job is back on the node (its drain lost during the approval wait): a
    human decides to cancel it; never a second requeue."""
    handle = await f.start(f.request(policy=_policy(mode="approve", steps=PATIENT)))
    await _until(handle, _waiting("approval", "reboot"), "the approval wait")
    f.slurm.admin_resume("gpu-01")
    f.slurm.run_again(101, nodes="gpu-01")
    await handle.execute_update(NodeRemediation.approve, await proven(handle, "reboot", "alice"))
    await _ask(handle, RETURNED_JOBS_STEP)
    await _result(handle)
    return handle


async def slurm_outage(f: Fleet) -> Incident:
    """slurmctld away for a minute while the incident waits for a job that cannot be
    requeued: waited out, then the runbook goes on."""
    f.slurm.add_job(105, nodes="gpu-01", requeue=False)
    handle = await f.start(f.request(policy=_policy(steps=PATIENT, outage_notify_after_s=30)))
    await _until(handle, lambda s: s.current_step == "wait_idle", "wait_idle")
    f.slurm.down = True
    await f.env.sleep(65)
    await _until(handle, lambda s: "unreachable" in (s.step("wait_idle") or _NO).detail, "outage")
    f.slurm.down = False
    f.slurm.finish_job(105)
    await _result(handle)
    return handle


async def held_then_admitted(f: Fleet) -> Incident:
    """A second incident's quarantine is held by the guard (one node out at a time), queued,
    and admitted by the guard's signal once the first node is back."""
    guard = GuardPolicy(min_in_service_fraction=0.75)
    first = await f.start(f.request("gpu-01", policy=_policy(guard=guard)))
    await asyncio.wait_for(f.cloud.started.wait(), timeout=30)
    second = await f.start(f.request("gpu-02", policy=_policy(guard=guard)))
    await _until(second, _waiting("admission", "quarantine"), "the held quarantine")
    f.cloud.release.set()
    await _result(first)
    await _result(second)
    return second


async def held_drain_at_floor(f: Fleet) -> Incident:
    """As held_then_admitted, and the held node's critical fault asks to drain it meanwhile:
    the guard holds that too (the cluster is at its floor), so it is drained only by its
    quarantine once admitted."""
    guard = GuardPolicy(min_in_service_fraction=0.75)
    first = await f.start(f.request("gpu-01", policy=_policy(guard=guard)))
    await asyncio.wait_for(f.cloud.started.wait(), timeout=30)
    second = await f.start(f.request("gpu-02", policy=_policy(guard=guard)))
    await _until(second, _waiting("admission", "quarantine"), "the held quarantine")
    await _until_true(lambda: "held" in f.notifier.events, "the held notice")
    f.cloud.release.set()
    await _result(first)
    await _result(second)
    return second


async def proven_decision(f: Fleet) -> Incident:
    """A decision counts only with the API's proof: a forged one is refused (the worker's
    check, recorded in the incident), then a proven approval repairs."""
    handle = await f.start(f.request(policy=_policy(mode="approve")))
    await _until(handle, _waiting("approval", "reboot"), "the approval of reboot")
    forged = await proven(handle, "reboot", "alice", key="forged-" + "k" * 32)
    with contextlib.suppress(WorkflowUpdateFailedError):
        await handle.execute_update(NodeRemediation.approve, forged)
    await _ask(handle, "reboot")
    await _result(handle)
    return handle


@activity.defn(name="send_handoff")
async def _handoff_taken(call: HandoffCall) -> HandoffSent:
    """The provider's desk, taking the hand-off at once."""
    return HandoffSent(status=200, ticket="TKT-0001", accepted_at=time.time())


async def handoff_fixed(f: Fleet) -> Incident:
    """The ladder ends with a failed gate and the policy hands off (from 0.2,
    docs/handoff.md): the provider answers fixed; the node is gated again and returned."""
    handoff = HandoffPolicy(enabled=True, url="http://desk.test/tickets")
    handle = await f.start(f.request(policy=_policy(handoff=handoff)))
    await _until(handle, _waiting("handoff"), "the hand-off", timeout_s=60)
    f.health.fixed_by = Rung.REBOOT
    await handle.execute_update(NodeRemediation.handoff_answer, HandoffAnswer(answer="fixed"))
    await _result(handle)
    return handle


async def screened_back(f: Fleet) -> Incident:
    """A hung job's node (JOB_HANG, `screen_before_repair`): its job requeued, then the
    screen before any repair, which it passes: returned unrepaired (from 0.2)."""
    handle = await f.start(f.request(fault="JOB_HANG", policy=_policy(faults=SILENT)))
    await _result(handle)
    return handle


async def screened_then_repaired(f: Fleet) -> Incident:
    """A straggler (SLOW_NODE): checkpoint, requeue, a failed screen, a GPU reset, the
    gate and a screen again, which passes (from 0.2)."""
    f.slurm.checkpointing.add(101)  # job 101 checkpoints when asked
    handle = await f.start(f.request(fault="SLOW_NODE", policy=_policy(faults=SILENT)))
    await _result(handle)
    return handle


SILENT = {
    "JOB_HANG": FaultRule(
        severity="critical", first_rung=Rung.RESET_GPU, screen_before_repair=True
    ),
    "SLOW_NODE": FaultRule(
        severity="warning",
        first_rung=Rung.RESET_GPU,
        on_degraded="checkpoint_then_drain",
        screen_before_repair=True,
    ),
}


def fake_screen(verdicts: tuple[bool, ...]) -> Callable[..., Any]:
    """The burn-in screen's activity answering `verdicts` in turn."""
    calls: list[ScreenInput] = []

    @activity.defn(name="burn_in_screen")
    async def burn_in_screen(inp: ScreenInput) -> ScreenResult:
        calls.append(inp)
        ok = verdicts[min(len(calls), len(verdicts)) - 1]
        return ScreenResult(
            node=inp.node, passed=ok, seconds=9.0, job_id=60 + len(calls), neighbour="gpu-03",
            gemm_tflops={inp.node: 310.0 if ok else 92.5},
            detail="passed" if ok else f"GEMM on {inp.node} 92.5 TFLOP/s < 250",
        )  # fmt: skip

    return burn_in_screen


class _No:
    detail = ""


_NO = _No()


@dataclass(frozen=True)
class Case:
    run: Callable[[Fleet], Awaitable[Incident]]
    fleet: dict[str, Any] = field(default_factory=dict)
    kubernetes: bool = False
    guard: bool = False  # record the cluster's FleetGuard too
    handoff: bool = False  # the provider's desk takes hand-offs
    screens: tuple[bool, ...] = ()  # the burn-in screen's verdicts, in turn (none: no screen)


CASES = {
    "reboot_resolved": Case(reboot_resolved),
    "reset_gpu_resolved": Case(reset_gpu_resolved),
    "replace_escalated": Case(replace_escalated, {"fixed_by": Rung.REPLACE}),
    "repair_failed": Case(repair_failed, {"cloud": lambda s: FakeCloud(s, fail=True)}),
    "approved": Case(approved),
    "rejected": Case(rejected),
    "hot_spare": Case(hot_spare, {"nodes": 4}, guard=True),
    "kubernetes": Case(kubernetes, kubernetes=True),
    "quarantine_recheck": Case(quarantine_recheck),
    "returned_jobs": Case(returned_jobs),
    "slurm_outage": Case(slurm_outage),
    "held_then_admitted": Case(
        held_then_admitted, {"nodes": 4, "cloud": lambda s: FakeCloud(s, hold=True)}, guard=True
    ),
    "proven_decision": Case(proven_decision),
    "held_drain_at_floor": Case(
        held_drain_at_floor, {"nodes": 4, "cloud": lambda s: FakeCloud(s, hold=True)}, guard=True
    ),
    "handoff_fixed": Case(handoff_fixed, {"fixed_by": None}, handoff=True),
    "screened_back": Case(screened_back, screens=(True,)),
    "screened_then_repaired": Case(screened_then_repaired, screens=(False, True)),
}


def _write(name: str, history: WorkflowHistory) -> None:
    out = HERE / f"{name}.json"
    out.write_text(history.to_json())
    print(f"wrote {out} ({len(history.events)} events)")


async def _record_case(env: WorkflowEnvironment, release: str, name: str, case: Case) -> None:
    k8s = FakeKubernetes()
    extra = k8s.activities() if case.kubernetes else []
    if case.handoff:
        extra.append(_handoff_taken)
    if case.screens:
        extra.append(fake_screen(case.screens))
    async with _fleet(env, extra_activities=extra, **case.fleet) as f:
        handle = await case.run(f)
        _write(f"remediation_{release}_{name}", await handle.fetch_history())
        if case.guard:
            await f.guard.terminate(reason="recorded")
            _write(f"fleet_guard_{release}_{name}", await f.guard.fetch_history())


async def _record_batch(env: WorkflowEnvironment, release: str) -> None:
    """A guard taking three batches: registrations, admissions with a queue, a release."""
    cluster = "history-batch"
    handle = await env.client.start_workflow(
        FleetGuard.run,
        GuardInput(cluster=cluster, policy=GuardPolicy(max_concurrent_repairs=1)),
        id=guard_workflow_id(cluster),
        task_queue=f"tq-{release}-batch",
        execution_timeout=timedelta(days=1),
    )
    nodes = ["gpu-01", "gpu-02", "gpu-03"]
    async with Worker(env.client, task_queue=f"tq-{release}-batch", workflows=[FleetGuard]):
        opened = [
            GuardCall(
                update="register",
                opened=IncidentOpened(node=n, incident_id=f"INC-{n}", fault="XID_79"),
            )
            for n in nodes
        ]
        await handle.execute_update(FleetGuard.batch, GuardBatch(calls=opened))
        admits = [
            GuardCall(
                update=kind,
                admit=AdmitRequest(node=n, incident_id=f"INC-{n}", cluster_nodes=8),
            )
            for kind in ("admit_quarantine", "admit_repair")
            for n in nodes
        ]
        await handle.execute_update(FleetGuard.batch, GuardBatch(calls=admits))
        release_one = GuardCall(
            update="release",
            release=ReleaseRequest(node="gpu-01", incident_id="INC-gpu-01", back_in_service=True),
        )
        await handle.execute_update(FleetGuard.batch, GuardBatch(calls=[release_one]))
        await handle.terminate(reason="recorded")
        _write(f"fleet_guard_{release}_batch", await handle.fetch_history())


async def _record_proven_reset(env: WorkflowEnvironment, release: str) -> None:
    """A tripped breaker: a reset with a forged proof refused (the worker's check, a failed
    update in the history), then a proven reset by an approver (from 0.2)."""
    cluster = "history-reset"
    tq = f"tq-{release}-reset"
    handle = await env.client.start_workflow(
        FleetGuard.run,
        GuardInput(cluster=cluster, policy=GuardPolicy(breaker_threshold=1), approvers=["alice"]),
        id=guard_workflow_id(cluster),
        task_queue=tq,
        execution_timeout=timedelta(days=1),
    )
    async with Worker(env.client, task_queue=tq, workflows=[FleetGuard], activities=proof_checks()):
        for n in ("gpu-01", "gpu-02"):
            opened = IncidentOpened(node=n, incident_id=f"INC-{n}", fault="XID_79")
            await handle.execute_update(FleetGuard.register, opened)
        forged = await proven_reset(handle, "alice", key="forged-" + "k" * 32)
        with contextlib.suppress(WorkflowUpdateFailedError):
            await handle.execute_update(FleetGuard.reset_breaker, forged)
        reset = await handle.execute_update(
            FleetGuard.reset_breaker, await proven_reset(handle, "alice")
        )
        assert not reset.tripped and reset.reset_by == "alice", reset
        await handle.terminate(reason="recorded")
        _write(f"fleet_guard_{release}_proven_reset", await handle.fetch_history())


async def record(release: str, only: set[str]) -> None:
    env = await time_skipping_env()
    async with env:
        for name, case in CASES.items():
            if not only or name in only:
                await _record_case(env, release, name, case)
        if not only or "batch" in only:
            await _record_batch(env, release)
        if not only or "proven_reset" in only:
            await _record_proven_reset(env, release)


if __name__ == "__main__":
    asyncio.run(record(sys.argv[1], set(sys.argv[2:])))
