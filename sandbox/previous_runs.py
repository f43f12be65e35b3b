"""A sandbox that comes up again on its old Temporal history closes the runs its previous
life left open, before it provisions its world anew.

`sandbox up` resets the world (a new Slurm cluster, new machines, job ids from 1), so a run
still open from before (an incident, the fleet guard, a provisioning) would act on nodes and
jobs that no longer exist; and a run recorded by an older build may not replay on this one
(0.1 removed the development-era patches: docs/versioning.md). Closed histories stay: they
are the sandbox's record (`incident show` of an earlier incident still works).
"""

from __future__ import annotations

from temporalio.client import Client

REASON = "sandbox came up again: its world was reset, so this run's nodes and jobs are gone"


async def close_previous_runs(client: Client) -> list[str]:
    """Terminate every run still open; returns their workflow ids."""
    closed = []
    async for run in client.list_workflows("ExecutionStatus='Running'"):
        await client.get_workflow_handle(run.id, run_id=run.run_id).terminate(reason=REASON)
        closed.append(run.id)
    return closed
