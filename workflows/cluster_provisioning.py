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
The health gate is the runbook's: Slurm's side is the provider's `cluster_health_gate`
(slurmd answers with all its GPUs), the agent's side a fresh healthy snapshot from the
node's own agent since its machine booted (workflows/agent_gate.py, through this
workflow's `health_evidence` update).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.cluster import (
        BOOT_FAILED,
        FATAL_PROVIDER_ERRORS,
        AcceptanceCall,
        AcceptanceResult,
        BootResult,
        ClusterProvisioningInput,
        ClusterRef,
        ClusterState,
        DeleteCall,
        Machine,
        MachineCall,
        NodeGateCall,
        NodeSetNodes,
        Placement,
        ProviderCall,
        Resource,
        SlurmConfigCall,
        SlurmConfigResult,
        TopologyCall,
        UsersCall,
        UsersResult,
        render_topology,
    )
    from autoclusters.core.cluster_spec import NodeSetSpec
    from autoclusters.core.guard import GuardContext, GuardStatus, guard_workflow_id
    from autoclusters.core.models import HealthCheck, HealthReport, StepRecord
    from autoclusters.core.policy import NodeTopology
    from autoclusters.integrations import temporal

from autoclusters.workflows.agent_gate import CLUSTER_AGENT_GATE, AgentGate
from autoclusters.workflows.timeline import HEARTBEAT, cause_of

T = TypeVar("T")

# Provider and Slurm calls fail transiently (API busy, 429s); a refusal for quota or
# capacity, or a machine the provider says will not boot, does not.
PROVIDER_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
    non_retryable_error_types=[*FATAL_PROVIDER_ERRORS, BOOT_FAILED, "BadCredentials"],
)
CREATE_TIMEOUT = timedelta(minutes=30)
SLURM_TIMEOUT = timedelta(minutes=15)
GATE_TIMEOUT = timedelta(minutes=10)
ACCEPTANCE_TIMEOUT = timedelta(minutes=30)


