"""New machines brought into a cluster, for ClusterProvisioning and ScaleNodeSet: each node
slot's machine created and waited on until it boots (a machine that does not is deleted and
replaced); then, in a loop, the InfiniBand placement discovered, Slurm configured so the
nodes register, every registered node health-gated, and every node that did not register or
failed its gate replaced, until all passed. A slot tries at most `machine_attempts` machines
and keeps its Slurm node name; a quota or capacity refusal is never answered with another
machine.

The health gate is the runbook's: Slurm's side is the provider's `cluster_health_gate`
(slurmd answers with all its GPUs), the agent's side a fresh healthy snapshot from the
node's own agent since its machine booted (workflows/agent_gate.py).

Both workflows run this one copy. What differs between them is bookkeeping, left to hooks:
the progress each records, what a slot out of attempts raises, the node sets Slurm is told
about, and what happens to a node between registering and its gate (a scale up drains it).
A gate that could not run fails the node with a check naming why. Changing the commands
issued here changes both workflows' histories (docs/versioning.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.cluster import (
        BootResult,
        ClusterRef,
        Machine,
        MachineCall,
        NodeGateCall,
        NodeSetNodes,
        Placement,
        Resource,
        SlurmConfigCall,
        SlurmConfigResult,
        TopologyCall,
        render_topology,
    )
    from autoclusters.core.cluster_spec import ClusterSpec, NodeSetSpec
    from autoclusters.core.models import HealthCheck, HealthReport

from autoclusters.workflows.agent_gate import AgentGate
from autoclusters.workflows.provider_calls import (
    CREATE_TIMEOUT,
    GATE_TIMEOUT,
    PROVIDER_RETRY,
    SLURM_TIMEOUT,
    fatal_refusal,
)
from autoclusters.workflows.steps import HEARTBEAT, Steps, cause_of


class NewMachinesInput(Protocol):
    """What a workflow's input says about its new machines (ClusterProvisioningInput and
    ScaleNodeSetInput both say it)."""

    @property
    def spec(self) -> ClusterSpec: ...
    @property
    def machine_attempts(self) -> int: ...  # machines tried per node slot before it fails
    @property
    def boot_timeout_s(self) -> float: ...
    @property
    def agent_gate(self) -> bool: ...  # the gate also waits for the node's agent


@dataclass(frozen=True)
class BringUpSettings:
    """The input's settings for the bring-up, read once by `_init_bring_up`."""

    machine_attempts: int
    boot_timeout_s: float
    accounting: bool  # Slurm is configured with accounting
    agent_gate: bool
    agent_report_timeout_s: float


