"""The in-memory world of tests/fakes/sharing.py with a remediation incident's side added,
for GpuSharing's borrowing tests and the recorded borrow history: a fault drains a
training node under an incident (its job requeued, waiting to start), a repair brings it
back, and a resumed node starts the waiting jobs at full width (as Slurm schedules them)."""

from __future__ import annotations

from typing import Any

from temporalio import activity

from autoclusters.core.sharing import Demand, DemandCall, MoveCall, Pool, StepOutcome
from tests.fakes.sharing import Node as N
from tests.fakes.sharing import ShareWorld

OK, HIGH = 0.2, 0.9  # within a 0.5 headroom of the 0.5 SLO; a breach
JOB = 7


class IncidentWorld(ShareWorld):
    """ShareWorld plus what a remediation incident does to Slurm: `fault` drains a node
    under an incident (its job requeued, waiting), `repair` returns it; a resumed node
    starts the waiting jobs (Slurm schedules them)."""

    def __init__(self, nodes: list[N], demand: Any, *, spares: int = 0) -> None:
        super().__init__(nodes, demand, agent=False)
        self.incidents: dict[str, str] = {}
        self.spares = spares

    def fault(self, node: str, incident: str) -> None:
        n = self.nodes[node]
        n.in_incident = True
        self.incidents[node] = incident
        self.pending.extend(j for j in n.jobs if j not in self.pending)
        for other in self.nodes.values():  # the requeue ends the job everywhere
            other.jobs = [j for j in other.jobs if j not in n.jobs]

    def repair(self, node: str) -> None:
        self.nodes[node].in_incident = False
        self.incidents.pop(node, None)

    def width(self, job: int) -> int:
        return sum(1 for n in self.nodes.values() if job in n.jobs)

    @activity.defn(name="share_read_demand")
    async def read_demand(self, call: DemandCall) -> Demand:
        d = await super().read_demand(call)
        return d.model_copy(
            update={
                "nodes": [
                    n.model_copy(
                        update={
                            "incident_id": self.incidents.get(n.name),
                            "incident_fault": "XID_79",
                        }
                    )
                    for n in d.nodes
                ],
                "spares_free": self.spares,
                "pending_jobs": sorted(set(self.pending)),
            }
        )

    @activity.defn(name="share_resume_training")
    async def resume_training(self, call: MoveCall) -> StepOutcome:
        out = await super().resume_training(call)
        # Slurm starts the waiting job on the survivor and the resumed node, full width.
        for job in list(self.pending):
            self.pending.remove(job)
            self.nodes[call.node].jobs.append(job)
            self.nodes["gpu-02"].jobs.append(job)
        return out


def world(demand: Any = (OK,), spares: int = 0) -> IncidentWorld:
    w = IncidentWorld(
        [
            N("gpu-01", jobs=[JOB]),
            N("gpu-02", jobs=[JOB]),
            N("gpu-03", pool=Pool.INFERENCE, pods=1),
            N("gpu-04", pool=Pool.INFERENCE, pods=2),
        ],
        demand,
        spares=spares,
    )
    w.replicas = 2
    return w
