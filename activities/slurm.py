"""Slurm steps of the runbook: drain, requeue, wait for registration, return to service."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from autoclusters.activities.heartbeat import heartbeating
from autoclusters.activities.holders import refill, release_for_requeued
from autoclusters.activities.in_job import InJobRecovery, free_nodes, plan_for
from autoclusters.activities.job_markers import ACTIVE, BUSY, marked_for, requeue_marker
from autoclusters.core.cluster_ops import is_ops_reason
from autoclusters.core.holders import is_holder
from autoclusters.core.kubernetes import SLINKY_REASON_PREFIX
from autoclusters.core.models import (
    REASON_PREFIX,
    SPARE_REASON,
    CancelJobsInput,
    CancelJobsResult,
    DrainInput,
    DrainResult,
    RequeueInput,
    RequeueResult,
    ReturnInput,
    ReturnResult,
    SlurmJob,
    SlurmNode,
    SpareInput,
    WaitIdleInput,
    WaitIdleResult,
    WaitRegisteredInput,
)
from autoclusters.core.quarantine import QuarantineStatus, VerifyQuarantineInput
from autoclusters.integrations.slurm import (
    SlurmClient,
    SlurmError,
    SlurmFencingClient,
    SlurmHolderClient,
    SlurmInJobClient,
    SlurmUnavailable,
)

# A requeued job's begin time is ~2 minutes on; a pending job eligible later than this is
# held, whatever reason Slurm shows yet (it names BeginTime at its next scheduling pass).
HELD_AHEAD_S = 5


def _held(job: SlurmJob, read_at: float) -> bool:
    """Pending on a requeue's begin-time delay: by Slurm's reason, or by its eligible time
    before Slurm has named the reason."""
    if job.job_state != "PENDING":
        return False
    return job.state_reason == "BeginTime" or job.eligible_time > read_at + HELD_AHEAD_S


def _held_by_hand(job: SlurmJob) -> bool:
    """`scontrol hold` (JobHeldAdmin) or the user's own (JobHeldUser)."""
    return job.state_reason.startswith("JobHeld")


def _settling(job: SlurmJob) -> bool:
    """Still on its way from RUNNING back to PENDING after a requeue."""
    return job.job_state == "COMPLETING" or job.job_state.startswith("REQUEUE")


async def known_node(slurm: SlurmClient, name: str) -> SlurmNode:
    """The node as Slurm sees it; a node Slurm does not have is `UnknownNode`, not retried."""
    node = await slurm.node(name)
    if node is None:
        raise ApplicationError(
            f"node {name} is not in this Slurm cluster", type="UnknownNode", non_retryable=True
        )
    return node


