"""ClusterProvisioning on the time-skipping test server, against an in-memory provider.

Aspects covered:
- the happy path: the steps in order (controller, accounting, home, login, machines, boot,
  topology, Slurm, gates, acceptance, users, the policy on a fleet guard this starts), every
  node set reaching all healthy in the `status` query, the rendered topology given to Slurm,
  the acceptance results recorded, the cluster `ready`;
- a machine that fails to boot, and one that fails its gate, is deleted and replaced (same
  node name) and the cluster still becomes ready;
- a slot whose machines all fail exhausts its attempts: the workflow fails naming the node
  and cleans up;
- a quota refusal fails with the provider's message and deletes everything created, newest
  first; with keep_on_failure nothing is deleted;
- a failed acceptance job fails the cluster;
- render_topology (pure): leaves, pods, a root, unplaced nodes, sanitised names.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

import pytest
from temporalio import activity
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from autoclusters.activities.guard import GuardActivities
from autoclusters.core.cluster import (
    ClusterProvisioningInput,
    ClusterState,
    Placement,
    provisioning_workflow_id,
    render_topology,
)
from autoclusters.core.cluster_spec import ClusterSpec, parse_cluster_spec
from autoclusters.core.guard import GuardContext, GuardStatus, guard_workflow_id
from autoclusters.core.policy import GuardPolicy, Policy
from autoclusters.workflows.cluster_provisioning import ClusterProvisioning
from autoclusters.workflows.fleet_guard import FleetGuard
from tests.fakes.provider import QUOTA_MESSAGE, FakeProvider, feed_agents
from tests.fakes.systems import FakeSlurm

pytestmark = pytest.mark.workflow

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICvYBsl/DgCvGh/DMo+nY6kmlyPI24+sT5OvcdsYbW6Q alice@x"
POLICY = Policy(approvers=["alice"], guard=GuardPolicy(max_concurrent_repairs=1))


def spec(name: str, *, keep: bool = False) -> ClusterSpec:
    return parse_cluster_spec(
        f"""\
name: {name}
provider: sandbox
location: local
accounting: true
login: {{count: 1, ssh_public_keys: ["{KEY}"]}}
shared_home: {{size: 10Gi}}
node_sets:
  - {{name: gpu, instance_type: h100-80gb-sxm-ib.8x, count: 4, partition: gpu}}
  - {{name: cpu, instance_type: c1a.16x, count: 1, partition: cpu, gpus_per_node: 0}}
users:
  - {{name: alice, ssh_public_keys: ["{KEY}"], slurm_account: research}}
