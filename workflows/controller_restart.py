"""After the controller came back: what the incident made true in Slurm, checked again.

slurmctld writes its state to its StateSaveLocation in the background, so one killed
without a clean shutdown (the OOM killer, a host failure, a failover) comes back seconds in
the past: without the requeue, or the drain, it had just accepted, or without a job
submitted just before. Before the health gate and before the node goes back, the runbook
compares slurmctld's start with the one it read when it requeued the node's jobs. When it
changed, it re-reads and re-establishes:

- a drain the controller forgot is applied again;
- jobs Slurm places on the node again (a requeue it forgot: the job "runs" on a machine
  that was just reset) are requeued under the same incident marker, so a requeue Slurm
  did record is never done twice (activities/slurm.py), and the node waits until idle;
- a job the incident requeued that Slurm no longer knows is reported, by id, with what a
  person needs to submit it again (the incident's own record of it).

A node Slurm shows busy after its repair is handled the same way, restart seen or not:
it is never returned with a job on it that cannot be running.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.models import (
        ControllerCheck,
        ControllerFacts,
        JobRecord,
        RequeueInput,
    )

from autoclusters.workflows.incident import Incident
from autoclusters.workflows.quarantine_check import Quarantine


class ControllerRestart:
    def __init__(self, incident: Incident, quarantine: Quarantine) -> None:
        self.incident = incident
        self.quarantine = quarantine
        quarantine.on_restart = self.while_waiting  # a restart seen while waiting for idle

    async def while_waiting(self) -> str:
        """The idle wait saw the controller restart (the drain is back already): jobs it
        shows on the node again are requeued, lost ones reported, and the wait goes on."""
        facts = await self._facts()
        return await self._reestablish(facts, restarted=True, wait=False)

    async def recheck(self) -> None:
        """Call after the repair's registration and right before the return."""
        s = self.incident.state
        if not s.controller_started:
            # Not read when the jobs were requeued (a run from before this check, or a
            # Slurm that does not say when its controller started): nothing to compare.
            return
        facts = await self._facts()
        restarted = bool(facts.controller_started) and (
            facts.controller_started != s.controller_started
        )
        if not restarted and not facts.on_node:
            return
        await self.incident.steps.step(
            "recheck_after_restart", lambda: self._reestablish(facts, restarted), lambda d: d
        )

    async def _facts(self) -> ControllerFacts:
        inc = self.incident
        s, r = inc.state, inc.request
        return await inc.steps.ride_out(
            "controller_facts",
            lambda: inc.steps.call(
                contracts.controller_facts,
                ControllerCheck(node=r.node, incident_id=r.incident_id, jobs=s.requeued_jobs),
                f"what Slurm shows now of {r.node} and the jobs requeued from it",
            ),
        )

    async def _reestablish(
        self, facts: ControllerFacts, restarted: bool, *, wait: bool = True
    ) -> str:
        inc = self.incident
        s, r = inc.state, inc.request
        said: list[str] = []
        # Moved on first: the idle wait below compares against it, and must not take this
        # restart for another one.
        s.controller_started = facts.controller_started or s.controller_started
        if restarted:
            said.append(f"the controller restarted (started {facts.controller_started})")
            found = (await self.quarantine.now()).slurm
            if not found.drained and found.restorable:
                await self.quarantine.drain()
                said.append(f"it forgot the drain of {r.node}; drained again")
        cancelled = [j for j in facts.on_node if j in s.cancelled_jobs]
        if cancelled:  # the incident cancelled them: a cancel it forgot is done again
            await self.quarantine.cancel(cancelled)
            said.append(f"forgot the cancel of job(s) {cancelled}; cancelled again")
        if [j for j in facts.on_node if j not in cancelled]:
            again = await inc.steps.call(
                contracts.requeue_jobs,
                RequeueInput(node=r.node, incident_id=r.incident_id),
                f"requeue the jobs Slurm shows on {r.node} after its repair",
            )
            if again.requeued_now:
                what = "forgot the requeue of" if restarted else "shows on the repaired node"
                said.append(f"{what} job(s) {again.requeued_now}; requeued again")
            s.requeued_jobs = sorted({*s.requeued_jobs, *again.requeued})
            known = {j.job_id for j in s.job_records}
            s.job_records += [j for j in again.records if j.job_id not in known]
            if again.came_back:
                await self.quarantine.returned_jobs(again.came_back)
            if again.not_requeueable:
                said.append(f"cannot requeue {again.not_requeueable}")
        if facts.on_node and wait:  # else the idle wait that asked goes on by itself
            await self.quarantine.wait_idle()
        if restarted and facts.unknown:
            lost = self._records(facts.unknown)
            s.vanished_jobs += [j for j in lost if j not in s.vanished_jobs]
            ids = [j.job_id for j in lost]
            said.append(f"job(s) {ids} no longer known to Slurm: reported")
            await inc.notify(
                "jobs_vanished",
                f"the Slurm controller restarted and no longer knows job(s) {ids}, which "
                f"{r.incident_id} requeued from {r.node} (lost with its state, or ended and "
                "purged since): " + "; ".join(f"{j.job_id}: {j.how_to_resubmit()}" for j in lost),
                "critical",
            )
        inc.publish()
        return "; ".join(said)

    def _records(self, job_ids: list[int]) -> list[JobRecord]:
        by_id = {j.job_id: j for j in self.incident.state.job_records}
        return [by_id.get(j, JobRecord(job_id=j)) for j in job_ids]
