"""Slurm steps of a GPU-sharing move: take a node out for inference (drain, ask its jobs to
checkpoint and requeue, wait until idle, mark it lent) and give it back (resume, regrow).

Every step is idempotent. A drain or resume touches only a node that is ours to move: one
drained by an admin, an incident, a spare or a scale/teardown is refused, never
overwritten. A job is asked to checkpoint once per move (a marker on the job carries the
move and its restart count, as the runbook's requeue does), so a retried step never makes
it checkpoint-and-requeue twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Set as AbstractSet

from temporalio import activity
from temporalio.exceptions import ApplicationError

from autoclusters.activities.heartbeat import heartbeating
from autoclusters.activities.job_markers import ACTIVE, BUSY
from autoclusters.activities.slurm import known_node
from autoclusters.core import hostlist
from autoclusters.core.models import REASON_PREFIX, SlurmJob, SlurmNode
from autoclusters.core.sharing import (
    LENT_REASON,
    CheckpointResult,
    MoveCall,
    RegrowResult,
    StepOutcome,
    is_sharing_reason,
    move_reason,
)
from autoclusters.integrations.slurm import SlurmSignalClient


def checkpoint_marker(move_id: str, restart_cnt: int, width: int) -> str:
    """Written on a job before it is signalled: a retry that finds it (and the same restart
    count) waits instead of signalling again; a higher count means the job already left.
    It also keeps the job's width then, which Slurm does not (a started job's `--nodes`
    range becomes the nodes it got)."""
    return f"{REASON_PREFIX}checkpoint:{move_id}:{restart_cnt}:w{width}"


def _width(job: SlurmJob) -> int:
    return job.node_count or len(hostlist.expand(job.nodes))


# A job requeued by a lend passes through these before it runs again (its width unknown).
NOT_STARTED = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
# On its way from a requeue to PENDING: its nodes are still finishing the old run.
REQUEUING = frozenset({"COMPLETING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD"})
# How long the lend waits for a requeued job to be PENDING, to release its 2-minute hold.
RELEASE_WAIT_S = 30.0


def regrow_marker(move_id: str, restart_cnt: int) -> str:
    return f"{REASON_PREFIX}regrow:{move_id}:{restart_cnt}"


def _marked(job: SlurmJob, prefix: str) -> int | None:
    """The restart count a marker with `prefix` recorded (None: no such marker)."""
    if job.admin_comment.startswith(prefix):
        tail = job.admin_comment[len(prefix) :].split(":")[0]
        return int(tail) if tail.isdigit() else None
    return None


def _marked_width(job: SlurmJob, prefix: str) -> int | None:
    if not job.admin_comment.startswith(prefix):
        return None
    parts = job.admin_comment[len(prefix) :].split(":")
    if len(parts) > 1 and parts[1].startswith("w") and parts[1][1:].isdigit():
        return int(parts[1][1:])
    return None


class ShareSlurmActivities:
    def __init__(self, slurm: SlurmSignalClient, *, poll_s: float = 1.0) -> None:
        self._slurm = slurm
        self._poll_s = poll_s

    async def _node(self, name: str) -> SlurmNode:
        return await known_node(self._slurm, name)

    async def _busy_on(self, node: str) -> list[int]:
        """Jobs with processes on the node (a requeued one is there until it completes)."""
        return [j.job_id for j in await self._slurm.jobs_on_node(node) if j.job_state in BUSY]

    @activity.defn(name="share_drain_for_move")
    async def drain_for_move(self, call: MoveCall) -> StepOutcome:
        """Drain the node under the move's reason; refused when anyone else holds it."""
        async with heartbeating(f"share_drain_for_move {call.node}"):
            node = await self._node(call.node)
            reason = move_reason(call.move_id)
            if node.drained and node.reason == reason:
                return StepOutcome(changed=False, detail="already drained for this move")
            if node.drained and not is_sharing_reason(node.reason):
                raise ApplicationError(
                    f"{call.node} is drained by someone else ({node.reason!r}): not moved",
                    type="NodeNotOurs",
                    non_retryable=True,
                )
            await self._slurm.drain(call.node, reason)
            return StepOutcome(changed=True, detail=f"drained: {reason}")

    @activity.defn(name="share_checkpoint_jobs")
    async def checkpoint_jobs(self, call: MoveCall) -> CheckpointResult:
        """Ask every job on the node to checkpoint and requeue itself (its checkpoint
        signal), wait up to the policy's grace for the node to go idle, then requeue what
        still runs; release the requeue hold so the jobs start again at once elsewhere."""
        async with heartbeating(f"share_checkpoint_jobs {call.node}"):
            return await self._checkpoint_jobs(call)

    async def _checkpoint_jobs(self, call: MoveCall) -> CheckpointResult:
        result = CheckpointResult()
        started = time.monotonic()
        prefix = f"{REASON_PREFIX}checkpoint:{call.move_id}:"
        for job in await self._slurm.jobs_on_node(call.node):
            if job.job_state not in ACTIVE:
                continue
            before = _marked(job, prefix)
            if before is not None:
                result.signalled.append(job.job_id)
                continue  # an earlier attempt signalled it: wait, never signal twice
            await self._slurm.set_admin_comment(
                job.job_id, checkpoint_marker(call.move_id, job.restart_cnt, _width(job))
            )
            await self._slurm.signal_job(job.job_id, call.policy.checkpoint_signal)
            result.signalled.append(job.job_id)
        deadline = started + call.policy.checkpoint_grace_s
        while time.monotonic() < deadline:
            if not await self._busy_on(call.node):
                break
            await asyncio.sleep(self._poll_s)
        else:
            # Did not checkpoint in time (or does not handle the signal): requeue it, once.
            for job in await self._slurm.jobs_on_node(call.node):
                if job.job_state not in ACTIVE:
                    continue
                marked = _marked(job, prefix)
                if marked is not None and job.restart_cnt > marked:
                    continue  # it did requeue itself; it only looks active again
                if job.requeue and job.batch_flag:
                    await self._slurm.requeue(job.job_id)
                    result.requeued.append(job.job_id)
            while await self._busy_on(call.node):
                await asyncio.sleep(self._poll_s)
        # The node is free: each job has left it, PENDING once its other nodes are done
        # with it too (COMPLETING until then).
        result.holds_released, jobs = await self._release_holds(
            set(result.signalled + result.requeued), REQUEUING, RELEASE_WAIT_S
        )
        for job in jobs:
            width = _marked_width(job, prefix)
            if width is not None:
                result.widths[job.job_id] = width
        result.waited_s = time.monotonic() - started
        return result

    @activity.defn(name="share_mark_lent")
    async def mark_lent(self, call: MoveCall) -> StepOutcome:
        """The move is done: the node stays drained, now as lent to inference."""
        async with heartbeating(f"share_mark_lent {call.node}"):
            node = await self._node(call.node)
            if node.drained and node.reason == LENT_REASON:
                return StepOutcome(changed=False, detail="already lent")
            if node.drained and not is_sharing_reason(node.reason):
                raise ApplicationError(
                    f"{call.node} was drained by someone else meanwhile ({node.reason!r})",
                    type="NodeNotOurs",
                    non_retryable=True,
                )
            busy = await self._busy_on(call.node)
            if busy:
                raise ApplicationError(f"{call.node} still runs Slurm jobs {busy}", type="NotIdle")
            await self._slurm.drain(call.node, LENT_REASON)
            return StepOutcome(changed=True, detail=f"drained: {LENT_REASON}")

    @activity.defn(name="share_resume_training")
    async def resume_training(self, call: MoveCall) -> StepOutcome:
        """Back to Slurm: resume the node, but only from a drain the sharing workflow wrote."""
        async with heartbeating(f"share_resume_training {call.node}"):
            node = await self._node(call.node)
            if not node.drained:
                return StepOutcome(changed=False, detail=f"already in service ({node.state})")
            if not is_sharing_reason(node.reason):
                raise ApplicationError(
                    f"{call.node} is drained by someone else ({node.reason!r}): left drained",
                    type="NodeNotOurs",
                    non_retryable=True,
                )
            await self._slurm.resume(call.node)
            return StepOutcome(changed=True, detail="resumed in Slurm")

    @activity.defn(name="share_regrow_jobs")
    async def regrow_jobs(self, call: MoveCall) -> RegrowResult:
        """Jobs a lend narrowed (`call.regrow`: job -> its width before) that still run
        narrower are asked to checkpoint and requeue once, so they start again at full
        width now that the node is back; ended ones need nothing, pending ones are named so
        the sharing workflow asks again at its next return (a lend in between narrows them)."""
        async with heartbeating(f"share_regrow_jobs {call.node}"):
            result = RegrowResult()
            prefix = f"{REASON_PREFIX}regrow:{call.move_id}:"
            jobs = {j.job_id: j for j in await self._slurm.jobs()}
            for job_id, before in sorted(call.regrow.items()):
                job = jobs.get(job_id)
                if job is not None and job.job_state in NOT_STARTED:
                    result.pending.append(job_id)
                    continue
                if job is None or job.job_state != "RUNNING" or _width(job) >= before:
                    result.settled.append(job_id)
                    continue
                if _marked(job, prefix) is None:
                    await self._slurm.set_admin_comment(
                        job.job_id, regrow_marker(call.move_id, job.restart_cnt)
                    )
                    await self._slurm.signal_job(job.job_id, call.policy.checkpoint_signal)
                result.requeued.append(job.job_id)
            # Each requeues itself after its checkpoint (still running until then).
            await self._release_holds(
                set(result.requeued), ACTIVE | REQUEUING, call.policy.checkpoint_grace_s
            )
            return result

    async def _release_holds(
        self, job_ids: set[int], on_the_way: AbstractSet[str], within_s: float
    ) -> tuple[list[int], list[SlurmJob]]:
        """Release the requeue hold of each job once it is PENDING: a requeued batch job
        waits ~2 min before it may start again, and the rule is that it restarts at once on
        healthy capacity. A single early look missed jobs still COMPLETING (the share demo's
        narrowed job sat out the 2 minutes). Waits while one of them is in an `on_the_way`
        state, at most `within_s`; returns the jobs released and the last read of all jobs."""
        released: list[int] = []
        waiting = set(job_ids)
        deadline = time.monotonic() + within_s
        while True:
            jobs = await self._slurm.jobs()
            read_at = time.time()
            for job in jobs:
                if job.job_id in waiting and job.job_state == "PENDING":
                    await self._slurm.release_hold(job.job_id, read_at)
                    released.append(job.job_id)
                    waiting.discard(job.job_id)
            coming = [j for j in jobs if j.job_id in waiting and j.job_state in on_the_way]
            if not coming or time.monotonic() >= deadline:
                return released, jobs
            await asyncio.sleep(self._poll_s)
