"""In-job recovery: a job that holds a hot spare in its own allocation loses the faulty node
and goes on, without a requeue (issue 22; examples/training's in-job mode).

A job announces it in its Slurm comment: `injob=<dir>`, where `<dir>/<node>.pid` is the PID
of its process on each node (examples/training: train.py's in-place mode). When the policy's
job_recovery is `in-job`, the runbook's requeue step first does this for each such job on the
faulty node:

1. marks the job (AdminComment `autoclusters: injob:<incident>:<restart count>`), so a
   retried step knows it already acted;
2. kills that process on the faulty node inside the job's allocation (`srun --overlap`): the
   other nodes' ranks fail their collective at once and re-form their group with the spare,
   in their running processes;
3. releases the node from the job (`scontrol update JobId= NodeList=<the others>`), so it
   goes idle for its repair while the job runs on;
4. waits, up to the policy's in_job_budget_s, for the job to say it stepped again
   (`resumed_at=<epoch s>` in its comment, not before the kill) — unless the node was one of
   its standbys (the job names the nodes it trains on: `training=<node>,<node>`), whose loss
   the training ranks never see: then its release is all there is to wait for.

A job that cannot be helped so (Slurm refused a step, the budget ran out, it ended
meanwhile) is requeued, once, under the incident's requeue marker: the requeue path is the
fallback, never a second recovery. Jobs without `injob=` are left to the requeue.

It is part of the requeue step, not a step of its own: a job that cannot recover in place
pays nothing for it (the step lists the node's jobs anyway), and the runbook issues the
same commands as before (docs/versioning.md).
"""

from __future__ import annotations

import asyncio
import shlex
import time

from temporalio import activity

from autoclusters.activities.job_markers import (
    ACTIVE,
    in_job_marked,
    in_job_marker,
    requeue_marker,
)
from autoclusters.core import hostlist
from autoclusters.core.models import InJobResult, SlurmJob, job_comment
from autoclusters.integrations.slurm import SlurmError, SlurmInJobClient


def _resumed_since(job: SlurmJob, since: float) -> bool:
    stamp = job_comment(job, "resumed_at")
    try:
        return stamp is not None and float(stamp) >= since
    except ValueError:
        return False  # not a time: not a resume


def standby(job: SlurmJob, node: str) -> bool:
    """The job names the nodes it trains on, and `node` is not one of them."""
    training = job_comment(job, "training")
    return training is not None and node not in training.split(",")


def capable(job: SlurmJob, node: str) -> bool:
    """The job says it holds a spare, and keeps at least one node without this one."""
    others = [n for n in hostlist.expand(job.nodes) if n != node]
    return bool(job_comment(job, "injob")) and bool(others) and job.requeue and job.batch_flag


class InJobRecovery:
    """One node's in-job recovery, run inside the requeue activity (which heartbeats)."""

    def __init__(
        self, slurm: SlurmInJobClient, node: str, incident_id: str, budget_s: float, poll_s: float
    ) -> None:
        self._slurm = slurm
        self.node, self.incident_id = node, incident_id
        self.budget_s, self.poll_s = budget_s, poll_s
        self.result = InJobResult()

    async def recover(self) -> InJobResult:
        started, killed_at = time.monotonic(), time.time()
        # One read on the requeue's hot path: the node's jobs, and those this incident
        # already took the node from (a retry; off the node since), followed, not acted on.
        everyone = await self._slurm.jobs()
        acting = {j.job_id: j for j in everyone if in_job_marked(j, self.incident_id)}
        for job in everyone:
            if self.node not in hostlist.expand(job.nodes):
                continue
            if job.job_state not in ACTIVE or job.job_id in acting:
                continue
            if not capable(job, self.node):
                self.result.not_capable.append(job.job_id)
                continue
            acting[job.job_id] = job
            await self._take_node(job)
        pending = {j for j in acting if j not in self.result.fell_back}
        while pending:
            now = {j.job_id: j for j in await self._slurm.jobs() if j.job_id in pending}
            for job_id in sorted(pending):
                why = self._settled(now.get(job_id), acting[job_id], killed_at - 1)
                if why is not None:
                    pending.discard(job_id)
                    if why:
                        self.result.fell_back[job_id] = why
                    else:
                        self.result.recovered.append(job_id)
            if pending and time.monotonic() - started > self.budget_s:
                for job_id in sorted(pending):
                    await self._fall_back(
                        now[job_id], f"not stepping again within {self.budget_s:.0f}s"
                    )
                break
            if pending:
                activity.heartbeat(f"waiting for {sorted(pending)} to step again")
                await asyncio.sleep(self.poll_s)
        self.result.waited_s = round(time.monotonic() - started, 2)
        return self.result

    async def _take_node(self, job: SlurmJob) -> None:
        await self._slurm.set_admin_comment(
            job.job_id, in_job_marker(self.incident_id, job.restart_cnt)
        )
        pidfile = shlex.quote(f"{job_comment(job, 'injob')}/{self.node}.pid")
        others = [n for n in hostlist.expand(job.nodes) if n != self.node]
        try:
            await self._slurm.run_on_job_node(
                job.job_id, self.node, f'kill -KILL "$(cat {pidfile})"'
            )
            await self._slurm.shrink_job(job.job_id, others)
        except SlurmError as refused:
            await self._fall_back(job, f"Slurm refused: {refused}")

    def _settled(self, job: SlurmJob | None, before: SlurmJob, since: float) -> str | None:
        """None: still waiting; "": stepping again without the node; else why not."""
        if job is None or job.job_state not in ACTIVE:
            return "it ended before it stepped again"
        if job.restart_cnt > before.restart_cnt:
            return "it was requeued"
        stepping = standby(before, self.node) or _resumed_since(job, since)
        if stepping and self.node not in hostlist.expand(job.nodes):
            return ""
        return None

    async def _fall_back(self, job: SlurmJob, why: str) -> None:
        """Requeue it, once, as the incident's requeue (the requeue step releases its hold
        and never requeues it again)."""
        await self._slurm.set_admin_comment(
            job.job_id, requeue_marker(self.incident_id, job.restart_cnt)
        )
        await self._slurm.requeue(job.job_id)
        self.result.fell_back[job.job_id] = why
