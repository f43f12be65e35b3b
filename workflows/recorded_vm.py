"""Record the machine before a repair: its VM id goes into the workflow's history.

The repair activity then gets that VM in its input and acts on it alone, and lists the
cloud's operations on it since the plan when a retry lost its heartbeat: idempotency lives
in the history, not on a worker's disk.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.models import PlanRepairInput, RepairInput

from autoclusters.workflows.steps import Steps


async def with_recorded_vm(steps: Steps, inp: RepairInput) -> RepairInput:
    """`inp` with the node's current VM and the time, recorded by `plan_repair`."""
    plan = await steps.call(
        contracts.plan_repair,
        PlanRepairInput(node=inp.node, rung=inp.rung, key=inp.key),
        f"record the VM of {inp.node} before its {inp.rung.value}",
        timeout=timedelta(seconds=60),
    )
    return inp.model_copy(
        update={
            "vm_id": plan.vm_id,
            "planned_at": plan.planned_at,
            "machine_spec": plan.machine_spec,
        }
    )
