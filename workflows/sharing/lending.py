"""A node lent to inference: drain it in Slurm under the move's reason -> ask its jobs to
checkpoint and requeue (their checkpoint signal; what still runs after the grace is
requeued) -> hand it to Kubernetes (label inference, lift the pool taint) -> scale the
inference Deployment -> wait until the replica there serves -> mark it lent in Slurm.
Slurm has drained it and it is idle before Kubernetes gets it.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.sharing import MoveRecord

from autoclusters.workflows.sharing.move_steps import move_step
from autoclusters.workflows.sharing.run import SharingRun


async def lend(sh: SharingRun, rec: MoveRecord) -> None:
    call = sh.call(rec.move)
    await move_step(sh, rec, "drain", contracts.share_drain_for_move, call)
    left = await move_step(sh, rec, "checkpoint_and_requeue", contracts.share_checkpoint_jobs, call)
    # Remember how wide each job ran, to regrow it when a node comes back.
    for job_id, width in left.widths.items():
        sh.state.narrowed.setdefault(job_id, width)
    await move_step(sh, rec, "k8s_lend", contracts.share_k8s_lend, call)
    grown = call.model_copy(update={"replicas": sh.inference_count() + 1})
    await move_step(sh, rec, "scale_up_inference", contracts.share_scale_inference, grown)
    serving = contracts.share_wait_serving
    await move_step(sh, rec, "wait_serving", serving, call, timeout=sh.ready_timeout())
    await move_step(sh, rec, "mark_lent", contracts.share_mark_lent, call)
