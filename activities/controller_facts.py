"""What the incident made true in Slurm, read again: slurmctld writes its state in the
background, so one killed without a clean shutdown (OOM, a host failure, a failover) comes
back seconds in the past, without the requeue or the drain it had just accepted. The runbook
compares the controller's start with the one it saw when it requeued
(workflows/controller_restart.py); this reads what it needs to decide."""

from __future__ import annotations

from temporalio import activity

from autoclusters.activities.heartbeat import heartbeating
from autoclusters.activities.job_markers import BUSY
from autoclusters.core import hostlist
from autoclusters.core.models import ControllerCheck, ControllerFacts
from autoclusters.integrations.slurm import SlurmClient


class ControllerActivities:
    def __init__(self, slurm: SlurmClient) -> None:
        self._slurm = slurm

    @activity.defn(name="controller_facts")
    async def controller_facts(self, inp: ControllerCheck) -> ControllerFacts:
        async with heartbeating(f"controller_facts {inp.node}"):
            started = await self._slurm.controller_started()
            jobs = await self._slurm.jobs()  # one read: a failed one raises, never "none"
        known = {j.job_id for j in jobs}
        return ControllerFacts(
            controller_started=started,
            on_node=[
                j.job_id
                for j in jobs
                if j.job_state in BUSY and inp.node in hostlist.expand(j.nodes)
            ],
            unknown=[j for j in inp.jobs if j not in known],
        )
