"""In-job recovery: a job that holds a hot spare in its own allocation loses the faulty node
and goes on, without a requeue (issues 22 and 39; examples/training's in-job mode).

A job announces it in its Slurm comment: `injob=<dir>`, and names the nodes it trains on,
`training=<node>,<node>` (the others of its allocation are its standbys; a job that names
none is taken to hold one). When the policy's job_recovery is `in-job`, the runbook's
requeue step first decides, for each such job on the faulty node, from one read of the
queue (and of the nodes) and before anything is released or signalled:

- the faulty node runs the job's batch script (`BatchHost`): Slurm refuses to release it
  ("You cannot remove the batch host from a job when resizing"), so the job is requeued at
  once ("the batch host: requeued");
- without this node the job keeps fewer healthy nodes than it trains on (its other nodes
  drained by another incident, our reason prefix, or not answering the controller; or its
  batch host among them): no wait can help, it is requeued at once ("more losses than
  standbys");
- another incident's requeue marker already names the job's current run: that incident
  requeues it (two faults on one job), and this one leaves it alone;
- otherwise it goes on in place, without waiting for the victim (on a GPU a rank hung in
  the driver, or a node gone silent, closes no socket: killing it frees nobody):

  1. marks the job (AdminComment `autoclusters: injob:<incident>:<restart count>`), so a
     retried step knows it already acted;
  2. fences the victim: releases the node from the job (`scontrol update JobId=
     NodeList=<the others>`). Slurm 22.05 (measured on a sandbox-like cluster) kills the
     job's step processes on the released node through its slurmd within ~50 ms ("Killing
     JobId=N StepId=0 on failed node"), stopped ones too, keeps the steps running on the
     other nodes (they were started with --no-kill) and frees the node; a node whose slurmd
     does not answer is released all the same (~10 ms), its processes killed when it
     answers again (its reboot or replacement);
  3. tells the survivors to abandon their group: SIGUSR2 to the job's steps
     (`scancel --signal=USR2 <job>`: without --batch/--full never to the batch shell, nor
     to srun; a job with no step running is not an error). Their ranks abandon the
     generation and re-form with the standby from their state in memory
     (examples/training). Not sent when the node was one of its standbys, whose loss the
     training ranks never see;
  4. waits, up to the policy's in_job_budget_s, for the job to say it stepped again
     (`resumed_at=<epoch s>` in its comment, not before the fence); a standby's release is
     all there is to wait for.

A job that cannot be helped so (Slurm refused, the budget ran out) is requeued, once, under
the incident's requeue marker: the requeue path is the fallback, never a second recovery.
A job requeued meanwhile by someone else (its restart count moved, another incident's
marker on it, or Slurm refusing our requeue because the job is already pending) is never
requeued again: it is recorded in `requeued_elsewhere`, and counts as the requeue path for
this incident too. Jobs without `injob=` are left to the requeue step.

With the policy's `standby_holders` above 0, standbys may also be held outside the job, by
holder jobs on spare nodes (core/holders.py): a job that says `holders=1` counts the nodes
of the holders claimed for it as its own; a fault on a holder's node is the fault of the
job it serves (Slurm lists only the holder there): the holder is cancelled (the fence: its
steps, the job's rank, end there) instead of the node released from the job, and the
job's steps *and* those in its other holders are told to abandon their group. A job that
stepped again without a standby left is given a free holder, and its batch shell SIGUSR2
(it launches a standby into it); holders on the faulty node that serve no job are
cancelled, never requeued (the node's return submits a new one: activities/holders.py).
With `standby_holders` 0 nothing of this runs.

It is part of the requeue step, not a step of its own: a job that cannot recover in place
pays nothing for it (the step lists the node's jobs anyway), and the runbook issues the
same commands as before (docs/versioning.md).
"""

from __future__ import annotations

import asyncio
import time

from temporalio import activity