keep_on_failure: {str(keep).lower()}
"""
    )


Handle = WorkflowHandle[ClusterProvisioning, ClusterState]


@asynccontextmanager
async def provisioning(
    env: WorkflowEnvironment,
    provider: FakeProvider,
    *,
    keep: bool = False,
    attempts: int = 3,
    agent_gate: bool = False,
) -> AsyncIterator[Handle]:
    """Start a provisioning of a fresh cluster on its own worker; end its guard afterwards."""
    cluster = f"c-{uuid.uuid4().hex[:8]}"
    tq = f"tq-{uuid.uuid4()}"
    guard = GuardActivities(env.client, FakeSlurm(), tq, execution_timeout=timedelta(days=1))

    @activity.defn(name="guard_attach_policy")
    async def attach_policy(ctx: GuardContext) -> GuardStatus:
        provider.guard_contexts.append(ctx)  # what the guard was given, then the real call
        return await guard.attach_policy(ctx)

    async with Worker(
        env.client,
        task_queue=tq,
        workflows=[ClusterProvisioning, FleetGuard],
        activities=[*provider.activities(), attach_policy],
    ):
        handle = await env.client.start_workflow(
            ClusterProvisioning.run,
            ClusterProvisioningInput(
                spec=spec(cluster, keep=keep),
                policy=POLICY,
                machine_attempts=attempts,
                agent_gate=agent_gate,  # the gate's agent half: tests below
            ),
            id=provisioning_workflow_id(cluster),
            task_queue=tq,
            execution_timeout=timedelta(days=1),
        )
        try:
            yield handle
        finally:
            guard_handle = env.client.get_workflow_handle(guard_workflow_id(cluster))
            # None was started (a failed provisioning), or it already timed out.
            with contextlib.suppress(RPCError):
                await guard_handle.terminate("test over")


async def _failure(handle: Handle) -> ApplicationError:
    with pytest.raises(WorkflowFailureError) as e:
        await handle.result()
    cause = e.value.cause
    assert isinstance(cause, ApplicationError), cause
    return cause


def _steps(state: ClusterState) -> list[tuple[str, str]]:
    return [(s.name, s.outcome) for s in state.steps]


async def test_a_cluster_is_provisioned_step_by_step(env: WorkflowEnvironment) -> None:
    provider = FakeProvider()
    async with provisioning(env, provider) as handle:
        state = await handle.result()
        queried = await handle.query(ClusterProvisioning.status)
        guard = await env.client.get_workflow_handle(guard_workflow_id(state.cluster)).query(
            FleetGuard.status, result_type=GuardStatus
        )
    assert state.status == "ready" and state.ready_at is not None and state.failure is None
    assert _steps(state) == [
        ("create_controller", "ok"),
        ("create_accounting", "ok"),
        ("create_shared_home", "ok"),
        ("create_login_nodes", "ok"),
        ("boot_machines", "ok"),
        ("register_and_gate", "ok"),
        ("acceptance", "ok"),
        ("add_users", "ok"),
        ("attach_policy", "ok"),
    ]
    calls = provider.calls
    assert calls[:4] == [
        "create_controller",
        "create_accounting",
        "create_shared_home",
        "create_login",
    ]
    nodes = ["gpu-01", "gpu-02", "gpu-03", "gpu-04", "cpu-01"]
    assert {c for c in calls if c.startswith("create_machine")} == {
        f"create_machine {n}#1" for n in nodes
    }
    # Every machine boots before the topology is read; Slurm is configured before any gate;
    # every gate passes before any acceptance job; users and the policy come last.
    first = {c: i for i, c in reversed(list(enumerate(calls)))}
    last_boot = max(i for i, c in enumerate(calls) if c.startswith("boot"))
    assert last_boot < first["discover_topology"] < first["configure_slurm"]
    last_gate = max(i for i, c in enumerate(calls) if c.startswith("gate"))
    assert first["configure_slurm"] < min(i for i, c in enumerate(calls) if c.startswith("gate"))
    assert last_gate < first["acceptance gpu"] < first["add_users"]
    assert first["acceptance cpu"] < first["add_users"]
    # Progress: all healthy, the same in the result and the query.
    for p in (state.progress, queried.progress):
        assert {k: (v.requested, v.booted, v.registered, v.healthy) for k, v in p.items()} == {
            "gpu": (4, 4, 4, 4),
            "cpu": (1, 1, 1, 1),
        }
    assert "gpu: 4 requested, 4 booted, 4 registered, 4 healthy" in state.progress_line()
    # The topology Slurm was given is the rendered tree.
    assert provider.topology_conf == state.topology_conf
    assert state.topology_conf.splitlines()[1:] == [
        "SwitchName=leaf-0 Nodes=cpu-01,gpu-01",
        "SwitchName=leaf-1 Nodes=gpu-02,gpu-03",
        "SwitchName=leaf-2 Nodes=gpu-04",
        "SwitchName=pod-0 Switches=leaf-0,leaf-1",
        "SwitchName=pod-1 Switches=leaf-2",
        "SwitchName=root Switches=pod-0,pod-1",
    ]
    assert [(a.node_set, a.passed) for a in state.acceptance] == [("gpu", True), ("cpu", True)]
    assert state.acceptance[0].nodes == nodes[:4] and state.acceptance[0].job_id
    assert state.users == ["alice"]
    # The cluster's guard runs with the policy and the discovered topology.
    assert state.guard_workflow_id == guard_workflow_id(state.cluster)
    assert guard.policy.max_concurrent_repairs == 1 and guard.approvers == ["alice"]
    (given,) = provider.guard_contexts
    assert given.cluster == state.cluster and guard.cluster == state.cluster
    assert given.topology["gpu-04"].leaf == "leaf-2" and given.topology["gpu-04"].pod == "pod-1"
    assert len(given.topology) == 5
    assert len(provider.alive) == 4 + 5 and not provider.deleted
    assert {r.id for r in state.resources} == set(provider.alive)


async def test_a_machine_that_fails_to_boot_or_its_gate_is_replaced(
    env: WorkflowEnvironment,
) -> None:
    provider = FakeProvider(boot_failures={"gpu-02": 1}, gate_failures={"gpu-03": 1})
    async with provisioning(env, provider) as handle:
        state = await handle.result()
    assert state.status == "ready"
    calls = provider.calls
    # gpu-02's first machine never booted: deleted, a second one created under the same name.
    assert calls.index("boot gpu-02#1") < calls.index("delete machine vm-gpu-02-1")
    assert calls.index("delete machine vm-gpu-02-1") < calls.index("create_machine gpu-02#2")
    assert "gate gpu-02#1" not in calls
    # gpu-03 failed its gate: replaced, Slurm reconfigured with the new machine, gated again.
    i = calls.index("gate gpu-03#1")
    assert i < calls.index("delete machine vm-gpu-03-1") < calls.index("create_machine gpu-03#2")
    assert calls.index("boot gpu-03#2") < len(calls) - 1 - calls[::-1].index("configure_slurm")
    assert "gate gpu-03#2" in calls
    # Nodes that passed are not gated twice.
    assert calls.count("gate gpu-01#1") == 1
    assert state.progress["gpu"].healthy == 4 and state.progress["gpu"].replaced == 2
    assert {r.id for r in state.resources if r.kind == "machine"} == {
        "vm-gpu-01-1", "vm-gpu-02-2", "vm-gpu-03-2", "vm-gpu-04-1", "vm-cpu-01-1",
    }  # fmt: skip
    assert {r.id for r in provider.deleted} == {"vm-gpu-02-1", "vm-gpu-03-1"}


async def test_a_provider_boot_error_and_a_node_that_never_registers_are_replaced(
    env: WorkflowEnvironment,
) -> None:
    provider = FakeProvider(boot_errors={"gpu-01": 1}, unregistered={"cpu-01": 1})
    async with provisioning(env, provider) as handle:
        state = await handle.result()
    assert state.status == "ready"
    calls = provider.calls
    assert calls.index("boot gpu-01#1") < calls.index("create_machine gpu-01#2")
    # cpu-01's first machine booted but its slurmd never registered: no gate, replaced.
    assert "gate cpu-01#1" not in calls
    assert calls.index("delete machine vm-cpu-01-1") < calls.index("gate cpu-01#2")
    assert state.progress["cpu"].healthy == 1 and state.progress["cpu"].replaced == 1
    assert state.progress["gpu"].replaced == 1


async def test_a_slot_out_of_attempts_fails_the_cluster_and_cleans_up(
    env: WorkflowEnvironment,
) -> None:
    provider = FakeProvider(boot_failures={"gpu-04": 5})
    async with provisioning(env, provider, attempts=2) as handle:
        err = await _failure(handle)
        state = await handle.query(ClusterProvisioning.status)
    assert err.type == "MachineAttemptsExhausted"
    assert "node gpu-04 of node set gpu: 2 machines tried" in err.message
    assert "kernel panic on boot" in err.message
    assert "create_machine gpu-04#3" not in provider.calls
    assert state.status == "failed" and state.failure == err.message
    assert not provider.alive and not state.resources
    assert ("cleanup", "ok") in _steps(state)


async def test_a_quota_refusal_fails_with_its_message_and_deletes_everything(
    env: WorkflowEnvironment,
) -> None:
    provider = FakeProvider(machines_allowed=3)
    async with provisioning(env, provider) as handle:
        err = await _failure(handle)
        state = await handle.query(ClusterProvisioning.status)
    assert err.type == "QuotaExceeded" and err.message == QUOTA_MESSAGE
    assert state.status == "failed" and state.failure == QUOTA_MESSAGE
    assert not provider.alive, provider.alive
    assert len(provider.deleted) == 4 + 3
    # Newest first: the machines, then login, home, accounting, controller.
    deletes = [c.split()[1] for c in provider.calls if c.startswith("delete")]
    assert deletes[-4:] == ["login", "shared_home", "accounting", "controller"]
    assert set(deletes[:-4]) == {"machine"}
    assert ("boot_machines", "failed") in _steps(state) and ("cleanup", "ok") in _steps(state)
    assert not any(c.startswith("configure_slurm") for c in provider.calls)


async def test_keep_on_failure_keeps_what_was_created(env: WorkflowEnvironment) -> None:
    provider = FakeProvider(machines_allowed=3)
    async with provisioning(env, provider, keep=True) as handle:
        err = await _failure(handle)
        state = await handle.query(ClusterProvisioning.status)
    assert err.type == "QuotaExceeded" and err.message == QUOTA_MESSAGE
    assert not provider.deleted and len(provider.alive) == 4 + 3
    assert {r.id for r in state.resources} == set(provider.alive)
    assert "cleanup" not in [s.name for s in state.steps]


async def test_a_failed_acceptance_job_fails_the_cluster(env: WorkflowEnvironment) -> None:
    provider = FakeProvider(failing_acceptance={"gpu"})
    async with provisioning(env, provider) as handle:
        err = await _failure(handle)
        state = await handle.query(ClusterProvisioning.status)
    assert err.type == "AcceptanceFailed"
    assert "acceptance job of node set gpu failed: NCCL all-reduce hung" in err.message
    assert [(a.node_set, a.passed) for a in state.acceptance] == [("gpu", False), ("cpu", True)]
    assert not provider.alive


# --- render_topology ----------------------------------------------------------------------


def test_topology_of_one_pod_has_no_root() -> None:
    text = render_topology(
        [
            Placement(node="gpu-02", pod="p", leaf="a"),
            Placement(node="gpu-01", pod="p", leaf="a"),
            Placement(node="gpu-03", pod="p", leaf="b"),
        ]
    )
    assert text.splitlines()[1:] == [
        "SwitchName=a Nodes=gpu-01,gpu-02",
        "SwitchName=b Nodes=gpu-03",
        "SwitchName=p Switches=a,b",
    ]


def test_topology_places_every_node_once() -> None:
    text = render_topology(
        [
            Placement(node="n1", pod="pod 1", leaf="leaf/1"),
            Placement(node="n2"),  # the provider does not know
            Placement(node="n3", leaf="x"),  # a leaf in no pod
            Placement(node="n4", pod="q", leaf="y"),
            Placement(node="n5", pod="r", leaf="y"),  # a leaf claimed by two pods
            Placement(node="n6", pod="root", leaf="root"),  # names that collide
        ]
    )
    lines = text.splitlines()[1:]
    assert lines == [
        "SwitchName=leaf_1 Nodes=n1",
        "SwitchName=root Nodes=n6",
        "SwitchName=unplaced Nodes=n2",
        "SwitchName=x Nodes=n3",
        "SwitchName=y Nodes=n4,n5",
        "SwitchName=pod_1 Switches=leaf_1",
        "SwitchName=pod_root Switches=root",
        "SwitchName=_root Switches=pod_1,pod_root,unplaced,x,y",
    ]
    assert render_topology([]) == ""


# --- the agent's half of the gate ------------------------------------------------------------


async def test_the_gate_waits_for_each_agent_and_a_faulty_report_replaces_the_machine(
    env: WorkflowEnvironment,
) -> None:
    provider = FakeProvider()
    # Real time: the agents answer within the gate's timeout, as on a cluster.
    with env.auto_time_skipping_disabled():
        async with provisioning(env, provider, agent_gate=True) as handle:
            taken = await feed_agents(env, handle, faulty_first=frozenset({"gpu-02"}))
            state = await handle.result()
    assert state.status == "ready", state.failure
    # gpu-02's first machine: its agent saw an XID, so it was replaced and gated again.
    assert taken == {"gpu-01": 1, "gpu-02": 2, "gpu-03": 1, "gpu-04": 1}
    assert {r.id for r in provider.deleted} == {"vm-gpu-02-1"}
    assert state.progress["gpu"].replaced == 1 and state.progress["gpu"].healthy == 4
    # The CPU node set has no GPU agent: Slurm's word is its gate.
    assert state.nodes["cpu-01"] == "healthy"


async def test_a_node_whose_agent_never_reports_fails_its_gate(env: WorkflowEnvironment) -> None:
    provider = FakeProvider()
    async with provisioning(env, provider, attempts=1, agent_gate=True) as handle:
        err = await _failure(handle)
    assert err.type == "MachineAttemptsExhausted"
    assert "no healthy report from" in err.message and "agent within 300s" in err.message
    assert not provider.alive
