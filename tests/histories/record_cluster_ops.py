"""Record ScaleNodeSet and ClusterTeardown histories for the replay test
(tests/workers/test_replay.py).

Run for each release, with the released code (docs/versioning.md):
    .venv/bin/python scripts/record-histories.py 0.1
    .venv/bin/python -m tests.histories.record_cluster_ops 0.1 [case ...]
It runs them on the time-skipping server against the in-memory provider and Slurm
(tests/fakes/ops.py) and writes cluster_ops_<version>_<case>.json beside this file.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.client import WorkflowFailureError
from temporalio.worker import Worker

from autoclusters.activities.cluster_ops import ClusterOpsActivities
from autoclusters.activities.slurm import SlurmActivities
from autoclusters.core.cluster_ops import ScaleNodeSetInput, TeardownInput, ops_workflow_id
from autoclusters.core.cluster_spec import parse_cluster_spec
from autoclusters.workers.remediation import WORKFLOWS
from autoclusters.workflows.cluster_ops import ClusterTeardown, ScaleNodeSet
from tests.fakes.ops import OpsProvider
from tests.fakes.systems import FakeSlurm
from tests.helpers import time_skipping_env

HERE = Path(__file__).resolve().parent
SPEC = """\
name: {name}
provider: sandbox
location: local
accounting: true
node_sets:
  - {{name: gpu, instance_type: h100-80gb-sxm-ib.8x, count: 4, partition: gpu}}
"""


def _busy(slurm: FakeSlurm) -> None:
    for i, node in enumerate(["gpu-01", "gpu-02", "gpu-04"]):
        slurm.add_job(100 + i, nodes=node)
    slurm.add_job(7, nodes="gpu-03")


# case -> (provider options, Slurm set-up, workflow, its input given the spec and cluster ref)
CASES: dict[str, tuple[dict[str, Any], Callable[[FakeSlurm], None], Any, Callable[..., Any]]] = {
    # Up by two, the first machine of gpu-05 does not boot and is replaced.
    "scale_up_replaced": (
        {"boot_failures": {"gpu-05": 1}},
        lambda slurm: None,
        ScaleNodeSet.run,
        # The agents' side of the gate is in cluster_provisioning's agent_gate case.
        lambda spec, ref: ScaleNodeSetInput(spec=spec, node_set="gpu", count=6, agent_gate=False),
    ),
    # Down by one: the least busy node's job is requeued, then its machine deleted.
    "scale_down_requeue": (
        {},
        _busy,
        ScaleNodeSet.run,
        lambda spec, ref: ScaleNodeSetInput(spec=spec, node_set="gpu", count=3),
    ),
    # Everything deleted, a running job cancelled after the grace time.
    "teardown": (
        {},
        _busy,
        ClusterTeardown.run,
        lambda spec, ref: TeardownInput(cluster=ref, grace_s=0),
    ),
}


async def record(version: str) -> None:
    only = set(sys.argv[2:]) or set(CASES)
    env = await time_skipping_env()
    async with env:
        for case, (options, setup, run, make_input) in CASES.items():
            if case not in only:
                continue
            cluster = f"history-{case.replace('_', '-')}"
            spec = parse_cluster_spec(SPEC.format(name=cluster))
            slurm = FakeSlurm()
            provider = OpsProvider(slurm, **options)
            ref = provider.seed(spec)
            setup(slurm)
            s = SlurmActivities(slurm)
            ops = ClusterOpsActivities(env.client, slurm)
            tq = f"tq-{uuid.uuid4()}"
            async with Worker(
                env.client, task_queue=tq, workflows=WORKFLOWS,
                activities=[
                    *provider.activities(), s.drain_node, s.requeue_jobs, s.wait_node_idle,
                    s.return_to_service, ops.node_load, ops.incident_open, ops.workflow_running,
                ],
            ):  # fmt: skip
                handle = await env.client.start_workflow(
                    run,
                    make_input(spec, ref),
                    id=ops_workflow_id(cluster),
                    task_queue=tq,
                    execution_timeout=timedelta(days=1),
                )
                try:
                    await handle.result()
                except WorkflowFailureError:
                    pass
                history = await handle.fetch_history()
            out = HERE / f"cluster_ops_{version}_{case}.json"
            out.write_text(history.to_json())
            print(f"wrote {out}")


if __name__ == "__main__":
    asyncio.run(record(sys.argv[1]))