from autoclusters.activities.job_markers import (
    ACTIVE,
    in_job_marked,
    in_job_marker,
    requeue_claim,
    requeue_marker,
)
from autoclusters.core import holders, hostlist
from autoclusters.core.models import (
    REASON_PREFIX,
    SPARE_REASON,
    InJobResult,
    SlurmJob,
    SlurmNode,
    job_comment,
    job_stamp,
)
from autoclusters.core.recovery_cost import (
    JobFacts,
    RecoveryCapacity,
    RecoveryFigures,
    RecoveryPlan,
    at_risk_since,
    plan_recovery,
)
from autoclusters.integrations.slurm import (
    SlurmError,
    SlurmHolderClient,
    SlurmInJobClient,
    SlurmUnavailable,
)

# What the survivors' processes are told (`scancel --signal=USR2 <job>`: the job's steps,
# never its batch shell): abandon this generation of the group and re-form with a standby
# (examples/training).
ABANDON_SIGNAL = "USR2"
# What a job that says how it trains writes in its comment (examples/training): one that
# writes any will write `resumed_at=` when it steps again.
PROGRESS_TOKENS = ("ckpt_at", "run_at", "resumed_at", "injob", "training")


def _resumed_since(job: SlurmJob, since: float) -> bool:
    stamp = job_stamp(job, "resumed_at")  # None, too, when not a time: not a resume
    return stamp is not None and stamp >= since


def training_nodes(job: SlurmJob) -> list[str] | None:
    """The nodes the job says it trains on (`training=<n>,<n>`); None when it does not say."""
    training = job_comment(job, "training")
    return [n for n in training.split(",") if n] if training is not None else None


def _reformed(job: SlurmJob, before: SlurmJob) -> bool:
    """The job names other training nodes than when the node was taken: it re-formed and
    stepped (rank 0 writes `training=` at the first step of a generation, just before
    `resumed_at=`, which a signal or a slow slurmctld may have kept from landing)."""
    now, was = job_comment(job, "training"), job_comment(before, "training")
    return now is not None and was is not None and now != was


def standby(job: SlurmJob, node: str) -> bool:
    """The job names the nodes it trains on, and `node` is not one of them."""
    training = training_nodes(job)
    return training is not None and node not in training


def capable(job: SlurmJob, node: str) -> bool:
    """The job says it holds a spare, and keeps at least one node without this one."""
    others = [n for n in hostlist.expand(job.nodes) if n != node]
    return bool(job_comment(job, "injob")) and bool(others) and job.requeue and job.batch_flag


def faulty(node: SlurmNode | None) -> bool:
    """Lost to the job as well: drained by an incident (our reason prefix, not a spare's),
    or not answering the controller."""
    if node is None:
        return False
    if not node.responding:
        return True
    ours = node.reason.startswith(REASON_PREFIX) and not node.reason.startswith(SPARE_REASON)
    return node.drained and ours


def free_nodes(nodes: list[SlurmNode] | None, job: SlurmJob, node: str) -> int | None:
    """Idle healthy nodes outside the job (and other than the faulty one) that it could
    start again on at once; None when the nodes could not be read (unknown, not none)."""
    if nodes is None:
        return None
    mine = {*hostlist.expand(job.nodes), node}
    return sum(
        1
        for n in nodes
        if n.name not in mine and n.state == "idle" and n.responding and not n.drained
    )


def plan_for(
    job: SlurmJob,
    in_job_blocked: str | None,
    figures: RecoveryFigures,
    now: float,
    *,
    capacity: RecoveryCapacity | None = None,
    free: int | None = None,
    standby_lost: bool = False,
) -> RecoveryPlan:
    """The job's recovery plan from what Slurm shows of it: its width (GPUs, else nodes),
    its checkpoint's age at `now` (the fault, where the incident says when; `ckpt_at=` in
    its comment; unknown when it does not say) and the free nodes it could start again on
    (`free`: None, unknown). The work at risk began at the later of its newest checkpoint
    and its run's first step (`run_at=`): a requeued run that started from an older
    checkpoint, or from none, did none of the work between that save and its start.
    `standby_lost`: the node was one of its standbys (in place, nothing re-forms)."""
    saved, began = job_stamp(job, "ckpt_at"), job_stamp(job, "run_at")
    at_risk = at_risk_since(saved, began)
    width = job.gpus or job.node_count or len(hostlist.expand(job.nodes)) or 1
    facts = JobFacts(
        job_id=job.job_id,
        gpus=width,
        checkpoint_age_s=max(0.0, now - at_risk) if at_risk is not None else None,
        in_job_blocked=in_job_blocked,
        standby_lost=standby_lost,
        free_nodes=free,
        restart_cnt=job.restart_cnt,
        checkpoint_at=saved,
        run_at=began,
        says_progress=any(job_comment(job, key) is not None for key in PROGRESS_TOKENS),
    )
    return plan_recovery(facts, figures, capacity)


