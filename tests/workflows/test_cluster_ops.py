"""ScaleNodeSet and ClusterTeardown on the time-skipping test server, against the in-memory
provider wired to a FakeSlurm (tests/fakes/ops.py) and the real Slurm activities.

Aspects covered:
- scale up: the new nodes register drained, are gated drained and only then returned to
  service; a machine that fails to boot is deleted and replaced;
- scale down: an idle node is chosen before busy ones; a node running a checkpointing job
  has the job requeued exactly once (even when the requeue call fails after its side
  effect) and its machine deleted only once the node is idle; in `wait` mode the job is not
  requeued and the machine waits for it to end;
- teardown: machines, then login, home, accounting, controller; jobs cancelled after the
  grace time, none requeued; a delete retried after its side effect and a re-run delete
  nothing twice and succeed;
- one owner per node: a scale is refused while the cluster's provisioning runs; a node with
  an open remediation incident is not touched by a scale down; the drain activity keeps a
  scale's drain when an incident asks for its own, and the runbook ends such an incident
  `rejected`, the node left as the scale drained it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from autoclusters.activities.cluster_ops import ClusterOpsActivities
from autoclusters.activities.slurm import SlurmActivities
from autoclusters.core.cluster import provisioning_workflow_id
from autoclusters.core.cluster_ops import (
    OpsState,
    ScaleNodeSetInput,
    TeardownInput,
    is_ops_reason,
    ops_workflow_id,
)
from autoclusters.core.cluster_spec import ClusterSpec, parse_cluster_spec
from autoclusters.core.models import DrainInput, workflow_id
from autoclusters.workflows.cluster_ops import ClusterTeardown, ScaleNodeSet
from tests.fakes.ops import OpsProvider
from tests.fakes.systems import FakeSlurm

# The sandbox re-imports this module (it defines workflows); tests.helpers reads the
# settings, which look at the home directory on import: the sandbox's import refuses that.
with workflow.unsafe.imports_passed_through():
    from tests.helpers import eventually

pytestmark = pytest.mark.workflow


def spec(name: str) -> ClusterSpec:
    return parse_cluster_spec(
        f"""\
name: {name}
provider: sandbox
location: local
accounting: true
node_sets:
  - {{name: gpu, instance_type: h100-80gb-sxm-ib.8x, count: 4, partition: gpu}}
  - {{name: cpu, instance_type: c1a.16x, count: 1, partition: cpu, gpus_per_node: 0}}
