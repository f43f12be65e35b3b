"""The loss a job measurably took on its recovery path, beside the planner's estimate
(issue 42; core/recovery_cost.py estimates it).

When the incident closes, the runbook reads what each job it planned for says of itself
(activities/recovery_loss.py): when it stepped again (`resumed_at=<epoch s>` in its Slurm
comment, written by its rank 0 at the first step of a re-formed group or of a run that
resumed from a checkpoint) and which checkpoint a restarted run started from (`ckpt_at=`
as its new run began: the newest save of the old run, that on the requeue's signal
included). From the fault's start as its source saw it (core/loss_clock.py: the agent's
reading, before the incident opened; the opening where no source said), pure arithmetic:

    resume_s = stepping again − the fault
    redo_s   = the fault − the checkpoint the new run started from, or the faulted
               run's first step where that is later (`run_at=` when planned: a run that
               started from that checkpoint too, or from none); 0 in place, and 0 where
               the old run saved after the fault
    GPU-hours lost = GPUs × (resume_s + redo_s) / 3600

A job that never says when it steps (no `resumed_at=`), that ended first, or that did not
step again within the wait is "unknown", with why: never counted as no loss. How good the
estimates have been is the relative error |actual − estimate| / actual over the losses
measured (`estimate_quality`; the console's fleet page).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from pydantic import BaseModel, Field

from autoclusters.core.recovery_cost import RecoveryPlan, at_risk_since

# The target: the estimate within ±30 % of the measured loss.
WITHIN = 0.30


class JobSighting(BaseModel):
    """What the runbook saw of one planned job after its recovery (the measuring step)."""

    job_id: int
    stepping_at: float | None = None  # epoch s it said it stepped again; None: not seen
    # The checkpoint (epoch s of its save) its new run started from; None: it did not
    # restart, or did not say.
    resumed_ckpt_at: float | None = None
    restarted: bool = False  # Slurm started it again (its restart count moved)
    why_unknown: str = ""  # why it was not seen stepping again ("" when it was)


class RecoveryLoss(BaseModel):
    """One job's measured loss beside what the planner estimated for the path it took."""

    job_id: int
    path: str  # as it got going again: in-job, or requeue
    estimated_path: str = ""  # the estimate it is judged against (the plan's expectation)
    gpus: int
    estimate_gpu_hours: float | None = None  # None: the plan had no estimate for it
    actual_gpu_hours: float | None = None  # None: not measured (why_unknown says why)
    resume_s: float | None = None
    redo_s: float | None = None
    why_unknown: str = ""

    @property
    def error(self) -> float | None:
        """(actual − estimate) / actual; None where either is missing or nothing was lost."""
        if self.actual_gpu_hours is None or self.estimate_gpu_hours is None:
            return None
        if self.actual_gpu_hours <= 0:
            return None
        return (self.actual_gpu_hours - self.estimate_gpu_hours) / self.actual_gpu_hours

    def describe(self) -> str:
        est = (
            f"estimated {self.estimate_gpu_hours:.3g} GPU-h ({self.estimated_path})"
            if self.estimate_gpu_hours is not None
            else "no estimate"
        )
        if self.actual_gpu_hours is None:
            stepped = (
                f"; stepping again after {self.resume_s:.1f}s" if self.resume_s is not None else ""
            )
            return (
                f"job {self.job_id} ({self.path}): {est}, actual unknown "
                f"({self.why_unknown}{stepped})"
            )
        err = self.error
        off = f", {err:+.0%} off" if err is not None else ""
        return (
            f"job {self.job_id} ({self.path}): {est}, actual {self.actual_gpu_hours:.3g} "
            f"GPU-h (stepping again after {self.resume_s:.1f}s, {self.redo_s:.0f}s redone{off})"
        )


def actual_loss(plan: RecoveryPlan, taken: str, seen: JobSighting, fault_at: float) -> RecoveryLoss:
    """The job's measured loss on the path it took (`taken`, the incident's recovery_path),
    beside the estimate of that path (`RecoveryPlan.expected_for`), counted from `fault_at`
    (epoch s: the fault's start, `MeasureRecoveryInput.lost_from`)."""
    expected = plan.expected_for(taken)
    loss = RecoveryLoss(
        job_id=plan.job_id,
        path=taken,
        estimated_path=expected.path if expected is not None else "",
        gpus=plan.gpus,
        estimate_gpu_hours=expected.gpu_hours if expected is not None else None,
    )
    if seen.stepping_at is None:
        loss.why_unknown = seen.why_unknown or "not seen stepping again"
        return loss
    resume = max(0.0, seen.stepping_at - fault_at)
    if taken == "in-job" and not seen.restarted:
        redo = 0.0  # in place: the survivors kept their state
    else:
        ckpt = seen.resumed_ckpt_at if seen.resumed_ckpt_at is not None else plan.checkpoint_at
        start = at_risk_since(ckpt, plan.run_at)  # the faulted run's own work, as planned
        if start is None:
            # Its seconds to stepping again are measured all the same: the path's figure
            # (core/recovery_history.py) needs them, not the work redone.
            loss.resume_s = round(resume, 3)
            loss.why_unknown = "restarted from a checkpoint it did not say (no ckpt_at=)"
            return loss
        redo = max(0.0, fault_at - start)
    loss.resume_s, loss.redo_s = round(resume, 3), round(redo, 3)
    loss.actual_gpu_hours = plan.gpus * (resume + redo) / 3600
    return loss


