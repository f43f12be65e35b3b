"""Checkpoint-aware quarantine: before a degraded node's jobs are requeued, ask them to
checkpoint, so they resume where they were instead of at their last periodic checkpoint.

A degraded fault (a pending row remap, a retirement waiting for the next reset) leaves the
node able to run its jobs for a while. The runbook drains it (nothing new lands there), then
sends each requeueable job its checkpoint signal through its batch shell; the job saves and
requeues itself (train.sbatch traps USR1: the ranks stop at a step boundary, save, and the
script runs `scontrol requeue`). What has not left the node when the budget is spent is
requeued by the requeue step that follows, as for a fatal fault.

Each signalled job carries the incident's requeue marker *before* the signal (with the
restart count it had then), exactly as the requeue step writes it: its own requeue is the
incident's one requeue. So a retried step never signals twice, and the requeue step neither
requeues a job that already left nor a second time one that Slurm placed back on the node.
"""

from __future__ import annotations

import asyncio
import time

from temporalio import activity

from autoclusters.activities.heartbeat import heartbeating
from autoclusters.activities.job_markers import ACTIVE, BUSY, marked_for, requeue_marker
from autoclusters.activities.sharing_demand import checkpointed_at
from autoclusters.core.models import CheckpointInput, CheckpointJobsResult
from autoclusters.integrations.slurm import SlurmSignalClient


class CheckpointActivities:
    def __init__(self, slurm: SlurmSignalClient) -> None:
        self._slurm = slurm

    @activity.defn(name="checkpoint_jobs")
    async def checkpoint_jobs(self, inp: CheckpointInput) -> CheckpointJobsResult:
        async with heartbeating(f"checkpoint_jobs {inp.node}"):
            return await self._checkpoint_jobs(inp)

    async def _checkpoint_jobs(self, inp: CheckpointInput) -> CheckpointJobsResult:
        result = CheckpointJobsResult()
        started, asked_at = time.monotonic(), time.time()
        for job in await self._slurm.jobs_on_node(inp.node):
            if job.job_state not in ACTIVE:
                continue
            if not (job.requeue and job.batch_flag):
                # Its checkpoint would end it for good: it runs on until the idle wait.
                result.not_asked.append(job.job_id)
                continue
            if marked_for(job, inp.incident_id) is None:
                await self._slurm.set_admin_comment(
                    job.job_id, requeue_marker(inp.incident_id, job.restart_cnt)
                )
                await self._slurm.signal_job(job.job_id, inp.signal)
            # else an earlier attempt asked it (or requeued it): wait, never signal twice
            result.signalled.append(job.job_id)
        # Asked by an earlier attempt and already gone from the node: still this step's.
        for job in await self._slurm.jobs():
            if job.job_id not in result.signalled and marked_for(job, inp.incident_id) is not None:
                result.signalled.append(job.job_id)
        asked = set(result.signalled)
        deadline = started + inp.budget_s
        on_node = await self._busy_on(inp.node)
        while asked & on_node and time.monotonic() < deadline:
            activity.heartbeat(f"waiting for {sorted(asked & on_node)} to checkpoint")
            await asyncio.sleep(inp.poll_s)
            on_node = await self._busy_on(inp.node)
        result.waited_s = round(time.monotonic() - started, 2)
        jobs = {j.job_id: j for j in await self._slurm.jobs() if j.job_id in asked}
        for job_id in result.signalled:
            found = jobs.get(job_id)
            stamp = checkpointed_at(found) if found is not None else None
            if stamp is not None and stamp >= asked_at - 1:  # the job's clock is this host's
                result.checkpointed.append(job_id)
            (result.stayed if job_id in on_node else result.left).append(job_id)
        return result

    async def _busy_on(self, node: str) -> set[int]:
        """Jobs with processes on the node (one requeueing itself is there until it
        completes)."""
        return {j.job_id for j in await self._slurm.jobs_on_node(node) if j.job_state in BUSY}
