"""Record NodeRemediation histories for the replay test.

Run once per released workflow version, *before* changing the workflow:
    .venv/bin/python -m tests.histories.record v2 [case ...]
It runs incidents on the time-skipping server against the in-memory cluster and writes
remediation_<version>_<case>.json beside this file.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from autoclusters.models import (
    SPARE_REASON,
    ApprovalRequest,
    IncidentRequest,
    IncidentState,
    workflow_id,
)
from autoclusters.policy import FaultRule, Policy, Rung
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.worker import Worker

from activities.guard import GuardActivities
from tests.fakes import FakeCloud, FakeHealth, FakeSlurm
from tests.helpers import time_skipping_env
from workers.remediation import WORKFLOWS, activities_for
from workflows.remediation import NodeRemediation

HERE = Path(__file__).resolve().parent
POLICY = Policy(
    approvers=["alice"],
    faults={"XID_79": FaultRule(severity="critical", first_rung=Rung.REBOOT)},
)


async def _approve_when_asked(handle: WorkflowHandle[NodeRemediation, IncidentState]) -> None:
    while True:
        state = await handle.query(NodeRemediation.status)
        if state.waiting_for and state.waiting_for.kind == "approval":
            await handle.execute_update(
                NodeRemediation.approve,
                ApprovalRequest(step=state.waiting_for.step or "", approver="alice"),
            )
            return
        await asyncio.sleep(0.05)


async def record(version: str) -> None:
    env = await time_skipping_env()
    async with env:
        cases = {
            "resolved": ("auto", Rung.REBOOT, False),
            "escalated": ("auto", Rung.REPLACE, False),
            "approved": ("approve", Rung.REBOOT, False),
            "repair_failed": ("auto", Rung.REBOOT, True),
            "hot_spare": ("auto", Rung.REPLACE, False),
        }
        only = set(sys.argv[2:]) or set(cases)
        for case, (mode, fixed_by, fail) in cases.items():
            if case not in only:
                continue
            slurm = FakeSlurm()
            for name in ("gpu-01", "gpu-02", "gpu-03", "gpu-04"):
                slurm.add_node(name)
            slurm.add_job(101, nodes="gpu-[01-02]")
            policy = POLICY.model_copy(update={"mode": mode})
            if case == "hot_spare":
                await slurm.drain("gpu-04", SPARE_REASON)
                spares = policy.guard.model_copy(update={"spares": ["gpu-04"]})
                policy = policy.model_copy(update={"guard": spares})
            cloud = FakeCloud(slurm, fail=fail)
            cluster = f"history-{case}"
            req = IncidentRequest(
                incident_id=f"INC-{case}",
                cluster=cluster,
                node="gpu-01",
                fault="XID_79",
                opened_at=datetime(2026, 11, 29, 12, 0, tzinfo=UTC),
                policy=policy,
            )
            tq = f"tq-{uuid.uuid4()}"
            guard = GuardActivities(env.client, slurm, tq, execution_timeout=timedelta(days=1))
            async with Worker(
                env.client, task_queue=tq, workflows=WORKFLOWS,
                activities=activities_for(slurm, cloud, FakeHealth(cloud, fixed_by), guard),
            ):  # fmt: skip
                handle = await env.client.start_workflow(
                    NodeRemediation.run, req, id=workflow_id(req.cluster, req.node),
                    task_queue=tq, execution_timeout=timedelta(days=1),
                )  # fmt: skip
                if mode == "approve":
                    await _approve_when_asked(handle)
                try:
                    await handle.result()
                except WorkflowFailureError:
                    pass
                history = await handle.fetch_history()
                await env.client.get_workflow_handle(f"fleet-guard-{cluster}").terminate()
            out = HERE / f"remediation_{version}_{case}.json"
            out.write_text(history.to_json())
            print(f"wrote {out}")


if __name__ == "__main__":
    asyncio.run(record(sys.argv[1]))
