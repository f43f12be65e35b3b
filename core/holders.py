"""Standbys held outside a training job, by holder jobs (issue 39).

Slurm can shrink a running job (what in-job recovery does) but not grow it, so a standby
inside a job's allocation, once used, only comes back with a requeue. A holder job keeps a
spare node instead: a placeholder (`sleep`) that the runbook assigns to a training job that
has used up its standby; the job's launcher then starts a warm standby process in the
holder's allocation (`srun --jobid=<holder> --overlap`), which joins the job's store and
waits there like a standby of its own allocation. When a node is repaired and returned, a
holder is submitted on it again (the pool refills).

What each side writes in its Slurm Comment (`key=value` tokens):

- a holder: `holder=1`, and once assigned `holder_for=<job>.<restart count>`: the run of
  the training job it serves. A claim naming a run that is no longer running (the job
  ended or was requeued) is stale: the holder is free again;
- a training job that takes its standbys from holders: `holders=1` (its batch shell traps
  SIGUSR2: "holders were assigned to you"), and `launcher=1` when its batch host never
  trains (examples/training `LAUNCHER=1`): that node is then no seat of the job.

Decisions only (pure): which nodes make up a job's world (its allocation's training and
standby nodes, and the nodes of the holders it was given), whether it lacks a standby,
which holders are free. activities/holders.py and activities/in_job.py act on them.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet

from autoclusters.core import hostlist
from autoclusters.core.models import SlurmJob, job_comment

HOLDER_NAME = "standby-holder"
HOLDER_TOKEN = "holder"
CLAIM_TOKEN = "holder_for"
JOB_TOKEN = "holders"  # the training job takes standbys from holders
LAUNCHER_TOKEN = "launcher"  # the training job's batch host never trains
LIVE = {"RUNNING", "CONFIGURING", "PENDING"}


def is_holder(job: SlurmJob) -> bool:
    return job.name == HOLDER_NAME and job_comment(job, HOLDER_TOKEN) == "1"


def run_key(job: SlurmJob) -> str:
    """The training job's current run, as a holder's claim names it."""
    return f"{job.job_id}.{job.restart_cnt}"


def holder_comment(served: SlurmJob | None) -> str:
    """A holder's Comment: free, or claimed for `served`'s current run."""
    return f"{HOLDER_TOKEN}=1" + (f" {CLAIM_TOKEN}={run_key(served)}" if served else "")


def takes_holders(job: SlurmJob) -> bool:
    return job_comment(job, JOB_TOKEN) == "1" and bool(job_comment(job, "injob"))


def served_by(holder: SlurmJob, jobs: list[SlurmJob]) -> SlurmJob | None:
    """The running training job whose current run the holder was claimed for; None when
    unclaimed, or the claim is stale (that run ended or was requeued)."""
    claim = job_comment(holder, CLAIM_TOKEN)
    if claim is None:
        return None
    return next(
        (j for j in jobs if run_key(j) == claim and j.job_state == "RUNNING" and takes_holders(j)),
        None,
    )


def holders_of(job: SlurmJob, jobs: list[SlurmJob]) -> list[SlurmJob]:
    """The running holders claimed for the job's current run (none for a job that does
    not take holders: a claim it never asked for gives it nothing)."""
    if not takes_holders(job):
        return []
    return [
        h
        for h in jobs
        if is_holder(h) and h.job_state == "RUNNING" and job_comment(h, CLAIM_TOKEN) == run_key(job)
    ]


def world(job: SlurmJob, jobs: list[SlurmJob]) -> list[str]:
    """The nodes that may train for the job: its allocation (less a batch host that never
    trains) and the nodes of the holders it was given."""
    own = hostlist.expand(job.nodes)
    if job_comment(job, LAUNCHER_TOKEN) == "1":
        own = [n for n in own if n != job.batch_host]
    held = [n for h in holders_of(job, jobs) for n in hostlist.expand(h.nodes)]
    return own + [n for n in held if n not in own]


def standbys(job: SlurmJob, jobs: list[SlurmJob], lost: AbstractSet[str]) -> int | None:
    """How many standbys the job has left (its world less what trains and what is lost);
    None when it does not name its training nodes."""
    training = job_comment(job, "training")
    if training is None:
        return None
    # By count, not by name: just after a fault `training=` may still name the lost node
    # (the job rewrites it at the first step of its re-formed group), and the seat the
    # standby took would look like a standby still free.
    seats = len({n for n in training.split(",") if n})
    return max(0, len([n for n in world(job, jobs) if n not in lost]) - seats)


def lacks_standby(job: SlurmJob, jobs: list[SlurmJob], lost: AbstractSet[str]) -> bool:
    """A running job that takes holders and has no standby left."""
    if job.job_state != "RUNNING" or not takes_holders(job):
        return False
    return standbys(job, jobs, lost) == 0


def free(jobs: list[SlurmJob], lost: AbstractSet[str] = frozenset()) -> list[SlurmJob]:
    """Holders no current run is served by (pending ones too: a refill just submitted), off
    the `lost` nodes, the running ones first."""
    out = [
        h
        for h in jobs
        if is_holder(h)
        and h.job_state in LIVE
        and served_by(h, jobs) is None
        and not set(hostlist.expand(h.nodes)) & lost
    ]
    return sorted(out, key=lambda h: (h.job_state != "RUNNING", h.job_id))


def to_submit(jobs: list[SlurmJob], target: int) -> int:
    """Holders to submit for the pool to hold `target` free ones."""
    return max(0, target - len(free(jobs)))


def beyond_target(jobs: list[SlurmJob], target: int) -> list[SlurmJob]:
    """Free holders past the `target` the pool keeps, pending ones and the newest first to
    go: holders freed when the run they served ended or was requeued (a requeue the job
    made itself, which no requeue step of ours saw) would otherwise hold nodes for good,
    the pool only ever growing, and a requeued job that asks for its full width again
    would wait on `Resources` behind them."""
    return free(jobs)[max(0, target) :]


def stale_claims(jobs: list[SlurmJob]) -> list[SlurmJob]:
    """Live holders claimed for an earlier run of a job that has run again since, whoever
    requeued it (its runbook's requeue step, or the job itself)."""
    return claimed_by_earlier_runs(jobs, {j.job_id for j in jobs if not is_holder(j)})


def claimed_by_earlier_runs(jobs: list[SlurmJob], requeued: AbstractSet[int]) -> list[SlurmJob]:
    """Live holders whose claim names an earlier run of a job that was requeued: its
    standbys there belonged to that run (its store is gone with it), and the holders now
    hold nodes the requeued run may need to start at all (a requeued job asks for its full
    width again). A claim on the job's current run (its new run took a holder since) is
    kept."""
    current = {j.job_id: j.restart_cnt for j in jobs if j.job_id in requeued}
    out = []
    for h in jobs:
        if not is_holder(h) or h.job_state not in LIVE:
            continue
        job_id, _, run = (job_comment(h, CLAIM_TOKEN) or "").partition(".")
        if not (job_id.isdigit() and run.isdigit()) or int(job_id) not in current:
            continue
        if int(run) < current[int(job_id)]:
            out.append(h)
    return out
