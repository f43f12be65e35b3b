"""ClusterProvisioning: a cluster spec in, a Slurm cluster handed to the remediation
runbook out, every step in the history.

Create the controller (and accounting when asked), the shared home and the login nodes;
then every node set's machines in parallel, each waited on until it boots; discover the
InfiniBand placement of every machine and write it as Slurm `topology/tree` configuration;
configure Slurm so every node registers; health-gate every node; run an acceptance job per
node set; add the users; attach the remediation policy to the cluster's fleet guard (which
this starts); mark the cluster ready.

A machine that fails to boot, to register or its gate is deleted and replaced, up to
`machine_attempts` machines per node slot (the slot keeps its Slurm node name). A quota or
capacity refusal fails the workflow with the provider's message; on any failure everything
created is deleted in reverse order unless the spec says `keep_on_failure`.

Progress (requested / booted / registered / healthy per node set) is the `status` query and
the workflow's current details in the Temporal UI.

The provider is reached only through the `cluster_*` activities (activities/contracts.py).
Booting, registering, gating and replacing the machines is workflows/machine_bring_up.py,
shared with ScaleNodeSet; this workflow records each node's progress. The health gate is
the runbook's: Slurm's side is the provider's `cluster_health_gate` (slurmd answers with
all its GPUs), the agent's side a fresh healthy snapshot from the node's own agent since
its machine booted (workflows/agent_gate.py, through this workflow's `health_evidence`
update).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.cluster import (
        AcceptanceCall,
        AcceptanceResult,
        ClusterProvisioningInput,
        ClusterRef,
        ClusterState,
        DeleteCall,
        Machine,
        NodeSetNodes,
        Placement,
        ProviderCall,
        Resource,
        UsersCall,
        UsersResult,
    )
    from autoclusters.core.cluster_spec import NodeSetSpec
    from autoclusters.core.guard import GuardContext, GuardStatus, guard_workflow_id
    from autoclusters.core.models import HealthReport
    from autoclusters.core.policy import NodeTopology
    from autoclusters.integrations import temporal

from autoclusters.workflows.machine_bring_up import MachineBringUp
from autoclusters.workflows.provider_calls import (
    CREATE_TIMEOUT,
    PROVIDER_RETRY,
    SLURM_TIMEOUT,
    fatal_refusal,
)
from autoclusters.workflows.steps import Defaults, OnState, Steps, cause_of

T = TypeVar("T")

ACCEPTANCE_TIMEOUT = timedelta(minutes=30)


class ProvisioningFailed(Exception):
    """Why the cluster cannot become ready: `kind` is the failure's type in the history."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


