"""The Kubernetes side of the runbook, for Slurm-on-Kubernetes (Slinky) clusters.

Slurm is drained first and the node is IDLE+DRAIN before any pod is touched (evicting a
slurmd pod tells Slurm nothing). Then the Node is cordoned and tainted under the incident,
marked GpuUnhealthy, and emptied through the Eviction API (PodDisruptionBudgets honoured).
After a repair the Node must come back Ready *as a new machine* (a new providerID, or a new
bootID after a reboot); after the health gate the marks come off.
"""

from __future__ import annotations

import re
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.kubernetes import (
        CordonNodeInput,
        EvictPodsInput,
        NodeIdentity,
        NodeIdentityInput,
        SetNodeConditionInput,
        UncordonNodeInput,
        WaitNewNodeInput,
    )
    from autoclusters.core.models import RepairResult, drain_reason
    from autoclusters.core.policy import StepPolicy

from autoclusters.workflows.incident import Incident

K8S_CALL = timedelta(seconds=60)


def condition_reason(fault: str) -> str:
    """XID_79 -> Xid79, GPU_FELL_OFF_BUS -> GpuFellOffBus (a condition reason is CamelCase)."""
    return "".join(p.capitalize() for p in re.split(r"_+", fault) if p)


class KubernetesNode:
    """The incident's Kubernetes Node (Slinky): its marks, its pods, its machine."""

    def __init__(self, incident: Incident) -> None:
        self.incident = incident

    def _cordon_input(self, phase: str) -> CordonNodeInput:
        r = self.incident.request
        return CordonNodeInput(
            node=r.node,
            incident_id=r.incident_id,
            phase=phase,
            reason=drain_reason(r.incident_id, r.fault),
        )

    async def cordon(self, phase: str) -> None:
        inc = self.incident
        r = inc.request
        await inc.steps.activity(
            "k8s_cordon",
            contracts.k8s_cordon,
            self._cordon_input(phase),
            f"cordon Kubernetes Node {r.node} ({phase})",
            lambda c: c.detail or ("cordoned" if c.cordoned else ""),
            timeout=K8S_CALL,
        )

    async def quarantine(self, step: StepPolicy) -> None:
        inc = self.incident
        r = inc.request
        await self.cordon("quarantine")
        await self.condition(True, condition_reason(r.fault), f"incident {r.incident_id}")
        wait_s = min(step.idle_timeout_s, 600)
        await inc.steps.activity(
            "k8s_evict",
            contracts.k8s_evict_pods,
            # Slurm is drained and idle by now, so the slurmd pod may go too.
            EvictPodsInput(
                node=r.node,
                timeout_s=wait_s,
                force_after_timeout=step.on_idle_timeout == "force",
                skip_slurmd=False,
            ),
            f"evict the pods of {r.node}",
            lambda e: f"evicted {len(e.evicted)}, forced {len(e.forced)}, skipped {len(e.skipped)}",
            timeout=timedelta(seconds=wait_s + 120),
        )

    async def identity(self) -> NodeIdentity:
        inc = self.incident
        return await inc.steps.activity(
            "k8s_identity",
            contracts.k8s_node_identity,
            NodeIdentityInput(node=inc.node),
            f"read the machine of Kubernetes Node {inc.node}",
            lambda n: n.provider_id,
            timeout=K8S_CALL,
        )

    async def is_cordoned(self) -> bool:
        """A read inside another step (the quarantine check)."""
        inc = self.incident
        ident = await inc.steps.call(
            contracts.k8s_node_identity,
            NodeIdentityInput(node=inc.node),
            f"is Kubernetes Node {inc.node} still cordoned",
            timeout=K8S_CALL,
        )
        return ident.unschedulable

    async def wait_new_machine(self, before: NodeIdentity, done: RepairResult) -> None:
        inc = self.incident
        r = inc.request
        if done.stopped_at is None:
            return  # the machine never went away
        await inc.steps.activity(
            "k8s_wait_ready",
            contracts.k8s_wait_new_node_ready,
            WaitNewNodeInput(
                node=r.node,
                old_provider_id=before.provider_id,
                old_boot_id=before.boot_id,
                cordon=self._cordon_input("health-gate"),
            ),
            f"wait for {r.node} to come back Ready as a new machine",
            lambda n: f"Ready as {n.provider_id}",
            timeout=timedelta(seconds=r.timeouts.wait_registered_s),
        )
        # A new machine registers as a fresh Node with none of our marks: keep pods off it
        # until the health gate has passed.
        await self.cordon("health-gate")

    async def give_back(self) -> None:
        r = self.incident.request
        await self.condition(False, "HealthGatePassed", f"incident {r.incident_id}")
        await self.uncordon()

    async def uncordon(self, *, keep_taint: bool = False) -> None:
        """`keep_taint`: lift the cordon only; the remediation taint keeps other pods off."""
        inc = self.incident
        r = inc.request
        await inc.steps.activity(
            "k8s_uncordon",
            contracts.k8s_uncordon,
            UncordonNodeInput(node=r.node, incident_id=r.incident_id, keep_taint=keep_taint),
            f"uncordon Kubernetes Node {r.node}" + (" (taint kept)" if keep_taint else ""),
            lambda u: u.detail,
            timeout=K8S_CALL,
        )

    async def condition(self, unhealthy: bool, reason: str, message: str) -> None:
        inc = self.incident
        await inc.steps.activity(
            "k8s_condition",
            contracts.k8s_set_condition,
            SetNodeConditionInput(
                node=inc.node, unhealthy=unhealthy, reason=reason, message=message
            ),
            f"mark Kubernetes Node {inc.node} GpuUnhealthy={unhealthy} ({reason})",
            lambda c: f"GpuUnhealthy={c.status}",
            timeout=K8S_CALL,
        )