def why_not_in_place(
    job: SlurmJob, node: str, lost: set[str], world: list[str] | None = None
) -> str | None:
    """Why the job cannot go on in place without `node` (None: it can). `lost`: this node
    and the job's other nodes that are faulty too. `world`: the nodes that may train for
    it (core/holders.py `world`); its allocation when not given."""
    if job.batch_host == node:
        return "the batch host: requeued"
    if job.batch_host in lost:
        return f"its batch host {job.batch_host} is lost too: requeued"
    everyone = world if world is not None else hostlist.expand(job.nodes)
    kept = [n for n in everyone if n not in lost]
    training = training_nodes(job)
    # A job that names no training nodes holds one spare (its `injob=` says so).
    need = len(training) if training is not None else len(everyone) - 1
    if len(kept) < need:
        gone = sorted(n for n in everyone if n in lost)
        return (
            f"more losses than standbys ({', '.join(gone)} lost, {len(kept)} left of the "
            f"{need} it trains on): requeued at once"
        )
    return None


class InJobRecovery:
    """One node's in-job recovery, run inside the requeue activity (which heartbeats)."""

    def __init__(
        self,
        slurm: SlurmInJobClient,
        node: str,
        incident_id: str,
        budget_s: float,
        poll_s: float,
        figures: RecoveryFigures | None = None,
        capacity: RecoveryCapacity | None = None,
        fault_at: float | None = None,
        standby_holders: int = 0,
    ) -> None:
        self._slurm = slurm
        self.node, self.incident_id = node, incident_id
        self.budget_s, self.poll_s = budget_s, poll_s
        self.figures = figures or RecoveryFigures()
        self.capacity = capacity
        self.fault_at = fault_at  # the checkpoints' ages are counted to it (None: now)
        # Standbys held outside the jobs (core/holders.py): only where the policy keeps a
        # pool of them and the client can act on holders.
        self.holders = standby_holders > 0 and isinstance(slurm, SlurmHolderClient)
        self.result = InJobResult()
        self._via: dict[int, SlurmJob] = {}  # job -> the holder on the node that serves it

    async def recover(self) -> InJobResult:
        started, fenced_at = time.monotonic(), time.time()
        # One read on the requeue's hot path: the node's jobs, and those this incident
        # already took the node from (a retry; off the node since), followed, not acted on.
        everyone = await self._slurm.jobs()
        acting = {j.job_id: j for j in everyone if in_job_marked(j, self.incident_id)}
        nodes: dict[str, SlurmNode] | None = None  # read once, for the first capable job
        for job in self._jobs_on_node(everyone):
            if job.job_state not in ACTIVE or job.job_id in acting:
                continue
            if not capable(job, self.node):
                self.result.not_capable.append(job.job_id)
                continue
            if (claimed := requeue_claim(job)) is not None and claimed != self.incident_id:
                # Another incident's fault on the same job is requeueing it (its marker is
                # written before its requeue): that requeue is this fault's too.
                self.result.requeued_elsewhere[job.job_id] = f"being requeued by {claimed}"
                continue
            if nodes is None:  # read once: who else is lost, and what is free (the plan)
                nodes = {n.name: n for n in await self._slurm.nodes()}
            lost = {self.node}
            mine = holders.world(job, everyone) if self.holders else hostlist.expand(job.nodes)
            if job.batch_host != self.node:
                lost |= {n for n in {*hostlist.expand(job.nodes), *mine} if faulty(nodes.get(n))}
            why = why_not_in_place(job, self.node, lost, mine if self.holders else None)
            free = free_nodes(list(nodes.values()), job, self.node)
            at = self.fault_at or time.time()
            plan = plan_for(
                job, why, self.figures, at, capacity=self.capacity, free=free,
                standby_lost=standby(job, self.node),
            )  # fmt: skip
            self.result.plans.append(plan)
            if why is None and plan.chosen != "in-job":
                why = f"the cheaper path: {plan.why}"
            if why is not None:
                # Decided before anything is released or signalled: the job is requeued
                # now, not after a wait that cannot succeed.
                await self._fall_back(job, why)
                continue
            acting[job.job_id] = job
            await self._take_node(job, everyone)
        if self.holders:
            await self._cancel_holders()
        pending = {
            j for j in acting if j not in self.result.fell_back | self.result.requeued_elsewhere
        }
        while pending:
            now = {j.job_id: j for j in await self._slurm.jobs() if j.job_id in pending}
            for job_id in sorted(pending):
                why = self._settled(now.get(job_id), acting[job_id], fenced_at - 1)
                if why is None:
                    continue
                pending.discard(job_id)
                if why == "":
                    self.result.recovered.append(job_id)
                else:
                    self.result.requeued_elsewhere[job_id] = why
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
        if self.holders and self.result.recovered:
            await self._give_holders(self.result.recovered)
        return self.result

    def _jobs_on_node(self, everyone: list[SlurmJob]) -> list[SlurmJob]:
        """The node's jobs; with holders, a holder's place taken by the job it serves."""
        out = []
        for job in everyone:
            if self.node not in hostlist.expand(job.nodes):
                continue
            if self.holders and holders.is_holder(job):
                served = holders.served_by(job, everyone)
                if served is not None:
                    self._via[served.job_id] = job
                    out.append(served)
                continue  # a holder that serves no job is cancelled (_cancel_holders)
            out.append(job)
        return out

    async def _cancel_holders(self) -> None:
        """Holders on the faulty node are never requeued: cancelled (a fence where one
        serves a job whose rank ran there), and a new one comes with the node's return."""
        for job in await self._slurm.jobs_on_node(self.node):
            if not holders.is_holder(job) or job.job_state not in holders.LIVE:
                continue
            if job.job_id in self.result.holders_cancelled:
                continue  # cancelled by the fence, still on its way out
            if await self._end_holder(job.job_id):
                self.result.holders_cancelled.append(job.job_id)

    async def _end_holder(self, holder_id: int) -> bool:
        """Cancel a holder; False where Slurm refused (it ended meanwhile)."""
        try:
            await self._slurm.cancel(holder_id)
        except SlurmUnavailable:
            raise
        except SlurmError:
            return False
        return True

    async def _tell_holders(
        self, job: SlurmJob, everyone: list[SlurmJob], via: SlurmJob | None
    ) -> None:
        """USR2 to the steps of the job's other holders (a survivor may run there). One
        that ended meanwhile has no survivor to tell: its refusal is not the job's."""
        for held in holders.holders_of(job, everyone):
            if via is not None and held.job_id == via.job_id:
                continue
            try:
                await self._slurm.signal_steps(held.job_id, ABANDON_SIGNAL)
            except SlurmUnavailable:
                raise
            except SlurmError:
                continue

    async def _give_holders(self, job_ids: list[int]) -> None:
        """Each job that stepped again without a standby left is given a free holder (its
        claim written first), and told so: SIGUSR2 to its batch shell, which launches a
        standby into it (`srun --jobid=<holder> --overlap`)."""
        assert isinstance(self._slurm, SlurmHolderClient)
        everyone = await self._slurm.jobs()
        lost = {self.node}
        for job in (j for j in everyone if j.job_id in job_ids):
            if not holders.lacks_standby(job, everyone, lost):
                continue
            spare = next(
                (h for h in holders.free(everyone, lost) if h.job_state == "RUNNING"), None
            )
            if spare is None:
                continue  # the pool is empty: the next node returned refills it
            await self._slurm.set_comment(spare.job_id, holders.holder_comment(job))
            await self._slurm.signal_job(job.job_id, ABANDON_SIGNAL)
            self.result.holders_given[job.job_id] = spare.job_id
            everyone = [j for j in everyone if j.job_id != spare.job_id]

    async def _take_node(self, job: SlurmJob, everyone: list[SlurmJob]) -> None:
        """Mark the job, fence the faulty node (release it from the job: Slurm kills the
        job's processes there, once its slurmd answers; or, where the job's rank there runs
        in a holder, cancel the holder), and tell the survivors' processes to abandon their
        group (USR2 to the job's steps, and to those in its other holders; never its batch
        shell). Never waits for the victim: a rank hung in the driver, or a node gone
        silent, frees nobody."""
        await self._slurm.set_admin_comment(
            job.job_id, in_job_marker(self.incident_id, job.restart_cnt)
        )
        others = [n for n in hostlist.expand(job.nodes) if n != self.node]
        via = self._via.get(job.job_id)
        try:
            if via is not None:
                await self._end_holder(via.job_id)  # ended already: so is its step
                self.result.holders_cancelled.append(via.job_id)
            else:
                await self._slurm.shrink_job(job.job_id, others)
            if not standby(job, self.node):
                # A standby's loss is not the training ranks' concern: they keep their group.
                await self._slurm.signal_steps(job.job_id, ABANDON_SIGNAL)
                if self.holders:
                    await self._tell_holders(job, everyone, via)
        except SlurmUnavailable:
            raise  # an outage: the step is retried, and finds its mark
        except SlurmError as refused:
            await self._fall_back(job, f"Slurm refused: {refused}")

    def _settled(self, job: SlurmJob | None, before: SlurmJob, since: float) -> str | None:
        """None: still waiting; "": stepping again without the node; else who requeued it
        (or that it ended), so that it is not requeued again."""
        if job is not None and job.restart_cnt > before.restart_cnt:
            return f"requeued meanwhile (restart {job.restart_cnt}): not again"
        if job is None or job.job_state not in ACTIVE:
            return "ended before it stepped again: not requeued"
        if (claimed := requeue_claim(job)) is not None and claimed != self.incident_id:
            return f"being requeued by {claimed}"
        stepping = (
            standby(before, self.node)
            or (_resumed_since(job, since) and not self._resumed_before_fault(job, before))
            or _reformed(job, before)
        )
        if stepping and self.node not in hostlist.expand(job.nodes):
            return ""
        return None

    def _resumed_before_fault(self, job: SlurmJob, before: SlurmJob) -> bool:
        """Its `resumed_at=` is still the one the runbook read before it acted, and that one
        is older than the incident: the previous generation's first step (a job faulted
        within a second of it sits in the fence's second of slack), not the re-forming. A
        stamp the same as before but after the incident is a re-forming an earlier attempt
        of this step saw."""
        stamp = job_comment(job, "resumed_at")
        if self.fault_at is None or stamp is None or stamp != job_comment(before, "resumed_at"):
            return False
        return not _resumed_since(job, self.fault_at)

    async def _fall_back(self, job: SlurmJob, why: str) -> None:
        """Requeue it, once, as the incident's requeue (the requeue step releases its hold
        and never requeues it again); unless someone else requeued it first."""
        await self._slurm.set_admin_comment(
            job.job_id, requeue_marker(self.incident_id, job.restart_cnt)
        )
        try:
            await self._slurm.requeue(job.job_id)
        except SlurmUnavailable:
            raise
        except SlurmError as refused:
            # Two incidents on one job can decide at once: Slurm requeues it once and
            # refuses the second ("Job is pending execution").
            now = next((j for j in await self._slurm.jobs() if j.job_id == job.job_id), None)
            if now is not None and now.job_state in ACTIVE and now.restart_cnt == job.restart_cnt:
                raise
            self.result.requeued_elsewhere[job.job_id] = f"requeued or ended meanwhile ({refused})"
            return
        self.result.fell_back[job.job_id] = why