@workflow.defn(name="ClusterProvisioning")
class ClusterProvisioning(MachineBringUp):
    @workflow.init
    def __init__(self, inp: ClusterProvisioningInput) -> None:
        spec = inp.spec
        self._inp = inp
        self._ref = ClusterRef(name=spec.name, provider=spec.provider, location=spec.location)
        self._state = ClusterState(
            cluster=spec.name,
            provider=spec.provider,
            node_sets={s.name: s.node_names() for s in spec.node_sets},
        )
        self._placements: dict[str, Placement] = {}
        self._steps = Steps(
            OnState(self._state),
            Defaults(SLURM_TIMEOUT, PROVIDER_RETRY),
            show=lambda _: self._show(),
            keep_last=True,
        )
        self._init_bring_up(inp, inp.policy.agent_report_timeout_s, self._steps)

    @workflow.query
    def status(self) -> ClusterState:
        return self._state

    @workflow.run
    async def run(self, inp: ClusterProvisioningInput) -> ClusterState:
        workflow.upsert_search_attributes([temporal.CLUSTER.value_set(inp.spec.name)])
        try:
            await self._provision()
        except (ActivityError, ProvisioningFailed) as e:
            fatal = fatal_refusal(e)
            if fatal is not None:
                kind, message = fatal.type or "ProvisioningFailed", fatal.message
            elif isinstance(e, ProvisioningFailed):
                kind, message = e.kind, str(e)
            else:
                kind, message = "ProvisioningFailed", str(cause_of(e))
            await self._fail(message)
            raise ApplicationError(message, type=kind, non_retryable=True) from None
        self._state.status = "ready"
        self._state.ready_at = workflow.now()
        self._state.current_step = None
        self._show()
        return self._state

    # --- the steps -------------------------------------------------------------------------

    async def _provision(self) -> None:
        spec = self._inp.spec
        call = ProviderCall(cluster=self._ref, spec=spec)
        controller = await self._create(
            "create_controller", contracts.cluster_create_controller, call
        )
        call = call.model_copy(update={"controller": controller})
        if spec.accounting:
            await self._create("create_accounting", contracts.cluster_create_accounting, call)
        await self._create("create_shared_home", contracts.cluster_create_shared_home, call)
        await self._create("create_login_nodes", contracts.cluster_create_login_nodes, call)

        await self._steps.step(
            "boot_machines", self._boot_all, lambda _: self._state.progress_line()
        )
        await self._steps.step(
            "register_and_gate", lambda: self._register_and_gate(sorted(self._machines))
        )
        results = await self._steps.step("acceptance", self._acceptance)
        failed = [r for r in results if not r.passed]
        if failed:
            raise ProvisioningFailed(
                "; ".join(
                    f"acceptance job of node set {r.node_set} failed: {r.detail}" for r in failed
                ),
                "AcceptanceFailed",
            )
        if spec.users:
            added: UsersResult = await self._steps.activity(
                "add_users",
                contracts.cluster_add_users,
                UsersCall(cluster=self._ref, users=spec.users, accounting=spec.accounting),
                f"add users {', '.join(u.name for u in spec.users)} to cluster {self._ref.name}",
                lambda r: ", ".join(r.added),
            )
            self._state.users = added.added
        status: GuardStatus = await self._steps.step("attach_policy", self._attach_policy)
        self._state.guard_workflow_id = guard_workflow_id(status.cluster)

    async def _create(self, step: str, activity: Any, call: ProviderCall) -> Resource:
        res: Resource = await self._steps.activity(
            step,
            activity,
            call,
            f"{step.replace('_', ' ')} of cluster {self._ref.name}",
            lambda r: f"{r.kind} {r.name} ({r.id})",
            timeout=CREATE_TIMEOUT,
        )
        self._state.resources.append(res)
        return res

    # --- machines: the bring-up's hooks (workflows/machine_bring_up.py) --------------------

    async def _boot_all(self) -> None:
        await self._all(
            self._bring_up(node) for s in self._inp.spec.node_sets for node in s.node_names()
        )

    def _spec_of(self, node: str) -> NodeSetSpec:
        name = next(name for name, slots in self._state.node_sets.items() if node in slots)
        return next(s for s in self._inp.spec.node_sets if s.name == name)

    def _slurm_node_sets(self, machines: list[Machine]) -> list[NodeSetNodes]:
        return self._node_set_nodes()  # every slot of the spec has a machine by now

    def _attempts_exhausted(self, node: str, machine: Machine, why: str) -> Exception:
        return ProvisioningFailed(
            f"node {node} of node set {machine.node_set}: {self._attempts[node]} machines "
            f"tried, the last {why}",
            "MachineAttemptsExhausted",
        )

    def _on_created(self, node: str, machine: Machine) -> None:
        self._state.resources.append(machine.resource())
        self._state.nodes[node] = "requested"
        self._show()

    def _on_booted(self, node: str) -> None:
        self._state.nodes[node] = "booted"
        self._show()

    def _on_discarded(self, node: str, machine: Machine) -> None:
        self._state.nodes[node] = "failed"
        self._state.replaced[machine.node_set] = self._state.replaced.get(machine.node_set, 0) + 1
        self._show()

    def _on_topology(self, placements: list[Placement], topology_conf: str) -> None:
        self._placements = {p.node: p for p in placements}
        self._state.topology_conf = topology_conf

    async def _before_gate(self, registered: list[str]) -> None:
        for node in registered:
            self._state.nodes[node] = "registered"
        self._show()

    def _on_gated(self, reports: list[HealthReport]) -> None:
        for report in reports:
            if report.passed:
                self._state.nodes[report.node] = "healthy"
        self._show()

    def _node_set_nodes(self) -> list[NodeSetNodes]:
        return [
            NodeSetNodes(
                name=s.name,
                partition=s.partition,
                gpus_per_node=s.gpus_per_node,
                nodes=self._state.node_sets[s.name],
            )
            for s in self._inp.spec.node_sets
        ]

    # --- acceptance, users, the policy --------------------------------------------------------

    async def _acceptance(self) -> list[AcceptanceResult]:
        calls = [AcceptanceCall(cluster=self._ref, node_set=n) for n in self._node_set_nodes()]
        results: list[AcceptanceResult] = list(
            await asyncio.gather(
                *(
                    self._steps.call(
                        contracts.cluster_acceptance_job,
                        c,
                        f"acceptance job on node set {c.node_set.name} of cluster {self._ref.name}",
                        timeout=ACCEPTANCE_TIMEOUT,
                    )
                    for c in calls
                )
            )
        )
        self._state.acceptance = results
        return results

    async def _attach_policy(self) -> GuardStatus:
        policy = self._inp.policy
        topology = {
            n: NodeTopology(leaf=p.leaf, pod=p.pod)
            for n, p in sorted(self._placements.items())
            if p.leaf or p.pod
        }
        status: GuardStatus = await self._steps.call(
            contracts.guard_attach_policy,
            GuardContext(
                cluster=self._ref.name,
                policy=policy.guard,
                topology=topology,
                approvers=policy.approvers,
            ),
            f"attach the remediation policy to the fleet guard of cluster {self._ref.name}",
            timeout=timedelta(minutes=2),
        )
        return status

    # --- failure ---------------------------------------------------------------------------

    async def _fail(self, message: str) -> None:
        s = self._state
        s.status, s.failure = "failed", message
        self._show()
        if self._inp.spec.keep_on_failure:
            return
        await self._steps.step("cleanup", self._cleanup, lambda _: f"{len(s.deleted)} deleted")

    async def _cleanup(self) -> None:
        """Delete what was created, newest first: the machines (side by side), then the
        login nodes, shared home, accounting and controller. A delete that fails is
        recorded and the rest still go."""
        alive = list(self._state.resources)
        machines = [r for r in alive if r.kind == "machine"]
        await asyncio.gather(*(self._delete(r, cleaning=True) for r in machines))
        for r in reversed([r for r in alive if r.kind != "machine"]):
            await self._delete(r, cleaning=True)

    async def _delete(self, res: Resource, *, cleaning: bool = False) -> None:
        try:
            await self._steps.call(
                contracts.cluster_delete,
                DeleteCall(cluster=self._ref, resource=res),
                f"delete {res.kind} {res.name} ({res.id}) of cluster {self._ref.name}",
                timeout=CREATE_TIMEOUT,
            )
        except ActivityError as e:
            if not cleaning:
                raise
            self._state.cleanup_failures.append(f"{res.kind} {res.id}: {cause_of(e)}")
            return
        self._state.resources = [r for r in self._state.resources if r != res]
        self._state.deleted.append(res)

    # --- recording -------------------------------------------------------------------------

    def _show(self) -> None:
        s = self._state
        workflow.set_current_details(
            f"**{s.cluster}** ({s.provider}): {s.status}, step **{s.current_step or '-'}**\n\n"
            f"{s.progress_line()}" + (f"\n\nfailure: {s.failure}" if s.failure else "")
        )