"""
    )


@workflow.defn(name="NodeRemediation")
class OpenIncident:
    """Stands in for an incident that is open on a node (its workflow id is the node's)."""

    @workflow.run
    async def run(self, _: Any) -> None:
        await workflow.wait_condition(lambda: False)


@workflow.defn(name="ClusterProvisioning")
class StillProvisioning:
    """Stands in for the cluster's provisioning, still running."""

    @workflow.run
    async def run(self, _: Any) -> None:
        await workflow.wait_condition(lambda: False)


class Cluster:
    def __init__(self, env: WorkflowEnvironment, slurm: FakeSlurm, provider: OpsProvider) -> None:
        self.env, self.slurm, self.provider = env, slurm, provider
        self.spec = spec(f"c-{uuid.uuid4().hex[:8]}")
        self.ref = provider.seed(self.spec)
        self.tq = f"tq-{uuid.uuid4()}"

    async def scale(self, count: int, **kw: Any) -> Any:
        return await self.env.client.start_workflow(
            ScaleNodeSet.run,
            # The gate's agent half is ClusterProvisioning's tests' (the same mixin).
            ScaleNodeSetInput(spec=self.spec, node_set="gpu", count=count, agent_gate=False, **kw),
            id=ops_workflow_id(self.spec.name),
            task_queue=self.tq,
            execution_timeout=timedelta(days=1),
        )

    async def teardown(self, **kw: Any) -> Any:
        return await self.env.client.start_workflow(
            ClusterTeardown.run,
            TeardownInput(cluster=self.ref, **kw),
            id=ops_workflow_id(self.spec.name),
            task_queue=self.tq,
            execution_timeout=timedelta(days=1),
        )


async def stop(handle: WorkflowHandle[Any, Any]) -> None:
    """Terminate a stand-in workflow the test started, unless it is already closed (the
    time-skipping server closed one under a loaded machine: terminate then answers
    NOT_FOUND, "Completed workflow", and the test's own assertions never ran)."""
    try:
        await handle.terminate("test over")
    except RPCError as e:
        if e.status != RPCStatusCode.NOT_FOUND:
            raise


@asynccontextmanager
async def cluster(
    env: WorkflowEnvironment, *, slurm: FakeSlurm | None = None, **kw: Any
) -> AsyncIterator[Cluster]:
    slurm = slurm or FakeSlurm()
    c = Cluster(env, slurm, OpsProvider(slurm, **kw))
    s = SlurmActivities(slurm)
    ops = ClusterOpsActivities(env.client, slurm)
    async with Worker(
        env.client,
        task_queue=c.tq,
        workflows=[ScaleNodeSet, ClusterTeardown, OpenIncident, StillProvisioning],
        activities=[
            *c.provider.activities(),
            s.drain_node,
            s.requeue_jobs,
            s.wait_node_idle,
            s.return_to_service,
            ops.node_load,
            ops.incident_open,
            ops.workflow_running,
        ],
    ):
        yield c


def _deleted_vms(p: OpsProvider) -> list[str]:
    return [r.id for r in p.deleted]


async def test_scale_up_gates_new_nodes_drained_and_replaces_a_failed_boot(
    env: WorkflowEnvironment,
) -> None:
    async with cluster(env, boot_failures={"gpu-05": 1}) as c:
        state: OpsState = await (await c.scale(6)).result()
    p, slurm = c.provider, c.slurm
    assert state.status == "done" and state.added == ["gpu-05", "gpu-06"]
    # gpu-05's first machine did not boot: deleted, replaced under the same name.
    assert p.calls.index("boot gpu-05#1") < p.calls.index("delete machine vm-gpu-05-1")
    assert p.calls.index("delete machine vm-gpu-05-1") < p.calls.index("create_machine gpu-05#2")
    assert state.replaced == 1 and _deleted_vms(p) == ["vm-gpu-05-1"]
    # Every gate ran while the node was drained; nothing was undrained before its gate.
    assert p.gated_drained == {"gpu-05#2": True, "gpu-06#1": True}
    drains = [(w, n) for w, n in slurm.log if n in ("gpu-05", "gpu-06")]
    assert drains[-2:] == [("resume", "gpu-05"), ("resume", "gpu-06")]
    for n in ("gpu-05", "gpu-06"):
        now = slurm.node_now(n)
        assert not now.drained and now.reason == ""
    # The existing nodes were left alone.
    assert not [w for w, n in slurm.log if n in ("gpu-01", "gpu-02", "gpu-03", "gpu-04")]


async def test_scale_down_picks_the_idle_node_first(env: WorkflowEnvironment) -> None:
    async with cluster(env) as c:
        for i, node in enumerate(["gpu-01", "gpu-03", "gpu-04"]):
            c.slurm.add_job(100 + i, nodes=node)
        state: OpsState = await (await c.scale(3)).result()
    assert state.removed == ["gpu-02"] and _deleted_vms(c.provider) == ["vm-gpu-02-1"]
    assert not c.slurm.requeue_count and state.requeued == []
    assert c.provider.busy_at_delete == {"gpu-02": []}
    assert "gpu-02" not in {n.name for n in await c.slurm.nodes()}


async def test_scale_down_requeues_a_checkpointing_job_once_then_deletes(
    env: WorkflowEnvironment,
) -> None:
    slurm = FakeSlurm(fail_after_requeue_once=True)  # the requeue "fails" after it happened
    async with cluster(env, slurm=slurm) as c:
        for i, node in enumerate(["gpu-01", "gpu-02", "gpu-04"]):
            slurm.add_job(100 + i, nodes=node)
            slurm.add_job(200 + i, nodes=node)
        slurm.add_job(7, nodes="gpu-03", name="checkpointing-train")
        state: OpsState = await (await c.scale(3)).result()
    assert state.removed == ["gpu-03"] and state.requeued == [7]
    assert slurm.requeue_count == {7: 1}  # exactly once, despite the retried call
    job = slurm.job_now(7)
    assert job.job_state == "PENDING" and job.admin_comment.startswith(
        f"autoclusters:requeue:{state.key}:"
    )
    # The machine went only once the node ran nothing.
    assert c.provider.busy_at_delete == {"gpu-03": []}
    assert _deleted_vms(c.provider) == ["vm-gpu-03-1"]


async def test_scale_down_in_wait_mode_waits_for_the_job(env: WorkflowEnvironment) -> None:
    async with cluster(env) as c:
        slurm = c.slurm
        for i, node in enumerate(["gpu-01", "gpu-02", "gpu-04"]):
            slurm.add_job(100 + i, nodes=node)
            slurm.add_job(200 + i, nodes=node)
        slurm.add_job(7, nodes="gpu-03")
        handle = await c.scale(3, jobs="wait", idle_timeout_s=1)

        async def drained_and_waiting() -> bool:
            state = await handle.query(ScaleNodeSet.status)
            return state.current_step == "remove_nodes" and slurm.node_now("gpu-03").drained

        await eventually(drained_and_waiting, what="gpu-03 drained, its job waited on")
        assert is_ops_reason(slurm.node_now("gpu-03").reason)
        assert "vm-gpu-03-1" in c.provider.alive  # not deleted under its running job
        slurm.finish_job(7)
        state: OpsState = await handle.result()
    assert state.removed == ["gpu-03"] and not slurm.requeue_count
    assert slurm.job_now(7).job_state == "COMPLETED"
    assert c.provider.busy_at_delete == {"gpu-03": []}


async def test_teardown_deletes_in_reverse_order_requeues_nothing_and_reruns(
    env: WorkflowEnvironment,
) -> None:
    async with cluster(env) as c:
        c.slurm.add_job(7, nodes="gpu-01")
        c.provider.fail_after_delete = {"machine", "shared_home"}  # retried after the fact
        state: OpsState = await (await c.teardown(grace_s=0)).result()
        assert state.status == "done"
        deleted = [r.kind for r in state.deleted]
        assert deleted[:5] == ["machine"] * 5
        assert deleted[5:] == ["login", "shared_home", "accounting", "controller"]
        assert not c.provider.alive and not c.slurm.requeue_count
        ids = [r.id for r in c.provider.deleted]
        assert len(ids) == len(set(ids)) == 9  # each deleted once, the retries found it gone
        assert sum(x.startswith("delete shared_home") for x in c.provider.calls) == 2
        assert c.slurm.job_now(7).job_state == "CANCELLED"
        assert all(is_ops_reason(n.reason) for n in await c.slurm.nodes())
        before = list(c.provider.deleted)
        again: OpsState = await (await c.teardown()).result()
    assert again.status == "done" and again.deleted == []
    assert c.provider.deleted == before


async def test_a_node_with_an_open_incident_is_not_touched(env: WorkflowEnvironment) -> None:
    async with cluster(env) as c:
        incident = await env.client.start_workflow(
            "NodeRemediation",
            None,
            id=workflow_id(c.spec.name, "gpu-04"),
            task_queue=c.tq,
        )
        try:
            state: OpsState = await (await c.scale(3)).result()
        finally:
            await stop(incident)
    # gpu-04 (idle, the newest) would have gone first; its incident owns it.
    assert "gpu-04" in state.skipped and state.removed == ["gpu-03"]
    assert not c.slurm.node_now("gpu-04").drained
    assert "vm-gpu-04-1" in c.provider.alive


async def test_a_cluster_still_being_provisioned_is_not_scaled(env: WorkflowEnvironment) -> None:
    async with cluster(env) as c:
        provisioning = await env.client.start_workflow(
            "ClusterProvisioning", None, id=provisioning_workflow_id(c.spec.name), task_queue=c.tq
        )
        try:
            with pytest.raises(WorkflowFailureError) as caught:
                await (await c.scale(2)).result()
        finally:
            await stop(provisioning)
    cause = caught.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "ClusterBusy"
    assert c.provider.calls == [] and not c.slurm.log


async def test_an_incident_leaves_a_node_drained_by_a_scale() -> None:
    slurm = FakeSlurm()
    slurm.add_node("gpu-01", state_flags=["DRAIN"], reason="autoclusters: cluster-ops-c-1 X")
    r = await SlurmActivities(slurm).drain_node(
        DrainInput(node="gpu-01", reason="autoclusters: inc-1 XID_79")
    )
    assert r.already_drained and is_ops_reason(r.previous_reason)
    assert slurm.node_now("gpu-01").reason == "autoclusters: cluster-ops-c-1 X"


async def test_the_runbook_leaves_alone_a_node_a_scale_drained(env: WorkflowEnvironment) -> None:
    # Imported here: this module defines a workflow, which the sandbox re-imports.
    from tests.workflows.test_remediation_workflow import _fleet

    reason = "autoclusters: cluster-ops-c-1-abcd1234 SCALE_DOWN"
    async with _fleet(env) as f:
        f.slurm.set_reason("gpu-01", reason)
        result = await (await f.start(f.request())).result()
    assert result.status == "rejected"
    assert f.slurm.node_now("gpu-01").reason == reason
    assert not f.slurm.requeue_count and f.slurm.calls["resume"] == 0
    assert f.cloud.repair_calls == []
