"""What a fault costs a job on each recovery path, and the cheapest one (issue 42).

A path's cost is the GPU time the job loses on it: every GPU of the job waits from the
fault until the job steps again, and a path that restarts from the checkpoint does the
work since that checkpoint again:

    GPU-hours lost = GPUs × (seconds to stepping again + seconds of work redone) / 3600

The paths, each estimated wherever the policy allows it (else "not possible", with why):

- `in-job` (a standby in the job's allocation takes the node's seat): the survivors keep
  their state in memory, nothing is redone; possible only where the job holds a standby
  and can lose this node (activities/in_job.py says why not otherwise); where the node
  was itself a standby, nothing re-forms and the job loses nothing;
- the others start with the same requeue and differ in where the job starts again, so
  each redoes the work since its newest checkpoint (`ckpt_at=` in its comment), or since
  its run first stepped where that is later (`run_at=`: a run started from an older
  checkpoint, or from none, has redone nothing before it); unknown is said, and counted
  as none:
  - `requeue`: on the partition's free nodes, at once; possible where Slurm shows enough
    of them idle (an unknown count is not zero: possible, and said);
  - `spare`: on a hot spare put into service for the node (the policy lists spares and
    the incident replaces the machine);
  - `borrow`: on an inference node GPU sharing lends for the repair (only where
    the cluster borrows: the figures carry `borrow_s`);
  - `repair`: on the node itself once it is repaired: the repair's median from the
    cluster's history for this fault and rung (`autoclusters stats ladder`) where the
    incident carries it, else the figures' `repair_s`, then the job's restart.

The seconds to stepping again are the cluster's figures: with the policy's
`figures_from_history`, the median of the last recoveries its closed incidents measured
per path (core/recovery_history.py), else the policy's `recovery_figures`; the estimate,
the choice, why and where the figures came from are recorded on the incident, and the
measured loss is set beside them when it closes (core/recovery_loss.py). Both count from
the fault's start as its source saw it (core/loss_clock.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

RecoveryPath = Literal["in-job", "requeue", "spare", "borrow", "repair"]
# The order a tie is broken in: the path that needs the least of anyone first.
PATHS: tuple[RecoveryPath, ...] = ("requeue", "spare", "borrow", "repair", "in-job")


class RecoveryFigures(BaseModel):
    """Seconds from a fault to the job stepping again, per path (this cluster's medians)."""

    in_job_s: float = Field(default=1.5, ge=0, le=3600, allow_inf_nan=False)
    requeue_s: float = Field(default=20.0, ge=0, le=86400, allow_inf_nan=False)
    # A hot spare in service for the node (at its replacement), the job started on it.
    spare_s: float = Field(default=45.0, ge=0, le=86400, allow_inf_nan=False)
    # An inference node lent for the repair, the job started on it; None: this cluster
    # does not borrow (GPU sharing's borrow_from_inference is off).
    borrow_s: float | None = Field(default=None, ge=0, le=86400, allow_inf_nan=False)
    # The node back in service after its repair, where the history has no figure for the
    # fault and rung (a reboot or a replacement on a cloud: minutes).
    repair_s: float = Field(default=900.0, ge=0, le=7 * 86400, allow_inf_nan=False)


class RecoveryCapacity(BaseModel):
    """What the incident knows of the capacity its jobs may restart on (the workflow
    decides it from the policy and the incident; the requeue step reads Slurm's free
    nodes itself)."""

    # Why no hot spare can take the node's place (None: one can).
    spare_blocked: str | None = "the policy lists no hot spare"
    # Seconds to the node back in service, and where the figure comes from; None: the
    # figures' repair_s.
    repair_s: float | None = None
    repair_from: str = ""


class JobFacts(BaseModel):
    """What the estimate needs to know of one job, read when the fault is handled."""

    job_id: int
    gpus: int  # the job's width in GPUs (its nodes when it asked for no GPU)
    # The age of the work a restart would do again: since its newest checkpoint, or since
    # its run first stepped where that is later (a run started from an older checkpoint,
    # or from none); None: unknown.
    checkpoint_age_s: float | None = None
    # Why it cannot recover in place (None: it can): no standby, the batch host, more
    # losses than standbys, the policy's job_recovery.
    in_job_blocked: str | None = None
    # The node was one of its standbys (it names the nodes it trains on, not this one): in
    # place its training ranks keep their group, nothing re-forms and nothing waits.
    standby_lost: bool = False
    # Idle healthy nodes outside the job it could start again on (None: unknown), and how
    # many it needs: the nodes it loses.
    free_nodes: int | None = None
    nodes_needed: int = 1
    # Its restart count and its newest checkpoint (epoch s) when planned: what the
    # measured loss is read against (core/recovery_loss.py).
    restart_cnt: int = 0
    checkpoint_at: float | None = None
    run_at: float | None = None  # epoch s its run first stepped (`run_at=`); None: not said
    # It says how it trains in its Slurm comment (examples/training: `ckpt_at=`,
    # `resumed_at=`, `injob=`, `training=`): it will say when it steps again, whether it
    # has checkpointed yet or not.
    says_progress: bool = False


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
    restart_cnt: int = 0
    checkpoint_at: float | None = None
    run_at: float | None = None
    says_progress: bool = False
    # Where the seconds per path came from: the cluster's measured history (which figure
    # from how many), or the policy's figures and why ("": the policy's, none read).
    figures_from: str = ""

    def estimate(self, path: RecoveryPath) -> PathEstimate | None:
        return next((e for e in self.estimates if e.path == path), None)

    def expected_for(self, taken: str) -> PathEstimate | None:
        """The estimate to judge a job's measured loss by: in place, the in-job one; a
        requeue, the path the plan expected it to start again on (the cheapest possible
        one other than in place when it chose in place and fell back)."""
        if taken == "in-job":
            return self.estimate("in-job")
        if self.chosen != "in-job":
            return self.estimate(self.chosen)
        others = [e for e in self.estimates if e.path != "in-job" and e.possible]
        return min(others, key=lambda e: (e.gpu_hours, PATHS.index(e.path)), default=None)

    def describe(self) -> str:
        """One line: the choice and what each path was estimated to cost."""
        parts = []
        for e in self.estimates:
            cost = f"{e.gpu_hours:.3g} GPU-h" if e.possible else f"not possible ({e.why_not})"
            parts.append(f"{e.path} {cost}")
        return f"job {self.job_id}: {self.chosen} ({'; '.join(parts)})"


def at_risk_since(checkpoint_at: float | None, run_at: float | None) -> float | None:
    """Where the work a restart would redo began (epoch s): the later of the checkpoint it
    would start from and its run's first step (a run started from an older checkpoint, or
    from none, did nothing before that); None where neither is known."""
    return max((t for t in (checkpoint_at, run_at) if t is not None), default=None)


def _gpu_hours(gpus: int, seconds: float) -> float:
    return gpus * seconds / 3600


def _estimate(
    path: RecoveryPath, gpus: int, resume_s: float, redo_s: float, why_not: str | None
) -> PathEstimate:
    return PathEstimate(
        path=path,
        possible=why_not is None,
        resume_s=resume_s,
        redo_s=redo_s,
        gpu_hours=_gpu_hours(gpus, resume_s + redo_s),
        why_not=why_not or "",
    )


def _requeue_blocked(job: JobFacts) -> str | None:
    if job.free_nodes is None or job.free_nodes >= job.nodes_needed:
        return None
    return f"{job.free_nodes} free node(s), it needs {job.nodes_needed}"


def plan_recovery(
    job: JobFacts, figures: RecoveryFigures, capacity: RecoveryCapacity | None = None
) -> RecoveryPlan:
    """Every path's estimate, and the cheapest possible one (on a tie, the path that
    needs least: PATHS' order). Waiting for the repair is always possible; the requeue
    step decides what Slurm cannot requeue."""
    cap = capacity or RecoveryCapacity()
    redo = job.checkpoint_age_s or 0.0
    repair_s = cap.repair_s if cap.repair_s is not None else figures.repair_s
    in_place_s = 0.0 if job.standby_lost else figures.in_job_s  # a standby: nothing re-forms
    estimates = [
        _estimate("in-job", job.gpus, in_place_s, 0.0, job.in_job_blocked),
        _estimate("requeue", job.gpus, figures.requeue_s, redo, _requeue_blocked(job)),
        _estimate("spare", job.gpus, figures.spare_s, redo, cap.spare_blocked),
        _estimate(
            "borrow",
            job.gpus,
            figures.borrow_s or 0.0,
            redo,
            None if figures.borrow_s is not None else "this cluster does not borrow",
        ),
        _estimate("repair", job.gpus, repair_s + figures.requeue_s, redo, None),
    ]
    possible = [e for e in estimates if e.possible]
    best = min(possible, key=lambda e: (e.gpu_hours, PATHS.index(e.path)))
    plan = RecoveryPlan(
        job_id=job.job_id,
        gpus=job.gpus,
        checkpoint_age_s=job.checkpoint_age_s,
        estimates=estimates,
        chosen=best.path,
        restart_cnt=job.restart_cnt,
        checkpoint_at=job.checkpoint_at,
        run_at=job.run_at,
        says_progress=job.says_progress,
    )
    runner_up = min(
        (e for e in possible if e is not best),
        key=lambda e: (e.gpu_hours, PATHS.index(e.path)),
        default=None,
    )
    if runner_up is None:
        plan.why = "the only possible path"
    elif runner_up.gpu_hours == best.gpu_hours:
        plan.why = f"costs no more than {runner_up.path} ({best.gpu_hours:.3g} GPU-h)"
    else:
        plan.why = (
            f"cheapest: {best.gpu_hours:.3g} against {runner_up.gpu_hours:.3g} GPU-h "
            f"({runner_up.path})"
        )
    in_job = estimates[0]
    if not in_job.possible:
        plan.why += f"; in-job not possible: {in_job.why_not}"
    if best.path == "repair" and cap.repair_from:
        plan.why += f"; repair {repair_s:.0f}s ({cap.repair_from})"
    if job.checkpoint_age_s is None:
        plan.why += "; checkpoint age unknown (counted as none)"
    return plan


def recovery_text(plans: list[RecoveryPlan]) -> str:
    """What Slack is told once the jobs are on their way: per job, the path taken and
    what each path was estimated to lose."""
    lines = ["recovery chosen by its cost (estimated GPU-hours lost):"]
    for p in plans:
        lines.append(f"{p.describe()}: {p.why}")
    for origin in dict.fromkeys(p.figures_from for p in plans if p.figures_from):
        lines.append(f"figures: {origin}")
    return "\n".join(lines)
