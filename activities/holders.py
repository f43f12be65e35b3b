"""The pool of standbys held outside the jobs refills on a node returned to service (and
shrinks back to its target there: claims on runs that are over, free holders past it), and
yields to a job that was requeued (core/holders.py; the policy's `standby_holders`).

Run at the end of the return-to-service step, once the node passed its health gate and is
back: when fewer holders are free than the policy keeps, a holder job is submitted on the
node, and a job that used up its standby meanwhile (the pool was empty at its recovery) is
given a free one, its batch shell told so (SIGUSR2).
"""

from __future__ import annotations

import asyncio
import time

from temporalio import activity

from autoclusters.core import holders
from autoclusters.core.models import SlurmJob
from autoclusters.integrations.slurm import SlurmError, SlurmHolderClient, SlurmUnavailable

# The training job's batch shell takes it as "a holder was assigned to you" (train.sbatch
# HOLDERS=1 traps it; a job that does not say `holders=1` is never sent it).
ASSIGNED_SIGNAL = "USR2"
START_WAIT_S = 15.0  # a holder submitted on an idle node runs within the scheduler's pass


async def refill(slurm: SlurmHolderClient, node: str, target: int, poll_s: float) -> str:
    """Submit a holder on `node` if the pool is short, then give free holders to the jobs
    without a standby. Returns what was done ("" when nothing)."""
    done = []
    jobs = await slurm.jobs()
    # First what the pool should not hold: claims on runs that are over, and free holders
    # past the target (the pool shrinks back here, where it refills).
    stale = await _cancel(slurm, holders.stale_claims(jobs))
    if stale:
        done.append(f"holders {stale} of earlier runs cancelled")
        jobs = await slurm.jobs()
    extra = await _cancel(slurm, holders.beyond_target(jobs, target))
    if extra:
        done.append(f"holders {extra} beyond the pool's {target} cancelled")
        jobs = await slurm.jobs()
    if holders.to_submit(jobs, target) > 0:
        try:
            held = await slurm.submit_holder(node)
        except SlurmUnavailable:
            raise
        except SlurmError as refused:
            return f"no holder submitted on {node}: {refused}"
        done.append(f"holder {held} submitted on {node}")
        deadline = time.monotonic() + START_WAIT_S
        while time.monotonic() < deadline:
            jobs = await slurm.jobs()
            if any(j.job_id == held and j.job_state == "RUNNING" for j in jobs):
                break
            activity.heartbeat(f"holder {held} starting")
            await asyncio.sleep(poll_s)
    for job in jobs:
        if not holders.lacks_standby(job, jobs, set()):
            continue
        spare = next((h for h in holders.free(jobs) if h.job_state == "RUNNING"), None)
        if spare is None:
            break
        await slurm.set_comment(spare.job_id, holders.holder_comment(job))
        await slurm.signal_job(job.job_id, ASSIGNED_SIGNAL)
        done.append(f"holder {spare.job_id} given to job {job.job_id}")
        jobs = [j for j in jobs if j.job_id != spare.job_id]
    return "; ".join(done)


async def release_for_requeued(slurm: SlurmHolderClient, requeued: list[int]) -> list[int]:
    """Cancel the holders claimed for an earlier run of the requeued jobs: their standbys
    went with that run, and their nodes are what the requeued run needs to start (with the
    pool holding the spare nodes a requeued job waited on `Resources` for good). The pool
    refills as nodes return to service. Returns the holders cancelled; one that ended
    meanwhile (Slurm refuses its cancel) needs nothing more."""
    return await _cancel(slurm, holders.claimed_by_earlier_runs(await slurm.jobs(), set(requeued)))


async def _cancel(slurm: SlurmHolderClient, held: list[SlurmJob]) -> list[int]:
    """Cancel these holders; the ones cancelled (one that ended meanwhile, whose cancel
    Slurm refuses, needs nothing more)."""
    cancelled = []
    for h in held:
        try:
            await slurm.cancel(h.job_id)
        except SlurmUnavailable:
            raise
        except SlurmError:
            continue
        cancelled.append(h.job_id)
    return cancelled
