"""Record NodeRemediation histories for the replay test.

Run once per released workflow version, *before* changing the workflow:
    .venv/bin/python -m tests.histories.record v1
It runs the incidents on the time-skipping server against the in-memory cluster and writes
remediation_<version>_<case>.json beside this file.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

from temporalio.client import WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from autoclusters import binpaths
from autoclusters.models import IncidentRequest, workflow_id
from tests.fakes import FakeCloud, FakeSlurm
from workers.remediation import activities_for
from workflows.remediation import NodeRemediation

HERE = Path(__file__).resolve().parent


async def record(version: str) -> None:
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=binpaths.temporal_test_server(),
        data_converter=pydantic_data_converter,
    )
    async with env:
        for case, fail in (("resolved", False), ("repair_failed", True)):
            slurm = FakeSlurm()
            for name in ("gpu-01", "gpu-02"):
                slurm.add_node(name)
            slurm.add_job(101, nodes="gpu-[01-02]")
            cloud = FakeCloud(slurm, fail=fail)
            req = IncidentRequest(
                incident_id=f"INC-{case}",
                cluster="history",
                node="gpu-01",
                fault="XID_79",
                opened_at=datetime(2026, 11, 29, 12, 0, tzinfo=UTC),
            )
            tq = f"tq-{uuid.uuid4()}"
            async with Worker(
                env.client, task_queue=tq, workflows=[NodeRemediation],
                activities=activities_for(slurm, cloud),
            ):  # fmt: skip
                handle = await env.client.start_workflow(
                    NodeRemediation.run, req, id=workflow_id(req.cluster, req.node),
                    task_queue=tq,
                )  # fmt: skip
                try:
                    await handle.result()
                except WorkflowFailureError:
                    pass
                history = await handle.fetch_history()
            out = HERE / f"remediation_{version}_{case}.json"
            out.write_text(history.to_json())
            print(f"wrote {out}")


if __name__ == "__main__":
    asyncio.run(record(sys.argv[1]))