class ProvisioningFailed(Exception):
    """Why the cluster cannot become ready: `kind` is the failure's type in the history."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def _fatal(err: BaseException) -> ApplicationError | None:
    cause = cause_of(err)
    if isinstance(cause, ApplicationError) and cause.type in FATAL_PROVIDER_ERRORS:
        return cause
    return None


@workflow.defn(name="ClusterProvisioning")
class ClusterProvisioning(AgentGate):
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
        self._machines: dict[str, Machine] = {}
        self._attempts: dict[str, int] = {}
        self._placements: dict[str, Placement] = {}
        self._booted_at: dict[str, datetime] = {}
        self._init_agent_gate()

    @workflow.query
    def status(self) -> ClusterState:
        return self._state

    @workflow.run
    async def run(self, inp: ClusterProvisioningInput) -> ClusterState:
        workflow.upsert_search_attributes([temporal.CLUSTER.value_set(inp.spec.name)])
        try:
            await self._provision()
        except (ActivityError, ProvisioningFailed) as e:
            fatal = _fatal(e)
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

        await self._step("boot_machines", self._boot_all, lambda _: self._state.progress_line())
        await self._step("register_and_gate", self._register_and_gate)
        results = await self._step("acceptance", self._acceptance)
        failed = [r for r in results if not r.passed]
        if failed:
            raise ProvisioningFailed(
                "; ".join(
                    f"acceptance job of node set {r.node_set} failed: {r.detail}" for r in failed
                ),
                "AcceptanceFailed",
            )
        if spec.users:
            added: UsersResult = await self._step(
                "add_users",
                lambda: workflow.execute_activity(
                    contracts.cluster_add_users,
                    UsersCall(cluster=self._ref, users=spec.users, accounting=spec.accounting),
                    start_to_close_timeout=SLURM_TIMEOUT,
                    heartbeat_timeout=HEARTBEAT,
                    retry_policy=PROVIDER_RETRY,
                ),
                lambda r: ", ".join(r.added),
            )
            self._state.users = added.added
        status: GuardStatus = await self._step("attach_policy", self._attach_policy)
        self._state.guard_workflow_id = guard_workflow_id(status.cluster)

    async def _create(self, step: str, activity: Any, call: ProviderCall) -> Resource:
        res: Resource = await self._step(
            step,
            lambda: workflow.execute_activity(
                activity,
                call,
                start_to_close_timeout=CREATE_TIMEOUT,
                heartbeat_timeout=HEARTBEAT,
                retry_policy=PROVIDER_RETRY,
            ),
            lambda r: f"{r.kind} {r.name} ({r.id})",
        )
        self._state.resources.append(res)
        return res

    # --- machines --------------------------------------------------------------------------

    async def _boot_all(self) -> None:
        slots = [(s, node) for s in self._inp.spec.node_sets for node in s.node_names()]
        await self._all(self._bring_up(s, node) for s, node in slots)

    async def _all(self, tasks: Any) -> None:
        """Run side by side and let every one finish (nothing is left creating a machine
        while the cluster is cleaned up); then raise the first fatal refusal, else the first
        failure."""
        results = await asyncio.gather(*tasks, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        for err in errors:
            if _fatal(err) is not None:
                raise err
        if errors:
            raise errors[0]

    async def _bring_up(self, node_set: NodeSetSpec, node: str) -> None:
        """Create the slot's machine and wait until it boots; replace it until it does."""
        while True:
            machine = await self._create_machine(node_set, node)
            boot = await self._wait_booted(machine)
            if boot.booted:
                self._state.nodes[node] = "booted"
                self._booted_at[node] = workflow.now()
                self._show()
                return
            await self._discard(node, f"did not boot: {boot.detail}")

    async def _create_machine(self, node_set: NodeSetSpec, node: str) -> Machine:
        attempt = self._attempts.get(node, 0) + 1
        self._attempts[node] = attempt
        machine: Machine = await workflow.execute_activity(
            contracts.cluster_create_machine,
            MachineCall(cluster=self._ref, node_set=node_set, node=node, attempt=attempt),
            start_to_close_timeout=CREATE_TIMEOUT,
            heartbeat_timeout=HEARTBEAT,
            retry_policy=PROVIDER_RETRY,
            summary=f"create {node} (attempt {attempt})",
        )
        self._machines[node] = machine
        self._state.resources.append(machine.resource())
        self._state.nodes[node] = "requested"
        self._show()
        return machine

    async def _wait_booted(self, machine: Machine) -> BootResult:
        return await wait_booted(machine, self._inp.boot_timeout_s)

    async def _discard(self, node: str, why: str) -> None:
        """Delete the slot's machine; fail the cluster when the slot has no attempts left."""
        machine = self._machines.pop(node)
        self._state.nodes[node] = "failed"
        self._state.replaced[machine.node_set] = self._state.replaced.get(machine.node_set, 0) + 1
        self._show()
        await self._delete(machine.resource())
        if self._attempts[node] >= self._inp.machine_attempts:
            raise ProvisioningFailed(
                f"node {node} of node set {machine.node_set}: {self._attempts[node]} machines "
                f"tried, the last {why}",
                "MachineAttemptsExhausted",
            )
        workflow.logger.warning("replacing %s (%s): %s", node, machine.machine_id, why)

    async def _replace(self, node: str, why: str) -> None:
        await self._discard(node, why)
        node_set = next(s for s in self._inp.spec.node_sets if s.name == self._set_of(node))
        await self._bring_up(node_set, node)

    def _set_of(self, node: str) -> str:
        return next(name for name, slots in self._state.node_sets.items() if node in slots)

    # --- Slurm: topology, registration, the gate ---------------------------------------------

    async def _register_and_gate(self) -> None:
        healthy: set[str] = set()
        while True:
            await self._discover_topology()
            registered = await self._configure_slurm()
            for node in registered & set(self._machines):
                if node not in healthy:
                    self._state.nodes[node] = "registered"
            self._show()
            failed = {
                n: "did not register with slurmctld" for n in self._machines if n not in registered
            }
            pending = sorted(n for n in registered & set(self._machines) if n not in healthy)
            reports = await asyncio.gather(*(self._gate(n) for n in pending))
            for report in reports:
                if report.passed:
                    healthy.add(report.node)
                    self._state.nodes[report.node] = "healthy"
                else:
                    failed[report.node] = f"failed its health gate: {report.failures()}"
            self._show()
            if not failed:
                return
            await self._all(self._replace(n, why) for n, why in sorted(failed.items()))

    async def _discover_topology(self) -> None:
        machines = [self._machines[n] for n in sorted(self._machines)]
        found: list[Placement] = await workflow.execute_activity(
            contracts.cluster_discover_topology,
            TopologyCall(cluster=self._ref, machines=machines),
            start_to_close_timeout=SLURM_TIMEOUT,
            heartbeat_timeout=HEARTBEAT,
            retry_policy=PROVIDER_RETRY,
        )
        by_node = {p.node: p for p in found}
        self._placements = {n: by_node.get(n, Placement(node=n)) for n in self._machines}
        self._state.topology_conf = render_topology(
            [self._placements[n] for n in sorted(self._placements)]
        )

    async def _configure_slurm(self) -> set[str]:
        result: SlurmConfigResult = await workflow.execute_activity(
            contracts.cluster_configure_slurm,
            SlurmConfigCall(
                cluster=self._ref,
                node_sets=self._node_set_nodes(),
                machines=[self._machines[n] for n in sorted(self._machines)],
                topology_conf=self._state.topology_conf,
                accounting=self._inp.spec.accounting,
            ),
            start_to_close_timeout=SLURM_TIMEOUT,
            heartbeat_timeout=HEARTBEAT,
            retry_policy=PROVIDER_RETRY,
        )
        return set(result.registered)

    async def _gate(self, node: str) -> HealthReport:
        machine = self._machines[node]
        gpus = next(s.gpus_per_node for s in self._inp.spec.node_sets if s.name == machine.node_set)
        try:
            report: HealthReport = await workflow.execute_activity(
                contracts.cluster_health_gate,
                NodeGateCall(cluster=self._ref, machine=machine, expected_gpus=gpus),
                start_to_close_timeout=GATE_TIMEOUT,
                heartbeat_timeout=HEARTBEAT,
                retry_policy=PROVIDER_RETRY,
                summary=f"health gate {node}",
            )
        except ActivityError as e:
            if _fatal(e) is not None:
                raise
            return HealthReport(node=node, passed=False, checks=[_check("gate", str(cause_of(e)))])
        if report.passed and self._inp.agent_gate and workflow.patched(CLUSTER_AGENT_GATE):
            since = self._booted_at.get(node, workflow.info().start_time)
            timeout = self._inp.policy.agent_report_timeout_s
            checks = await self._agent_gate(node, since, gpus, timeout)
            report = with_agent_checks(report, checks)
        return report

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
                    workflow.execute_activity(
                        contracts.cluster_acceptance_job,
                        c,
                        start_to_close_timeout=ACCEPTANCE_TIMEOUT,
                        heartbeat_timeout=HEARTBEAT,
                        retry_policy=PROVIDER_RETRY,
                        summary=f"acceptance job on {c.node_set.name}",
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
        status: GuardStatus = await workflow.execute_activity(
            contracts.guard_attach_policy,
            GuardContext(
                cluster=self._ref.name,
                policy=policy.guard,
                topology=topology,
                approvers=policy.approvers,
            ),
            start_to_close_timeout=timedelta(minutes=2),
            heartbeat_timeout=HEARTBEAT,
            retry_policy=PROVIDER_RETRY,
        )
        return status

    # --- failure ---------------------------------------------------------------------------

    async def _fail(self, message: str) -> None:
        s = self._state
        s.status, s.failure = "failed", message
        self._show()
        if self._inp.spec.keep_on_failure:
            return
        await self._step("cleanup", self._cleanup, lambda _: f"{len(s.deleted)} deleted")

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
            await workflow.execute_activity(
                contracts.cluster_delete,
                DeleteCall(cluster=self._ref, resource=res),
                start_to_close_timeout=CREATE_TIMEOUT,
                heartbeat_timeout=HEARTBEAT,
                retry_policy=PROVIDER_RETRY,
                summary=f"delete {res.kind} {res.name} ({res.id})",
            )
        except ActivityError as e:
            if not cleaning:
                raise
            self._state.cleanup_failures.append(f"{res.kind} {res.id}: {cause_of(e)}")
            return
        self._state.resources = [r for r in self._state.resources if r != res]
        self._state.deleted.append(res)

    # --- recording -------------------------------------------------------------------------

    async def _step(
        self,
        name: str,
        run: Callable[[], Awaitable[T]],
        detail: Callable[[T], str] | None = None,
    ) -> T:
        rec = StepRecord(name=name, started_at=workflow.now())
        self._state.steps.append(rec)
        self._state.current_step = name
        self._show()
        try:
            out = await run()
        except GeneratorExit:
            raise  # evicted from the worker's cache: not the step's outcome
        except BaseException as e:
            rec.outcome, rec.finished_at, rec.detail = "failed", workflow.now(), str(cause_of(e))
            raise
        rec.outcome, rec.finished_at = "ok", workflow.now()
        rec.detail = detail(out) if detail else ""
        return out

    def _show(self) -> None:
        s = self._state
        workflow.set_current_details(
            f"**{s.cluster}** ({s.provider}): {s.status}, step **{s.current_step or '-'}**\n\n"
            f"{s.progress_line()}" + (f"\n\nfailure: {s.failure}" if s.failure else "")
        )


def with_agent_checks(report: HealthReport, checks: list[HealthCheck]) -> HealthReport:
    """Slurm's report with the agent's checks added: passed only if every check did."""
    both = [*report.checks, *checks]
    return report.model_copy(update={"checks": both, "passed": all(c.passed for c in both)})


def _check(name: str, detail: str) -> HealthCheck:
    return HealthCheck(name=name, passed=False, detail=detail)


async def wait_booted(machine: Machine, boot_timeout_s: float) -> BootResult:
    """Until `machine` boots; a hang past the timeout or a provider's failure is an answer
    (booted=False: replace it), only a fatal error (quota, capacity) raises. Shared by
    provisioning and scaling."""
    try:
        result: BootResult = await workflow.execute_activity(
            contracts.cluster_wait_booted,
            machine,
            start_to_close_timeout=timedelta(seconds=boot_timeout_s),
            heartbeat_timeout=HEARTBEAT,
            retry_policy=PROVIDER_RETRY,
            summary=f"wait for {machine.node} ({machine.machine_id}) to boot",
        )
    except ActivityError as e:
        if _fatal(e) is not None:
            raise
        return BootResult(booted=False, detail=str(cause_of(e)))
    return result