def loss_text(losses: list[RecoveryLoss]) -> str:
    """What the closing message says: per job, the estimate and the measured loss."""
    return "\n".join(
        ["recovery, estimated against measured (GPU-hours lost):"] + [x.describe() for x in losses]
    )


class EstimateQuality(BaseModel):
    """How good the planner's estimates have been over the losses measured."""

    measured: int = 0  # losses with both an estimate and a measured loss
    unknown: int = 0  # planned jobs whose loss could not be measured
    within: int = 0  # of `measured`, those within ±WITHIN of the measured loss
    median_error: float | None = None  # of |actual − estimate| / actual
    worst_error: float | None = None
    errors: list[float] = Field(default_factory=list)  # signed, one per measured loss

    @property
    def within_share(self) -> float | None:
        return self.within / self.measured if self.measured else None


def estimate_quality(losses: Iterable[RecoveryLoss]) -> EstimateQuality:
    q = EstimateQuality()
    for loss in losses:
        err = loss.error
        if err is None:
            q.unknown += 1
            continue
        q.measured += 1
        q.errors.append(round(err, 4))
        q.within += abs(err) <= WITHIN
    if q.errors:
        sizes = [abs(e) for e in q.errors]
        q.median_error = round(statistics.median(sizes), 4)
        q.worst_error = round(max(sizes), 4)
    return q


class WatchedJob(BaseModel):
    """One planned job the measuring step watches, as the incident knew it."""

    job_id: int
    path: str  # in-job or requeue: how it got going again
    restart_cnt: int = 0  # when planned: a higher one is a new run of it
    # It said when it last checkpointed (`ckpt_at=`), or how it trains (`injob=`, ...:
    # `RecoveryPlan.says_progress`): a job that says nothing of itself cannot be measured,
    # and is not waited for.
    says_checkpoints: bool = False


class MeasureRecoveryInput(BaseModel):
    jobs: list[WatchedJob]
    opened_at: float  # epoch s: the incident's opening, the fault's alert
    # Epoch s: the fault's start as its source saw it (core/loss_clock.py), what the loss
    # is counted from; None (an incident from before it was said): the opening.
    fault_at: float | None = None
    budget_s: float = 300.0  # waited at most for a restarted job to step again
    poll_s: float = 1.0

    @property
    def lost_from(self) -> float:
        """Epoch s the jobs' losses are counted from."""
        return self.fault_at if self.fault_at is not None else self.opened_at


class MeasureRecoveryResult(BaseModel):
    seen: list[JobSighting] = Field(default_factory=list)
    waited_s: float = 0.0

    def describe(self) -> str:
        stepping = [s.job_id for s in self.seen if s.stepping_at is not None]
        unknown = [f"{s.job_id} ({s.why_unknown})" for s in self.seen if s.stepping_at is None]
        parts = [f"stepping again: {stepping or 'none'}"]
        if unknown:
            parts.append(f"unknown: {', '.join(unknown)}")
        return "; ".join(parts) + f" ({self.waited_s:.1f}s)"


class PathFigures(BaseModel):
    """What the closed incidents measured on one path: the policy's recovery figure for it
    (`autoclusters stats recovery`)."""

    path: str  # as estimated: in-job, requeue, spare, borrow, repair
    measured: int
    median_resume_s: float | None = None  # fault -> stepping again, the figure itself
    median_redo_s: float | None = None


def figures_by_path(losses: Iterable[RecoveryLoss]) -> list[PathFigures]:
    """Per path the plan expected, the median seconds to stepping again the incidents
    measured: what `recovery_figures` should say for this cluster."""
    resume: dict[str, list[float]] = {}
    redo: dict[str, list[float]] = {}
    for loss in losses:
        if loss.resume_s is None or loss.redo_s is None:
            continue
        path = loss.estimated_path or loss.path
        resume.setdefault(path, []).append(loss.resume_s)
        redo.setdefault(path, []).append(loss.redo_s)
    return [
        PathFigures(
            path=path,
            measured=len(resume[path]),
            median_resume_s=round(statistics.median(resume[path]), 2),
            median_redo_s=round(statistics.median(redo[path]), 2),
        )
        for path in sorted(resume)
    ]
