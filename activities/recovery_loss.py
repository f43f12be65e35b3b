"""Measure what each planned job lost on its recovery path (issue 42): read, when the
incident closes, when the job stepped again and which checkpoint its new run started from
(core/recovery_loss.py does the arithmetic).

The job says both in its Slurm comment (examples/training): `resumed_at=<epoch s>` at the
first step of a re-formed group or of a run resumed from a checkpoint, `ckpt_at=<epoch s>`
after each committed save. So:

- a job recovered in place was already seen stepping by the requeue step: one read, its
  `resumed_at` at or after the incident's opening (none: a standby's loss, which re-forms
  nothing; said, not guessed);
- a requeued job is followed until its new run (a higher restart count) says
  `resumed_at`, within the budget; the `ckpt_at` it showed once its new run was running,
  before that first step, is the checkpoint it started from (the new run saves again only
  later);
- a job that ended first, or never said when it checkpoints (no `ckpt_at=` when planned:
  it will not say `resumed_at` either), is unknown at once; one that did not step within
  the budget, unknown then.

Reads only: nothing here changes a job. A Slurm read that fails is retried by the next
poll; an outage for the whole budget leaves the jobs unknown.
"""

from __future__ import annotations

import asyncio
import time

from temporalio import activity

from autoclusters.activities.heartbeat import heartbeating
from autoclusters.activities.job_markers import ACTIVE
from autoclusters.core.models import SlurmJob, job_stamp
from autoclusters.core.recovery_loss import (
    JobSighting,
    MeasureRecoveryInput,
    MeasureRecoveryResult,
    WatchedJob,
)
from autoclusters.integrations.slurm import SlurmClient, SlurmError

# A job in one of these states will not step again by itself (squeue's terminal states).
ENDED = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
         "DEADLINE"}  # fmt: skip


class _Follow:
    """One requeued job followed poll by poll."""

    def __init__(self, watched: WatchedJob, opened_at: float) -> None:
        self.watched, self.opened_at = watched, opened_at
        self.seen = JobSighting(job_id=watched.job_id)
        self.ckpt_before_step: float | None = None

    def read(self, job: SlurmJob | None) -> bool:
        """Take one read of the job; True once it is settled (seen stepping, or unknown)."""
        if job is None or job.job_state in ENDED:
            self.seen.why_unknown = "ended before it stepped again"
            return True
        if job.restart_cnt <= self.watched.restart_cnt:
            return False  # its old run, still on its way out
        self.seen.restarted = True
        if job.job_state not in ACTIVE:
            return False  # pending, or still completing: no step yet
        stepped = job_stamp(job, "resumed_at")
        ckpt = job_stamp(job, "ckpt_at")
        if stepped is None or stepped < self.opened_at:
            self.ckpt_before_step = ckpt  # the newest save before the new run's first step
            return False
        self.seen.stepping_at = stepped
        # A save newer than the first step is the new run's own: the one seen before it is
        # the checkpoint the run started from.
        self.seen.resumed_ckpt_at = (
            ckpt if ckpt is not None and ckpt <= stepped else (self.ckpt_before_step)
        )
        return True


class RecoveryLossActivities:
    def __init__(self, slurm: SlurmClient) -> None:
        self._slurm = slurm

    @activity.defn(name="measure_recovery")
    async def measure_recovery(self, inp: MeasureRecoveryInput) -> MeasureRecoveryResult:
        async with heartbeating(f"measure_recovery {[j.job_id for j in inp.jobs]}"):
            return await self._measure(inp)

    async def _measure(self, inp: MeasureRecoveryInput) -> MeasureRecoveryResult:
        started = time.monotonic()
        out: dict[int, JobSighting] = {}
        follow: dict[int, _Follow] = {}
        for w in inp.jobs:
            if w.path != "in-job" and not w.says_checkpoints:
                out[w.job_id] = JobSighting(
                    job_id=w.job_id,
                    why_unknown="it does not say when it checkpoints or steps (no ckpt_at=)",
                )
            else:
                follow[w.job_id] = _Follow(w, inp.opened_at)
        first = True
        while follow:
            try:
                jobs = {j.job_id: j for j in await self._slurm.jobs()}
            except SlurmError as e:  # unknown this time: the next poll reads again
                activity.logger.warning("measure_recovery: no job list: %s", e)
                jobs = None
            if jobs is not None:
                for job_id, f in list(follow.items()):
                    if f.watched.path == "in-job":
                        self._in_place(f, jobs.get(job_id))
                        out[job_id] = follow.pop(job_id).seen
                    elif f.read(jobs.get(job_id)):
                        out[job_id] = follow.pop(job_id).seen
            if follow and time.monotonic() - started > inp.budget_s and not first:
                for job_id, f in follow.items():
                    f.seen.why_unknown = f"not stepping again within {inp.budget_s:.0f}s"
                    out[job_id] = f.seen
                break
            first = False
            if follow:
                await asyncio.sleep(inp.poll_s)
        return MeasureRecoveryResult(
            seen=[out[w.job_id] for w in inp.jobs], waited_s=round(time.monotonic() - started, 2)
        )

    @staticmethod
    def _in_place(f: _Follow, job: SlurmJob | None) -> None:
        stepped = job_stamp(job, "resumed_at") if job is not None else None
        if stepped is not None and stepped >= f.opened_at:
            f.seen.stepping_at = stepped
        elif job is None:
            f.seen.why_unknown = "ended, and gone from Slurm"
        else:
            f.seen.why_unknown = (
                "no resumed_at= since the fault (a standby's loss re-forms nothing)"
            )
