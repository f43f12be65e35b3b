"""A node returned to training: scale the Deployment down with the node's pod marked
cheapest to delete (it drains gracefully) -> label and taint it back to training -> health
gate (the runbook's: Slurm with all GPUs, and a fresh healthy report from the node's agent)
-> resume it in Slurm -> requeue narrowed jobs so they regrow. Kubernetes has emptied the
node before Slurm resumes it; a node that fails the gate stays drained and a human is paged.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.models import HealthCheck, HealthGateInput
    from autoclusters.core.sharing import MoveRecord, MoveStep

from autoclusters.workflows.sharing.move_steps import move_step
from autoclusters.workflows.sharing.run import SharingRun

# The agent's half of the gate (workflows/agent_gate.py `AgentGate._agent_gate`): node,
# booted since, GPUs expected, how long to wait -> the judgement's checks.
AgentCheck = Callable[[str, datetime, int, float], Awaitable[list[HealthCheck]]]


async def return_to_training(sh: SharingRun, rec: MoveRecord, agent: AgentCheck) -> bool:
    """True when the node passed its gate and is back in Slurm; False: left drained."""
    call = sh.call(rec.move)
    # The node is already `moving` (out of the inference count): the others keep theirs.
    shrunk = call.model_copy(update={"replicas": sh.inference_count()})
    release = contracts.share_k8s_release
    await move_step(sh, rec, "scale_down_inference", release, shrunk, timeout=sh.ready_timeout())
    await move_step(sh, rec, "k8s_reclaim", contracts.share_k8s_reclaim, call)
    since = workflow.now()
    report = await move_step(
        sh, rec, "health_gate", contracts.health_gate, HealthGateInput(node=rec.move.node)
    )
    checks = report.checks
    if report.passed:
        checks = await agent(
            rec.move.node, since, report.expected_gpus or 0, sh.policy.ready_timeout_s
        )
    failed = [c for c in checks if not c.passed]
    rec.steps.append(
        MoveStep(
            name="health_verdict",
            started_at=since.timestamp(),
            finished_at=workflow.now().timestamp(),
            ok=report.passed and not failed,
            detail="; ".join(f"{c.name}: {c.detail}" for c in failed) or "healthy",
        )
    )
    if not report.passed or failed:
        await sh.notices.move(
            rec.move,
            "health_gate_failed",
            f"{rec.move.node} failed its health gate on its way back from inference; "
            f"left drained: {report.failures() or rec.steps[-1].detail}",
            "critical",
        )
        return False
    await move_step(sh, rec, "resume_in_slurm", contracts.share_resume_training, call)
    if sh.policy.regrow_training_jobs:
        regrow = call.model_copy(update={"regrow": dict(sh.state.narrowed)})
        grown = await move_step(sh, rec, "regrow_jobs", contracts.share_regrow_jobs, regrow)
        for job_id in grown.requeued + grown.settled:
            sh.state.narrowed.pop(job_id, None)
    return True
