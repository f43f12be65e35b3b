"""What a fault costs a job on each recovery path, and the cheapest one (issue 42).

A path's cost is the GPU time the job loses on it: every GPU of the job waits from the
fault until the job steps again, and a path that restarts from the checkpoint does the
work since that checkpoint again:

    GPU-hours lost = GPUs × (seconds to stepping again + seconds of work redone) / 3600

- `in-job` (a standby in the job's allocation takes the node's seat): the survivors keep
  their state in memory, nothing is redone; possible only where the job holds a standby
  and can lose this node (activities/in_job.py says why not otherwise);
- `requeue` (Slurm starts the job again on healthy nodes): the job's restart, and the
  work since its newest checkpoint (`ckpt_at=` in its comment; unknown is said, and
  counted as none).

The seconds to stepping again are the cluster's figures (the policy's `recovery_figures`,
measured by bench/mttr.py: docs/recovery.md); the estimate, the choice and why are
recorded on the incident, so that the actual loss can be set beside them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

RecoveryPath = Literal["in-job", "requeue"]


class RecoveryFigures(BaseModel):
    """Seconds from a fault to the job stepping again, per path (this cluster's medians)."""

    in_job_s: float = Field(default=1.5, ge=0, le=3600, allow_inf_nan=False)
    requeue_s: float = Field(default=20.0, ge=0, le=86400, allow_inf_nan=False)


class JobFacts(BaseModel):
    """What the estimate needs to know of one job, read when the fault is handled."""

    job_id: int
    gpus: int  # the job's width in GPUs (its nodes when it asked for no GPU)
    checkpoint_age_s: float | None = None  # since its newest checkpoint; None: unknown
    # Why it cannot recover in place (None: it can): no standby, the batch host, more
    # losses than standbys, the policy's job_recovery.
    in_job_blocked: str | None = None


class PathEstimate(BaseModel):
    path: RecoveryPath
    possible: bool
    resume_s: float  # fault -> stepping again
    redo_s: float  # work done again
    gpu_hours: float
    why_not: str = ""


class RecoveryPlan(BaseModel):
    job_id: int
    gpus: int
    checkpoint_age_s: float | None = None
    estimates: list[PathEstimate] = Field(default_factory=list)
    chosen: RecoveryPath = "requeue"
    why: str = ""

    def estimate(self, path: RecoveryPath) -> PathEstimate | None:
        return next((e for e in self.estimates if e.path == path), None)

    def describe(self) -> str:
        """One line: the choice and what each path was estimated to cost."""
        parts = []
        for e in self.estimates:
            cost = f"{e.gpu_hours:.3g} GPU-h" if e.possible else f"not possible ({e.why_not})"
            parts.append(f"{e.path} {cost}")
        return f"job {self.job_id}: {self.chosen} ({'; '.join(parts)})"


def _gpu_hours(gpus: int, seconds: float) -> float:
    return gpus * seconds / 3600


def plan_recovery(job: JobFacts, figures: RecoveryFigures) -> RecoveryPlan:
    """Every path's estimate, and the cheapest possible one (requeue on a tie: it needs
    nothing of the job). Requeue is always possible here: the requeue step decides what
    Slurm cannot requeue."""
    redo = job.checkpoint_age_s or 0.0
    in_job = PathEstimate(
        path="in-job",
        possible=job.in_job_blocked is None,
        resume_s=figures.in_job_s,
        redo_s=0.0,
        gpu_hours=_gpu_hours(job.gpus, figures.in_job_s),
        why_not=job.in_job_blocked or "",
    )
    requeue = PathEstimate(
        path="requeue",
        possible=True,
        resume_s=figures.requeue_s,
        redo_s=redo,
        gpu_hours=_gpu_hours(job.gpus, figures.requeue_s + redo),
    )
    plan = RecoveryPlan(
        job_id=job.job_id,
        gpus=job.gpus,
        checkpoint_age_s=job.checkpoint_age_s,
        estimates=[in_job, requeue],
    )
    if in_job.possible and in_job.gpu_hours < requeue.gpu_hours:
        plan.chosen = "in-job"
        plan.why = f"cheapest: {in_job.gpu_hours:.3g} against {requeue.gpu_hours:.3g} GPU-h"
    elif in_job.possible:
        plan.why = (
            f"requeue costs no more ({requeue.gpu_hours:.3g} against "
            f"{in_job.gpu_hours:.3g} GPU-h in place)"
        )
    else:
        plan.why = f"in-job not possible: {in_job.why_not}"
    if job.checkpoint_age_s is None:
        plan.why += "; checkpoint age unknown (counted as none)"
    return plan


def recovery_text(plans: list[RecoveryPlan]) -> str:
    """What Slack is told once the jobs are on their way: per job, the path taken and
    what each path was estimated to lose."""
    lines = ["recovery chosen by its cost (estimated GPU-hours lost):"]
    for p in plans:
        lines.append(f"{p.describe()}: {p.why}")
    return "\n".join(lines)
