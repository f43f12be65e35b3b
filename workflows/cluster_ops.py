"""ScaleNodeSet and ClusterTeardown: a provisioned cluster grown, shrunk or deleted, every
step in the history.

Scale up brings the new machines up as ClusterProvisioning does, with the same code
(workflows/machine_bring_up.py: `cluster_create_machine`, `cluster_wait_booted`,
`cluster_discover_topology`, `cluster_configure_slurm`, `cluster_health_gate`), a failed
boot, registration or gate replaced up to `machine_attempts` machines per node; the new
nodes register drained under this operation's reason and are returned to service only once
every one passed its gate.

Scale down picks idle nodes first, then the least busy; drains them under this operation's
reason; requeues their jobs (each once: the requeue marker carries this operation's key) or
waits for them to end; waits until the node runs nothing, checks it again, and only then
deletes its machine.

Teardown drains every node, requeues nothing (jobs still running after `grace_s` are
cancelled), deletes the machines, then the login nodes, shared home, accounting and
controller (reverse order of creation). It reads what exists from the provider first and
deletes are idempotent, so a re-run or a retried step deletes nothing twice.

One owner per node: both run as `cluster-ops-<cluster>` (one at a time per cluster) and are
refused (ClusterBusy) while the cluster's ClusterProvisioning runs; a node
whose remediation incident is open is skipped (scale down) or waited for (teardown); the
runbook leaves alone a node drained under an operation's reason (`is_ops_reason`).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.cluster import (
        ClusterRef,
        DeleteCall,
        Machine,
        NodeSetNodes,
        Resource,
        provisioning_workflow_id,
    )
    from autoclusters.core.cluster_ops import (
        IncidentProbe,
        Inventory,
        NodeLoad,
        NodeLoadCall,
        OpsState,
        ScaleNodeSetInput,
        TeardownInput,
        WorkflowProbe,
        ops_key,
    )
    from autoclusters.core.cluster_spec import ClusterSpec, NodeSetSpec
    from autoclusters.core.models import (
        DrainInput,
        RequeueInput,
        RequeueResult,
        ReturnInput,
        ReturnResult,
        WaitIdleInput,
        WaitIdleResult,
        drain_reason,
    )
    from autoclusters.core.sharing import is_sharing_reason

from autoclusters.workflows.machine_bring_up import MachineBringUp
from autoclusters.workflows.provider_calls import (
    CREATE_TIMEOUT,
    PROVIDER_RETRY,
    SLURM_TIMEOUT,
    fatal_refusal,
)
from autoclusters.workflows.steps import RETRY, Defaults, OnState, Steps, cause_of

T = TypeVar("T")

SLURM_STEP = timedelta(minutes=2)
NODE_BUSY = "NodeBusy"


class _Ops:
    """What both workflows share: the recorded steps, the Slurm and provider calls."""

    _state: OpsState
    _ref: ClusterRef

    _steps: Steps

    async def _not_provisioning(self) -> None:
        """A cluster still being provisioned belongs to its provisioning: refused."""
        wf_id = provisioning_workflow_id(self._ref.name)
        running: bool = await self._steps.activity(
            "check_provisioning",
            contracts.cluster_workflow_running,
            WorkflowProbe(workflow_id=wf_id),
            f"is {wf_id} still provisioning cluster {self._ref.name}",
            lambda r: f"{wf_id} running" if r else "",
            heartbeat=None,
        )
        if running:
            raise ApplicationError(
                f"cluster {self._ref.name} is still being provisioned ({wf_id}): "
                "scale or delete it once that ends",
                type="ClusterBusy",
                non_retryable=True,
            )

    async def _inventory(self) -> Inventory:
        return await self._steps.activity(
            "inventory",
            contracts.cluster_inventory,
            self._ref,
            f"list what cluster {self._ref.name} has",
            lambda inv: f"{len(inv.resources)} resources, {len(inv.machines)} machines",
            timeout=SLURM_TIMEOUT,
            retry=PROVIDER_RETRY,
        )

    async def _loads(self, nodes: list[str]) -> dict[str, NodeLoad]:
        loads: list[NodeLoad] = await self._steps.call(
            contracts.cluster_node_load,
            NodeLoadCall(cluster=self._ref, nodes=nodes),
            f"read the jobs on {', '.join(nodes)} in cluster {self._ref.name}",
        )
        return {ld.node: ld for ld in loads}

    async def _incident_open(self, node: str) -> bool:
        open_: bool = await self._steps.call(
            contracts.cluster_incident_open,
            IncidentProbe(cluster=self._ref.name, node=node),
            f"is a remediation incident open on {node} in cluster {self._ref.name}",
            heartbeat=None,
        )
        return open_

    async def _drain(self, node: str, why: str) -> None:
        await self._steps.call(
            contracts.drain_node,
            DrainInput(node=node, reason=drain_reason(self._state.key, why)),
            f"drain {node} ({why})",
        )

    async def _wait_idle(self, node: str, timeout_s: float, *, force: bool) -> WaitIdleResult:
        """Until the node runs no job; without force, wait again after each timeout."""
        while True:
            try:
                done: WaitIdleResult = await self._steps.call(
                    contracts.wait_node_idle,
                    WaitIdleInput(node=node, timeout_s=timeout_s, force=force),
                    f"wait until {node} is idle"
                    + (f" (its jobs cancelled after {timeout_s:.0f} s)" if force else ""),
                    timeout=timedelta(seconds=timeout_s) + SLURM_STEP,
                )
            except ActivityError as e:
                cause = cause_of(e)
                if isinstance(cause, ApplicationError) and cause.type == NODE_BUSY:
                    continue  # its jobs still run: keep waiting, never delete under them
                raise
            return done

    async def _delete(self, res: Resource) -> None:
        await self._steps.call(
            contracts.cluster_delete,
            DeleteCall(cluster=self._ref, resource=res),
            f"delete {res.kind} {res.name} ({res.id}) of cluster {self._ref.name}",
            timeout=CREATE_TIMEOUT,
            retry=PROVIDER_RETRY,
        )
        self._state.deleted.append(res)


def _failed(err: BaseException) -> ApplicationError:
    fatal = fatal_refusal(err)
    if fatal is not None:
        return ApplicationError(fatal.message, type=fatal.type, non_retryable=True)
    cause = cause_of(err)
    kind = cause.type if isinstance(cause, ApplicationError) and cause.type else "OpsFailed"
    return ApplicationError(str(cause), type=kind, non_retryable=True)


@workflow.defn(name="ScaleNodeSet")
class ScaleNodeSet(_Ops, MachineBringUp):
    @workflow.init
    def __init__(self, inp: ScaleNodeSetInput) -> None:
        spec = inp.spec
        self._inp = inp
        self._ref = ClusterRef(name=spec.name, provider=spec.provider, location=spec.location)
        self._state = OpsState(cluster=spec.name)
        self._steps = Steps(OnState(self._state), Defaults(SLURM_STEP, RETRY), keep_last=True)
        self._growing: NodeSetSpec | None = None  # a scale up's node set, at its new count
        self._init_bring_up(inp, inp.agent_report_timeout_s, self._steps)

    @workflow.query
    def status(self) -> OpsState:
        return self._state

    @workflow.run
    async def run(self, inp: ScaleNodeSetInput) -> OpsState:
        s = self._state
        s.key = ops_key(inp.spec.name, workflow.info().run_id)
        node_set = next((n for n in inp.spec.node_sets if n.name == inp.node_set), None)
        if node_set is None:
            raise ApplicationError(
                f"cluster {inp.spec.name} has no node set {inp.node_set}",
                type="UnknownNodeSet",
                non_retryable=True,
            )
        try:
            await self._not_provisioning()
            inv = await self._inventory()
            self._machines = {m.node: m for m in inv.machines}  # every node of the cluster
            mine = sorted(m.node for m in inv.machines if m.node_set == inp.node_set)
            if inp.count > len(mine):
                grown = node_set.model_copy(update={"count": inp.count})
                new = [n for n in grown.node_names() if n not in self._machines]
                await self._scale_up(grown, new[: inp.count - len(mine)])
            elif inp.count < len(mine):
                await self._scale_down(mine, len(mine) - inp.count)
        except (ActivityError, ApplicationError) as e:
            s.status, s.failure = "failed", str(cause_of(e))
            raise _failed(e) from None
        s.status, s.current_step = "done", None
        return s

    # --- up ---------------------------------------------------------------------------------

    async def _scale_up(self, node_set: NodeSetSpec, new: list[str]) -> None:
        self._growing = node_set
        await self._steps.step(
            "boot_machines",
            lambda: self._all(self._bring_up(n) for n in new),
            lambda _: ", ".join(new),
        )
        # The new nodes register drained under this operation's reason until returned.
        why = drain_reason(self._state.key, "SCALE_UP")
        await self._steps.step(
            "register_and_gate", lambda: self._register_and_gate(new, {n: why for n in new})
        )
        for node in new:
            back: ReturnResult = await self._steps.activity(
                f"return_to_service {node}",
                contracts.return_to_service,
                ReturnInput(node=node, incident_id=self._state.key),
                f"return {node} to service",
                lambda r: r.state_after,
            )
            if not back.returned:
                raise ApplicationError(f"{node} not returned to service: {back.detail}")
            self._state.added.append(node)

    # --- the bring-up's hooks (workflows/machine_bring_up.py) -------------------------------

    def _spec_of(self, node: str) -> NodeSetSpec:
        assert self._growing is not None, "only a scale up brings machines up"
        return self._growing

    def _slurm_node_sets(self, machines: list[Machine]) -> list[NodeSetNodes]:
        return _node_set_nodes(self._inp.spec, machines)

    def _attempts_exhausted(self, node: str, machine: Machine, why: str) -> Exception:
        return ApplicationError(
            f"node {node}: {self._attempts[node]} machines tried, the last {why}",
            type="MachineAttemptsExhausted",
            non_retryable=True,
        )

    def _on_discarded(self, node: str, machine: Machine) -> None:
        self._state.replaced += 1

    async def _before_gate(self, registered: list[str]) -> None:
        # Drained before anything can be scheduled on it (configure_slurm registers it
        # drained already; this holds even on a provider that ignores that).
        for node in registered:
            await self._drain(node, "SCALE_UP")

    # --- down -------------------------------------------------------------------------------

    async def _scale_down(self, mine: list[str], remove: int) -> None:
        victims = await self._steps.step(
            "choose_nodes", lambda: self._choose(mine, remove), lambda v: ", ".join(v)
        )
        await self._steps.step(
            "remove_nodes", lambda: self._all(self._remove(n) for n in victims), lambda _: ""
        )
        # Slurm forgets the removed nodes.
        await self._steps.step("configure_slurm", self._configure_slurm)

    async def _choose(self, mine: list[str], remove: int) -> list[str]:
        """Idle nodes first, then the least busy (fewest jobs), the newest first among equals;
        a node with an open incident or lent to inference is not touched (waited for when
        too few are left)."""
        while True:
            loads = await self._loads(mine)
            free: list[str] = []
            for node in mine:
                if node in loads and is_sharing_reason(loads[node].reason):
                    # GpuSharing holds it (lent to inference, or moving): not ours.
                    self._state.skipped[node] = "lent to inference (or moving)"
                elif await self._incident_open(node):
                    self._state.skipped[node] = "a remediation incident is open"
                else:
                    free.append(node)
            if len(free) >= remove:
                break
            await workflow.sleep(timedelta(seconds=self._inp.incident_poll_s))
        order = sorted(
            free,
            key=lambda n: (len(loads[n].jobs) if n in loads else 0, [-ord(c) for c in n]),
        )
        return order[:remove]

    async def _remove(self, node: str) -> None:
        s = self._state
        await self._drain(node, "SCALE_DOWN")
        if self._inp.jobs == "requeue":
            done: RequeueResult = await self._steps.call(
                contracts.requeue_jobs,
                RequeueInput(node=node, incident_id=s.key),
                f"requeue the jobs on {node} (scale down)",
            )
            s.requeued += [j for j in done.requeued if j not in s.requeued]
        while True:
            await self._wait_idle(node, self._inp.idle_timeout_s, force=False)
            # Checked again right before the delete: never under a running job.
            load = (await self._loads([node])).get(node)
            if load is None or not load.jobs:
                break
        await self._delete(self._machines.pop(node).resource())
        s.removed.append(node)


@workflow.defn(name="ClusterTeardown")
class ClusterTeardown(_Ops):
    @workflow.init
    def __init__(self, inp: TeardownInput) -> None:
        self._inp = inp
        self._ref = inp.cluster
        self._state = OpsState(cluster=inp.cluster.name)
        self._steps = Steps(OnState(self._state), Defaults(SLURM_STEP, RETRY), keep_last=True)

    @workflow.query
    def status(self) -> OpsState:
        return self._state

    @workflow.run
    async def run(self, inp: TeardownInput) -> OpsState:
        s = self._state
        s.key = ops_key(inp.cluster.name, workflow.info().run_id)
        try:
            await self._not_provisioning()
            inv = await self._inventory()
            nodes = sorted(m.node for m in inv.machines)
            if nodes:
                await self._steps.step("wait_for_incidents", lambda: self._no_incidents(nodes))
                known = await self._loads(nodes)
                await self._steps.step(
                    "drain",
                    lambda: self._all_nodes(self._quiesce(n) for n in nodes if n in known),
                    lambda _: f"{len(known)} nodes",
                )
            machines = [r for r in inv.resources if r.kind == "machine"]
            await self._steps.step(
                "delete_machines", lambda: self._all_nodes(self._delete(r) for r in machines)
            )
            for res in reversed([r for r in inv.resources if r.kind != "machine"]):
                await self._steps.step(f"delete_{res.kind}", lambda res=res: self._delete(res))  # type: ignore[misc]
        except (ActivityError, ApplicationError) as e:
            s.status, s.failure = "failed", str(cause_of(e))
            raise _failed(e) from None
        s.status, s.current_step = "done", None
        return s

    async def _all_nodes(self, tasks: object) -> None:
        results = await asyncio.gather(*tasks, return_exceptions=True)  # type: ignore[misc]
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]

    async def _no_incidents(self, nodes: list[str]) -> None:
        """Teardown waits for every open incident to close: the runbook owns its node."""
        pending = list(nodes)
        while True:
            still = [n for n in pending if await self._incident_open(n)]
            for n in still:
                self._state.skipped[n] = "waited for its open remediation incident"
            if not still:
                return
            pending = still
            await workflow.sleep(timedelta(seconds=self._inp.incident_poll_s))

    async def _quiesce(self, node: str) -> None:
        """Drain; requeue nothing; what still runs after the grace time is cancelled."""
        await self._drain(node, "TEARDOWN")
        await self._wait_idle(node, self._inp.grace_s, force=True)


def _node_set_nodes(spec: ClusterSpec, machines: list[Machine]) -> list[NodeSetNodes]:
    return [
        NodeSetNodes(
            name=s.name,
            partition=s.partition,
            gpus_per_node=s.gpus_per_node,
            nodes=sorted(m.node for m in machines if m.node_set == s.name),
        )
        for s in spec.node_sets
    ]