class SlurmActivities:
    def __init__(self, slurm: SlurmClient) -> None:
        self._slurm = slurm

    async def _known_node(self, name: str) -> SlurmNode:
        return await known_node(self._slurm, name)

    @activity.defn(name="drain_node")
    async def drain_node(self, inp: DrainInput) -> DrainResult:
        async with heartbeating(f"drain_node {inp.node}"):
            return await self._drain_node(inp)

    async def _drain_node(self, inp: DrainInput) -> DrainResult:
        node = await self._known_node(inp.node)
        if node.drained and not node.reason.startswith(f"{REASON_PREFIX} "):
            # An admin's drain stands: overwriting their reason would let our return to
            # service undrain a node they meant to keep out.
            return DrainResult(already_drained=True, previous_reason=node.reason)
        if node.drained and is_ops_reason(node.reason) and not is_ops_reason(inp.reason):
            # A scale or teardown owns the node (it is about to be deleted): kept.
            return DrainResult(already_drained=True, previous_reason=node.reason)
        if node.drained and node.reason == inp.reason:
            return DrainResult(already_drained=True, previous_reason=node.reason)
        await self._slurm.drain(inp.node, inp.reason)
        await self._drain_read_back(inp.node, inp.reason)
        return DrainResult(already_drained=node.drained, previous_reason=node.reason)

    async def _drain_read_back(self, name: str, reason: str) -> SlurmNode:
        """A drain is a fact only once Slurm shows it: `scontrol update` answering 0 is not
        enough (a controller that restarts from an older saved state forgets it)."""
        node = await self._known_node(name)
        if not (node.drained and (node.reason == reason or node.reason.endswith(f": {reason}"))):
            raise SlurmUnavailable(
                f"the drain of {name} did not show when read back "
                f"({node.display_state}, reason {node.reason!r})"
            )
        return node

    @activity.defn(name="requeue_jobs")
    async def requeue_jobs(self, inp: RequeueInput) -> RequeueResult:
        # What an attempt learnt goes out with its heartbeats: a retry after a crash (of the
        # worker, or of slurmctld, whose restart can forget the attempt's writes and even
        # the jobs) keeps the controller's start and the job records the first one read.
        details = activity.info().heartbeat_details
        earlier = _earlier_requeue(details[0] if details else None)
        seen = RequeueResult(
            controller_started=earlier.controller_started,
            records=list(earlier.records),
            fence_held=list(earlier.fence_held),
        )

        def progress() -> dict[str, Any]:
            return {"requeue_jobs": inp.node, "seen": seen.model_dump()}

        async with heartbeating(progress):
            return await self._requeue_jobs(inp, seen, lambda: activity.heartbeat(progress()))

    async def _requeue_jobs(
        self, inp: RequeueInput, seen: RequeueResult, tell: Callable[[], None]
    ) -> RequeueResult:
        # Read before any write: should the controller restart after these writes and come
        # back from an older saved state, the runbook sees another start and checks again.
        if not seen.controller_started:
            seen.controller_started = await self._slurm.controller_started()
        result = RequeueResult(controller_started=seen.controller_started)
        if inp.drain_reason:
            result.redrained = await self._drain_lost(inp.node, inp.drain_reason)
        if inp.in_job and isinstance(self._slurm, SlurmInJobClient):
            # Jobs holding a hot spare lose the node and go on; what they could not do is
            # requeued there, under this incident's marker (seen below as requeued once).
            result.in_job = await InJobRecovery(
                self._slurm, inp.node, inp.incident_id, inp.in_job_budget_s, inp.poll_s,
                inp.figures, inp.capacity, inp.fault_at, inp.standby_holders,
            ).recover()  # fmt: skip
            result.plans = list(result.in_job.plans)
        # Another incident's requeue of a job is this fault's too: never a second one.
        elsewhere = result.in_job.requeued_elsewhere if result.in_job else {}
        # The partition's nodes, read once and only to plan a job (None: the read failed).
        nodes: list[SlurmNode] | None = None
        unread = True
        for job in await self._slurm.jobs_on_node(inp.node):
            if job.job_state not in ACTIVE or job.job_id in elsewhere:
                continue
            if inp.standby_holders and is_holder(job):
                continue  # a holder is cancelled (in-job recovery above), never requeued
            if not (job.requeue and job.batch_flag):
                result.not_requeueable.append(job.job_id)
                continue
            before = marked_for(job, inp.incident_id)
            if before is not None and job.restart_cnt > before:
                # Requeued once for this incident, and Slurm placed it on this node again
                # (the drain was lost meanwhile). Never a second requeue for one fault
                # unless the policy says so: the runbook asks a human.
                if not inp.requeue_again:
                    result.came_back.append(job.job_id)
                    continue
                result.requeued_again.append(job.job_id)
                before = None  # a fresh marker: a retry of this call must not requeue it thrice
            if job.job_id not in {j.job_id for j in seen.records}:
                seen.records.append(job.record())  # before the write: it may be lost
                tell()
            if before is None and job.job_id not in {p.job_id for p in result.plans}:
                blocked = (
                    "the policy's job_recovery is requeue"
                    if not inp.in_job
                    else "it holds no standby (no injob= in its comment)"
                )
                if unread:
                    nodes, unread = await self._nodes_for_plan(), False
                free = free_nodes(nodes, job, inp.node)
                result.plans.append(
                    plan_for(
                        job,
                        blocked,
                        inp.figures,
                        inp.fault_at or time.time(),
                        capacity=inp.capacity,
                        free=free,
                    )  # fmt: skip
                )
            if before is None:
                await self._slurm.set_admin_comment(
                    job.job_id, requeue_marker(inp.incident_id, job.restart_cnt)
                )
            if await self._requeue(job):
                result.requeued_now.append(job.job_id)
            else:
                result.requeued_itself.append(job.job_id)
        # Release the requeue hold of every job this incident requeued, including those an
        # earlier attempt requeued before it was interrupted. A requeued job passes through
        # COMPLETING while its processes are killed; the hold can only be released once it
        # is PENDING. A job requeued while it was still launching gets its hold a moment
        # *after* it shows PENDING, so keep watching until it has been quiet for a while.
        quiet, deadline = 0, time.monotonic() + inp.hold_watch_s
        settling_since: dict[int, float] = {}
        while True:
            jobs = await self._slurm.jobs()
            read_at = time.time()
            mine = [j for j in jobs if marked_for(j, inp.incident_id) is not None]
            # Held over a DOWN (below): let go once pending, and forgotten only once a read
            # shows it no longer held (read back, not assumed).
            ours = [j for j in jobs if j.job_id in seen.fence_held]
            fenced = [j for j in ours if j.job_state == "PENDING" and _held_by_hand(j)]
            for job in [j for j in ours if j not in fenced and not _settling(j)]:
                seen.fence_held.remove(job.job_id)
                tell()
            held = [j for j in mine if _held(j, read_at) and j not in fenced]
            for job in held + fenced:
                await self._slurm.release_hold(job.job_id, read_at)
                if job in fenced and isinstance(self._slurm, SlurmFencingClient):
                    await self._slurm.release(job.job_id)
                if job.job_id not in result.holds_released:
                    result.holds_released.append(job.job_id)
            settling = [j.job_id for j in mine if _settling(j)]
            for job_id in settling:
                settling_since.setdefault(job_id, time.monotonic())
            if settling and inp.drain_reason and not result.marked_down:
                result.marked_down = await self._fence_if_stuck(
                    inp, result.controller_started, settling_since, seen, tell
                )
            quiet = 0 if held or fenced or settling else quiet + 1
            if quiet >= 2 or (not (settling or fenced) and time.monotonic() > deadline):
                break
            await asyncio.sleep(inp.poll_s)  # (the heartbeats carry what was seen)
        # Held for the DOWN and not yet seen let go (still completing there): none, as a rule.
        result.fence_held = list(seen.fence_held)
        result.requeued = [j.job_id for j in mine if j.job_id not in result.came_back]
        result.records = [j.record() for j in mine if j.job_id in result.requeued]
        if inp.standby_holders and result.requeued and isinstance(self._slurm, SlurmHolderClient):
            result.holders_released = await release_for_requeued(self._slurm, result.requeued)
        # A job an earlier attempt requeued that Slurm no longer knows (its restart lost
        # it): still the incident's, for the runbook to find missing and report.
        known = {j.job_id for j in jobs}
        lost = [j for j in seen.records if j.job_id not in known]
        result.requeued += [j.job_id for j in lost]
        result.records += lost
        return result

    async def _requeue(self, job: SlurmJob) -> bool:
        """Requeue a job this incident marked; False: it requeued itself in the same
        instant (its checkpoint signal's `scontrol requeue`, train.sbatch's USR1), and
        Slurm refused the second one ("Job is pending execution"). Read back, not assumed:
        only a job whose restart count moved on since it was read running counts so; any
        other refusal stands."""
        try:
            await self._slurm.requeue(job.job_id)
            return True
        except SlurmError:
            now = {j.job_id: j for j in await self._slurm.jobs()}.get(job.job_id)
            if now is None or now.restart_cnt <= job.restart_cnt or now.job_state in ACTIVE:
                raise
            activity.logger.info("job %s requeued itself as it was requeued", job.job_id)
            return False

    async def _fence_if_stuck(
        self,
        inp: RequeueInput,
        controller_started: str,
        settling_since: dict[int, float],
        seen: RequeueResult,
        tell: Callable[[], None],
    ) -> bool:
        """A requeued job still completes on the incident's node: its rank there is stuck
        (a GPU rank hung in the driver outlives SIGKILL until the reboot) or the node does
        not answer (power, a kernel panic, its link), and slurmctld would wait out
        UnkillableStepTimeout, or its RPC timeouts and SlurmdTimeout, before it lets the job
        start again. Mark the node DOWN, as an SRE does to free a stuck job: its drain and
        reason kept, the repair or the node's registration ends what is left there. Only
        where that ends nothing but what this incident requeued, and the node comes back
        by itself once repaired:
        - the node does not answer, or the job has been completing for `fence_after_s`
          (a healthy node ends a requeued run in a second or two);
        - the node is drained as this incident's;
        - every job Slurm shows on it is one this incident requeued, on its way out: DOWN
          ends every job on the node, and any other (one that cannot be requeued, one a
          human is asked about) must not end for it;
        - ReturnToService=2: a node set DOWN by hand returns when its slurmd registers
          (with 0 or 1 it would stay DOWN after the repair);
        - the controller has not restarted since the requeue read its start: one that just
          came back shows every node not responding until its slurmd registers.
        Its jobs are held first: DOWN ends their completing with none of a requeue's
        begin-time delay, and a start within the second of their kill, on a node of their
        old allocation, is killed there ("Job credential revoked") and the job FAILS. The
        watch above releases them once that second has passed (`release_hold`'s rule).
        """
        if inp.fence_after_s is None or not isinstance(self._slurm, SlurmFencingClient):
            return False
        node = await self._known_node(inp.node)
        if not (node.drained and _ours(node.reason, inp.incident_id)):
            return False
        jobs = await self._slurm.jobs_on_node(inp.node)
        on_node = [j for j in jobs if j.job_state in BUSY or _settling(j)]
        if not on_node or any(
            marked_for(j, inp.incident_id) is None or not _settling(j) for j in on_node
        ):
            return False
        now = time.monotonic()
        waited = min(now - settling_since.get(j.job_id, now) for j in on_node)
        if node.responding and waited < inp.fence_after_s:
            return False
        if await self._slurm.return_to_service() != 2:
            return False
        if await self._slurm.controller_started() != controller_started:
            return False
        ids = [j.job_id for j in on_node]
        seen.fence_held += [i for i in ids if i not in seen.fence_held]
        tell()  # before the holds: a retry must release them whatever happens next
        try:
            for job_id in ids:
                await self._slurm.hold(job_id)
        except SlurmError as e:
            # Ended meanwhile, or the controller is away: no DOWN now (the watch reads
            # again, and releases whatever was held).
            activity.logger.info("%s: no DOWN, a hold failed: %s", inp.node, e)
            return False
        why = "does not answer" if not node.responding else f"still ends it after {waited:.1f}s"
        activity.logger.warning("%s %s: marked DOWN for its requeued jobs to end", inp.node, why)
        await self._slurm.mark_down(inp.node, node.reason)
        return True

    async def _nodes_for_plan(self) -> list[SlurmNode] | None:
        """The nodes, for the recovery plan's free count; a failed read is unknown (None),
        never a reason to hold the requeue up."""
        try:
            return await self._slurm.nodes()
        except SlurmError as e:
            activity.logger.warning("no node list for the recovery plan: %s", e)
            return None

    @activity.defn(name="wait_node_registered")
    async def wait_node_registered(self, inp: WaitRegisteredInput) -> SlurmNode:
        async with heartbeating(f"wait_node_registered {inp.node}"):
            return await self._wait_node_registered(inp)

    async def _wait_node_registered(self, inp: WaitRegisteredInput) -> SlurmNode:
        """Poll until the node's slurmd (re)started after `since` and answers the controller.

        The controller can flag a freshly registered node NOT_RESPONDING for a moment while
        it gives up on messages meant for the old machine, so the node must answer for
        `settle_s` in a row.
        """
        answering_since: float | None = None
        while True:
            node = await self._known_node(inp.node)
            if node.slurmd_start_time >= int(inp.since) and node.responding:
                now = time.monotonic()
                answering_since = answering_since or now
                if now - answering_since >= inp.settle_s:
                    return await self._keep_drained(node, inp)
            else:
                answering_since = None
            activity.heartbeat(node.display_state)
            await asyncio.sleep(inp.poll_s)

    async def _keep_drained(self, node: SlurmNode, inp: WaitRegisteredInput) -> SlurmNode:
        """The node back, before its health gate: still drained as the incident's.

        On Slurm in Kubernetes (Slinky), replacing the machine deletes its Node: the slurmd
        pod's preStop hook marks the Slurm node DOWN with the operator's own reason, which
        overwrites ours, and the operator undrains a node whose reason is its own as soon
        as the new Node is not cordoned. Either way the node could take jobs before its
        health gate. A reason of the operator's, or no drain at all, is taken back; anyone
        else's drain (an admin's) stands, as everywhere.
        """
        if not inp.drain_reason:
            return node
        ours = node.reason.startswith(_reason_of(inp.incident_id))
        if node.drained and (ours or not node.reason.startswith(SLINKY_REASON_PREFIX)):
            return node
        was = f"drained by the Slinky operator ({node.reason!r})" if node.drained else "undrained"
        activity.logger.warning("%s was %s after its repair: drained again", inp.node, was)
        await self._slurm.drain(inp.node, inp.drain_reason)
        return await self._drain_read_back(inp.node, inp.drain_reason)

    @activity.defn(name="wait_node_idle")
    async def wait_node_idle(self, inp: WaitIdleInput) -> WaitIdleResult:
        async with heartbeating(f"wait_node_idle {inp.node}"):
            return await self._wait_node_idle(inp)

    async def _wait_node_idle(self, inp: WaitIdleInput) -> WaitIdleResult:
        """Never repair under a running job: wait until the node runs none, or force.

        Force cancels what still runs when the time is up; without it the step fails
        (non-retryable) and the node stays drained for a human.
        """
        start = time.monotonic()
        redrained = 0
        drain_checked = -float("inf")
        while True:
            # The drain is read (a whole-cluster sinfo) every drain_check_s, not at every
            # poll: an hour's wait on a thousand-node cluster must not double the load on
            # slurmctld that squeue already puts there.
            if inp.drain_reason and time.monotonic() - drain_checked >= inp.drain_check_s:
                drain_checked = time.monotonic()
                if await self._drain_lost(inp.node, inp.drain_reason):
                    redrained += 1
                # After the drain (a restart forgets it first): a job the controller placed
                # here again is the runbook's to requeue, not one to wait out.
                if restarted := await self._restarted(inp):
                    return WaitIdleResult(
                        waited_s=time.monotonic() - start,
                        redrained=redrained,
                        controller_restarted=restarted,
                    )
            on_node = [j for j in await self._slurm.jobs_on_node(inp.node) if j.job_state in BUSY]
            busy = [j.job_id for j in on_node]
            waited = time.monotonic() - start
            if not busy:
                return WaitIdleResult(waited_s=waited, redrained=redrained)
            if back := _came_back(on_node, inp.incident_id):
                return WaitIdleResult(waited_s=waited, redrained=redrained, came_back=back)
            if waited >= inp.timeout_s:
                # Never cancel, or give up on, a job whose requeue the controller forgot.
                if restarted := await self._restarted(inp):
                    return WaitIdleResult(
                        waited_s=waited, redrained=redrained, controller_restarted=restarted
                    )
                if not inp.force:
                    raise ApplicationError(
                        f"{inp.node} still runs jobs {busy} after {inp.timeout_s:.0f}s",
                        type="NodeBusy",
                        non_retryable=True,
                    )
                for job_id in busy:
                    await self._slurm.cancel(job_id)
                return WaitIdleResult(waited_s=waited, cancelled=busy, redrained=redrained)
            activity.heartbeat(f"jobs {busy} still running")
            await asyncio.sleep(inp.poll_s)

    async def _restarted(self, inp: WaitIdleInput) -> str:
        """slurmctld's start, when it is not the one the incident requeued under."""
        if not inp.controller_started:
            return ""
        now = await self._slurm.controller_started()
        return now if now and now != inp.controller_started else ""

    async def _drain_lost(self, name: str, reason: str) -> bool:
        """Undrained (our drain was lost, not overridden by someone's own drain): drain
        again, read it back, and say so."""
        node = await self._known_node(name)
        if node.drained:
            return False
        await self._slurm.drain(name, reason)
        await self._drain_read_back(name, reason)
        return True

    @activity.defn(name="cancel_jobs")
    async def cancel_jobs(self, inp: CancelJobsInput) -> CancelJobsResult:
        async with heartbeating(f"cancel_jobs {inp.node}"):
            return await self._cancel_jobs(inp)

    async def _cancel_jobs(self, inp: CancelJobsInput) -> CancelJobsResult:
        """Cancel the named jobs that still run on the node (a human decided so); a job that
        has left the node or ended is left alone. Idempotent: a retry cancels nothing twice."""
        on_node = {
            j.job_id for j in await self._slurm.jobs_on_node(inp.node) if j.job_state in BUSY
        }
        result = CancelJobsResult()
        for job_id in inp.job_ids:
            if job_id in on_node:
                await self._slurm.cancel(job_id)
                result.cancelled.append(job_id)
            else:
                result.gone.append(job_id)
        return result

    @activity.defn(name="take_spare")
    async def take_spare(self, inp: SpareInput) -> ReturnResult:
        async with heartbeating(f"take_spare {inp.node}"):
            return await self._take_spare(inp)

    async def _take_spare(self, inp: SpareInput) -> ReturnResult:
        """A hot spare goes into service at once (it was healthy and waiting drained)."""
        node = await self._known_node(inp.node)
        if node.drained and node.reason != SPARE_REASON:
            return ReturnResult(
                returned=False,
                state_after=node.display_state,
                detail=f"not a free spare: drained for {node.reason!r}",
            )
        if node.drained:
            await self._slurm.resume(inp.node)
            node = await self._known_node(inp.node)
        return ReturnResult(returned=not node.drained, state_after=node.display_state)

    @activity.defn(name="park_as_spare")
    async def park_as_spare(self, inp: SpareInput) -> ReturnResult:
        async with heartbeating(f"park_as_spare {inp.node}"):
            return await self._park_as_spare(inp)

    async def _park_as_spare(self, inp: SpareInput) -> ReturnResult:
        """The replaced node, proven healthy, waits as the new hot spare (still drained)."""
        node = await self._known_node(inp.node)
        if node.reason == SPARE_REASON:
            return ReturnResult(returned=False, state_after=node.display_state, detail="spare")
        if node.drained and not node.reason.startswith(f"{REASON_PREFIX} {inp.incident_id} "):
            return ReturnResult(
                returned=False,
                state_after=node.display_state,
                detail=f"left drained: reason {node.reason!r} is not ours",
            )
        await self._slurm.drain(inp.node, SPARE_REASON)
        node = await self._known_node(inp.node)
        return ReturnResult(returned=False, state_after=node.display_state, detail="spare")

    @activity.defn(name="return_to_service")
    async def return_to_service(self, inp: ReturnInput) -> ReturnResult:
        async with heartbeating(f"return_to_service {inp.node}"):
            return await self._return_to_service(inp)

    async def _return_to_service(self, inp: ReturnInput) -> ReturnResult:
        node = await self._known_node(inp.node)
        if not node.drained:
            return ReturnResult(returned=True, state_after=node.display_state, detail="not drained")
        if not _ours(node.reason, inp.incident_id):
            # Someone else drained it (an admin, another tool): their drain wins.
            return ReturnResult(
                returned=False,
                state_after=node.display_state,
                detail=f"left drained: reason {node.reason!r} is not ours",
            )
        busy = [j.job_id for j in await self._slurm.jobs_on_node(inp.node) if j.job_state in BUSY]
        if busy:
            # Emptied, repaired, and yet Slurm places jobs here: after a reset or a new
            # machine they cannot be running (a controller that came back from an older
            # state). Never returned so: the runbook deals with them first.
            return ReturnResult(
                returned=False,
                state_after=node.display_state,
                detail=f"left drained: Slurm shows jobs {busy} on it after its repair",
            )
        await self._slurm.resume(inp.node)
        # Slurm flags a resumed node NOT_RESPONDING until it answers a fresh ping.
        while True:
            node = await self._known_node(inp.node)
            if node.responding or node.drained:
                break
            activity.heartbeat(node.display_state)
            await asyncio.sleep(inp.poll_s)
        back = ReturnResult(returned=not node.drained, state_after=node.display_state)
        if back.returned and inp.standby_holders and isinstance(self._slurm, SlurmHolderClient):
            # The pool of standbys held outside the jobs refills on the node just returned.
            back.detail = await refill(self._slurm, inp.node, inp.standby_holders, inp.poll_s)
        return back

    @activity.defn(name="verify_quarantine")
    async def verify_quarantine(self, inp: VerifyQuarantineInput) -> QuarantineStatus:
        """Right before a reboot or replacement: is the node still drained for this incident
        and running nothing? It reports; the workflow decides (quarantine again, or stop)."""
        async with heartbeating(f"verify_quarantine {inp.node}"):
            node = await self._known_node(inp.node)
            busy = [
                j.job_id for j in await self._slurm.jobs_on_node(inp.node) if j.job_state in BUSY
            ]
        # On Slinky the operator may have copied our cordon reason into Slurm with its own
        # prefix ("slurm-operator: <reason>"): still ours.
        ours = node.drained and any(
            node.reason == r or node.reason.endswith(f": {r}") for r in inp.reasons if r
        )
        return QuarantineStatus(
            node=inp.node,
            state=node.display_state,
            drained=node.drained,
            reason=node.reason,
            ours=ours,
            busy_jobs=busy,
        )


def _reason_of(incident_id: str) -> str:
    return f"{REASON_PREFIX} {incident_id} "


def _ours(reason: str, incident_id: str) -> bool:
    """The incident's drain reason, or (Slinky) the operator's copy of it: a controller that
    restarted lost our drain and the operator drained the still-cordoned Node again with its
    own prefix before our copy came back."""
    return reason.removeprefix(SLINKY_REASON_PREFIX).startswith(_reason_of(incident_id))


def _earlier_requeue(details: Any) -> RequeueResult:
    """What an earlier attempt's heartbeats said it had seen (nothing on a first attempt,
    or from a worker before this change, whose beats were plain text)."""
    if isinstance(details, dict) and isinstance(details.get("seen"), dict):
        return RequeueResult.model_validate(details["seen"])
    return RequeueResult()


def _came_back(jobs: list[SlurmJob], incident_id: str) -> list[int]:
    """Jobs the incident requeued that run on the node again (Slurm placed them back while
    its drain was lost): restarted since the incident's marker."""
    if not incident_id:
        return []
    return [
        j.job_id
        for j in jobs
        if (before := marked_for(j, incident_id)) is not None and j.restart_cnt > before
    ]
