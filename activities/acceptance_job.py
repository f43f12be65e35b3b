"""A node set's acceptance job: one batch job on exactly its nodes, in its partition, that
runs one step task per node (`srun hostname`); passed when it COMPLETED on every node.

The job is named after the workflow run and the node set, so a retried activity (a worker
that died while it waited) adopts the job instead of submitting another.
"""

from __future__ import annotations

import asyncio
import time

from autoclusters.core import hostlist
from autoclusters.core.cluster import AcceptanceResult, NodeSetNodes
from autoclusters.core.models import SlurmJob
from autoclusters.integrations.slurm import SlurmBatchClient, SlurmError

# A job in one of these has ended; anything else may still run.
JOB_ENDED = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
        "SPECIAL_EXIT",
        "REVOKED",
    }
)


def acceptance_job_name(run_id: str, node_set: str) -> str:
    """The acceptance job's Slurm name: this workflow run's, for this node set."""
    return f"autoclusters-acceptance-{node_set}-{run_id[:8]}"


async def run_acceptance(
    slurm: SlurmBatchClient, ns: NodeSetNodes, run_id: str, *, poll_s: float, timeout_s: float
) -> AcceptanceResult:
    """Submit (or adopt) the node set's job and wait until it ends; a job still not ended
    after `timeout_s` is cancelled and counts failed. SlurmError: Slurm did not answer."""
    nodes = sorted(ns.nodes)
    name = acceptance_job_name(run_id, ns.name)
    found = await _job_named(slurm, name)
    if found is None:
        job_id = await slurm.submit_batch(
            f"srun -N{len(nodes)} --ntasks-per-node=1 hostname",
            name=name,
            partition=ns.partition,
            nodes=nodes,
            comment=f"autoclusters acceptance of node set {ns.name}",
        )
    else:
        job_id = found.job_id
    job = await _wait_job(slurm, job_id, poll_s=poll_s, timeout_s=timeout_s)
    if job is None:
        return AcceptanceResult(
            node_set=ns.name,
            passed=False,
            detail=f"job {job_id} did not end within {timeout_s:.0f}s (cancelled)",
            job_id=job_id,
        )
    ran = sorted(hostlist.expand(job.nodes)) if job.nodes else []
    missing = [n for n in nodes if n not in ran]
    passed = job.job_state == "COMPLETED" and not missing
    if passed:
        detail = f"job {job_id} COMPLETED on {len(ran)} nodes"
    elif job.job_state != "COMPLETED":
        detail = f"job {job_id} ended {job.job_state} ({job.state_reason or 'no reason'})"
    else:
        detail = f"job {job_id} did not run on {', '.join(missing)}"
    return AcceptanceResult(
        node_set=ns.name, passed=passed, detail=detail, job_id=job_id, nodes=ran
    )


async def _job_named(slurm: SlurmBatchClient, name: str) -> SlurmJob | None:
    mine = [j for j in await slurm.jobs() if j.name == name]
    return max(mine, key=lambda j: j.job_id) if mine else None


async def _wait_job(
    slurm: SlurmBatchClient, job_id: int, *, poll_s: float, timeout_s: float
) -> SlurmJob | None:
    """The job once it ended; None (and cancelled) if it outlived the bound."""
    deadline = time.monotonic() + timeout_s
    while True:
        job = await slurm.job(job_id)
        if job is None:
            raise SlurmError(f"job {job_id} is no longer known to slurmctld")
        if job.job_state in JOB_ENDED:
            return job
        if time.monotonic() >= deadline:
            await slurm.cancel(job_id)
            return None
        await asyncio.sleep(poll_s)