class MachineBringUp(AgentGate):
    """Mixed into a workflow whose `__init__` calls `_init_bring_up` (with the workflow's
    step kernel, which runs every activity here) and sets `_ref`; it implements the hooks
    below that raise NotImplementedError."""

    _ref: ClusterRef
    _bring_up_settings: BringUpSettings
    _bring_up_steps: Steps
    _machines: dict[str, Machine]  # node -> its current machine
    _attempts: dict[str, int]  # node -> machines tried for its slot
    _booted_at: dict[str, datetime]  # node -> when its machine booted (the agent gate's start)

    def _init_bring_up(
        self, inp: NewMachinesInput, agent_report_timeout_s: float, steps: Steps
    ) -> None:
        # The activities here run with these options whatever the workflow's defaults.
        self._bring_up_steps = steps
        self._bring_up_settings = BringUpSettings(
            machine_attempts=inp.machine_attempts,
            boot_timeout_s=inp.boot_timeout_s,
            accounting=inp.spec.accounting,
            agent_gate=inp.agent_gate,
            agent_report_timeout_s=agent_report_timeout_s,
        )
        self._machines = {}
        self._attempts = {}
        self._booted_at = {}
        self._init_agent_gate()

    # --- hooks: what the workflow records, raises and tells Slurm ----------------------------
    # The `_on_*` hooks only record (they are called between commands and issue none, so
    # both workflows keep issuing the same commands); `_before_gate` may issue its own.

    def _spec_of(self, node: str) -> NodeSetSpec:
        """The node set whose machine the slot `node` gets."""
        raise NotImplementedError

    def _slurm_node_sets(self, machines: list[Machine]) -> list[NodeSetNodes]:
        """The node sets (and their nodes) Slurm is configured with, `machines` being all
        the cluster's."""
        raise NotImplementedError

    def _attempts_exhausted(self, node: str, machine: Machine, why: str) -> Exception:
        """What fails the workflow when the slot's last machine was discarded for `why`."""
        raise NotImplementedError

    async def _delete(self, res: Resource) -> None:
        """Delete a discarded machine (and record it deleted)."""
        raise NotImplementedError

    def _on_created(self, node: str, machine: Machine) -> None:
        pass

    def _on_booted(self, node: str) -> None:
        pass

    def _on_discarded(self, node: str, machine: Machine) -> None:
        pass

    def _on_topology(self, placements: list[Placement], topology_conf: str) -> None:
        pass

    async def _before_gate(self, registered: list[str]) -> None:
        """`registered` (new to Slurm, not yet healthy) are about to be gated."""

    def _on_gated(self, reports: list[HealthReport]) -> None:
        pass

    # --- the algorithm ---------------------------------------------------------------------

    async def _all(self, tasks: Iterable[Any]) -> None:
        """Run side by side and let every one finish (nothing is left creating a machine
        while the cluster is cleaned up); then raise the first fatal refusal, else the first
        failure."""
        results = await asyncio.gather(*tasks, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        for err in errors:
            if fatal_refusal(err) is not None:
                raise err
        if errors:
            raise errors[0]

    async def _bring_up(self, node: str) -> None:
        """Create the slot's machine and wait until it boots; replace it until it does."""
        while True:
            machine = await self._create_machine(node)
            boot = await wait_booted(
                self._bring_up_steps, machine, self._bring_up_settings.boot_timeout_s
            )
            if boot.booted:
                self._booted_at[node] = workflow.now()
                self._on_booted(node)
                return
            await self._discard(node, f"did not boot: {boot.detail}")

    async def _create_machine(self, node: str) -> Machine:
        attempt = self._attempts.get(node, 0) + 1
        self._attempts[node] = attempt
        machine: Machine = await self._bring_up_steps.call(
            contracts.cluster_create_machine,
            MachineCall(
                cluster=self._ref, node_set=self._spec_of(node), node=node, attempt=attempt
            ),
            f"create the machine for {node} in cluster {self._ref.name} (attempt {attempt})",
            timeout=CREATE_TIMEOUT,
            heartbeat=HEARTBEAT,
            retry=PROVIDER_RETRY,
        )
        self._machines[node] = machine
        self._on_created(node, machine)
        return machine

    async def _discard(self, node: str, why: str) -> None:
        """Delete the slot's machine; fail the workflow when the slot has no attempts left."""
        machine = self._machines.pop(node)
        self._on_discarded(node, machine)
        await self._delete(machine.resource())
        if self._attempts[node] >= self._bring_up_settings.machine_attempts:
            raise self._attempts_exhausted(node, machine, why)
        workflow.logger.warning("replacing %s (%s): %s", node, machine.machine_id, why)

    async def _replace(self, node: str, why: str) -> None:
        await self._discard(node, why)
        await self._bring_up(node)

    async def _register_and_gate(
        self, nodes: list[str], drained: dict[str, str] | None = None
    ) -> None:
        """Until every one of `nodes` registered with Slurm and passed its gate (in that
        order, which is the order the gates start in); `drained`: nodes that register
        drained, under their reason."""
        healthy: set[str] = set()
        while True:
            registered = await self._configure_slurm(drained)
            pending = [n for n in nodes if n in registered and n not in healthy]
            failed = {n: "did not register with slurmctld" for n in nodes if n not in registered}
            await self._before_gate(pending)
            reports = list(await asyncio.gather(*(self._gate(n) for n in pending)))
            for report in reports:
                if report.passed:
                    healthy.add(report.node)
                else:
                    failed[report.node] = f"failed its health gate: {report.failures()}"
            self._on_gated(reports)
            if not failed:
                return
            await self._all(self._replace(n, why) for n, why in sorted(failed.items()))

    async def _configure_slurm(self, drained: dict[str, str] | None = None) -> set[str]:
        """Discover every machine's placement, write it as Slurm's topology and configure
        Slurm with every machine; the nodes that registered."""
        machines = [self._machines[n] for n in sorted(self._machines)]
        found: list[Placement] = await self._bring_up_steps.call(
            contracts.cluster_discover_topology,
            TopologyCall(cluster=self._ref, machines=machines),
            f"discover the InfiniBand placement of {len(machines)} machines in cluster "
            f"{self._ref.name}",
            timeout=SLURM_TIMEOUT,
            heartbeat=HEARTBEAT,
            retry=PROVIDER_RETRY,
        )
        by_node = {p.node: p for p in found}
        placements = [by_node.get(m.node, Placement(node=m.node)) for m in machines]
        topology_conf = render_topology(placements)
        self._on_topology(placements, topology_conf)
        result: SlurmConfigResult = await self._bring_up_steps.call(
            contracts.cluster_configure_slurm,
            SlurmConfigCall(
                cluster=self._ref,
                node_sets=self._slurm_node_sets(machines),
                machines=machines,
                topology_conf=topology_conf,
                accounting=self._bring_up_settings.accounting,
                drained=drained or {},
            ),
            f"configure Slurm of cluster {self._ref.name} with {len(machines)} machines",
            timeout=SLURM_TIMEOUT,
            heartbeat=HEARTBEAT,
            retry=PROVIDER_RETRY,
        )
        return set(result.registered)

    async def _gate(self, node: str) -> HealthReport:
        """Slurm's side of the gate, then (once that passed) the agent's."""
        machine = self._machines[node]
        gpus = self._spec_of(node).gpus_per_node
        try:
            report: HealthReport = await self._bring_up_steps.call(
                contracts.cluster_health_gate,
                NodeGateCall(cluster=self._ref, machine=machine, expected_gpus=gpus),
                f"health-gate {node} ({machine.machine_id}) in cluster {self._ref.name}",
                timeout=GATE_TIMEOUT,
                heartbeat=HEARTBEAT,
                retry=PROVIDER_RETRY,
            )
        except ActivityError as e:
            if fatal_refusal(e) is not None:
                raise
            # Not fatal: the node failed its gate, and the check says why.
            return HealthReport(node=node, passed=False, checks=[_check("gate", str(cause_of(e)))])
        settings = self._bring_up_settings
        if report.passed and settings.agent_gate:
            since = self._booted_at.get(node, workflow.info().start_time)
            timeout = settings.agent_report_timeout_s
            checks = await self._agent_gate(node, since, gpus, timeout)
            report = with_agent_checks(report, checks)
        return report


def with_agent_checks(report: HealthReport, checks: list[HealthCheck]) -> HealthReport:
    """Slurm's report with the agent's checks added: passed only if every check did."""
    both = [*report.checks, *checks]
    return report.model_copy(update={"checks": both, "passed": all(c.passed for c in both)})


def _check(name: str, detail: str) -> HealthCheck:
    return HealthCheck(name=name, passed=False, detail=detail)


async def wait_booted(steps: Steps, machine: Machine, boot_timeout_s: float) -> BootResult:
    """Until `machine` boots; a hang past the timeout or a provider's failure is an answer
    (booted=False: replace it), only a fatal error (quota, capacity) raises."""
    try:
        result: BootResult = await steps.call(
            contracts.cluster_wait_booted,
            machine,
            f"wait for {machine.node} ({machine.machine_id}) in cluster "
            f"{machine.cluster.name} to boot",
            timeout=timedelta(seconds=boot_timeout_s),
            heartbeat=HEARTBEAT,
            retry=PROVIDER_RETRY,
        )
    except ActivityError as e:
        if fatal_refusal(e) is not None:
            raise
        return BootResult(booted=False, detail=str(cause_of(e)))
    return result
