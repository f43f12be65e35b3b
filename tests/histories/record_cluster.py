"""Record ClusterProvisioning histories for the replay test (tests/workers/test_replay.py).

Run for each release, with the released code (docs/versioning.md):
    .venv/bin/python scripts/record-histories.py 0.1
    .venv/bin/python -m tests.histories.record_cluster 0.1 [case ...]
It provisions clusters on the time-skipping server against the in-memory provider
(tests/fakes/provider.py) and writes cluster_provisioning_<version>_<case>.json beside this file.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from datetime import timedelta
from pathlib import Path

from temporalio.client import WorkflowFailureError
from temporalio.service import RPCError
from temporalio.worker import Worker

from autoclusters.activities.guard import GuardActivities
from autoclusters.core.cluster import ClusterProvisioningInput, provisioning_workflow_id
from autoclusters.core.cluster_spec import parse_cluster_spec
from autoclusters.core.guard import guard_workflow_id
from autoclusters.core.policy import GuardPolicy, Policy
from autoclusters.workers.remediation import WORKFLOWS
from autoclusters.workflows.cluster_provisioning import ClusterProvisioning
from tests.fakes.provider import FakeProvider, feed_agents
from tests.fakes.systems import FakeSlurm
from tests.helpers import time_skipping_env

HERE = Path(__file__).resolve().parent
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICvYBsl/DgCvGh/DMo+nY6kmlyPI24+sT5OvcdsYbW6Q alice@x"
SPEC = """\
name: {name}
provider: sandbox
location: local
accounting: true
login: {{count: 1, ssh_public_keys: ["{key}"]}}
node_sets:
  - {{name: gpu, instance_type: h100-80gb-sxm-ib.8x, count: 4, partition: gpu}}
  - {{name: cpu, instance_type: c1a.16x, count: 1, partition: cpu, gpus_per_node: 0}}
users:
  - {{name: alice, ssh_public_keys: ["{key}"], slurm_account: research}}
"""
CASES = {
    # A boot failure and a gate failure, both replaced; the cluster becomes ready.
    "ready_with_replacements": lambda: FakeProvider(
        boot_failures={"gpu-02": 1}, gate_failures={"gpu-03": 1}
    ),
    # A quota refusal on the fourth machine: everything created is deleted.
    "quota_cleanup": lambda: FakeProvider(machines_allowed=3),
    # Every gate also waits for the node's agent (agent_gate=True); the
    # first report from gpu-02 shows an XID, so its machine is replaced.
    "agent_gate": lambda: FakeProvider(),
}
AGENT_GATE = {"agent_gate"}


async def record(version: str) -> None:
    only = set(sys.argv[2:]) or set(CASES)
    env = await time_skipping_env()
    async with env:
        for case, make in CASES.items():
            if case not in only:
                continue
            cluster = f"history-{case.replace('_', '-')}"
            spec = parse_cluster_spec(SPEC.format(name=cluster, key=KEY))
            policy = Policy(approvers=["alice"], guard=GuardPolicy(max_concurrent_repairs=1))
            provider = make()
            tq = f"tq-{uuid.uuid4()}"
            guard = GuardActivities(
                env.client, FakeSlurm(), tq, execution_timeout=timedelta(days=1)
            )
            async with Worker(
                env.client, task_queue=tq, workflows=WORKFLOWS,
                activities=[*provider.activities(), guard.attach_policy],
            ):  # fmt: skip
                gated = case in AGENT_GATE
                handle = await env.client.start_workflow(
                    ClusterProvisioning.run,
                    ClusterProvisioningInput(spec=spec, policy=policy, agent_gate=gated),
                    id=provisioning_workflow_id(cluster),
                    task_queue=tq,
                    execution_timeout=timedelta(days=1),
                )
                try:
                    if gated:
                        with env.auto_time_skipping_disabled():
                            await feed_agents(env, handle, faulty_first=frozenset({"gpu-02"}))
                    await handle.result()
                except WorkflowFailureError:
                    pass
                history = await handle.fetch_history()
                if case.startswith("ready") or gated:
                    guard_handle = env.client.get_workflow_handle(guard_workflow_id(cluster))
                    with contextlib.suppress(RPCError):  # already timed out: time skipped
                        await guard_handle.terminate()
            out = HERE / f"cluster_provisioning_{version}_{case}.json"
            out.write_text(history.to_json())
            print(f"wrote {out}")


if __name__ == "__main__":
    asyncio.run(record(sys.argv[1]))
