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

from autoclusters.workflows.timeline import HEARTBEAT, STEP_RETRY, Timeline

K8S_CALL = timedelta(seconds=60)


def condition_reason(fault: str) -> str:
    """XID_79 -> Xid79, GPU_FELL_OFF_BUS -> GpuFellOffBus (a condition reason is CamelCase)."""
    return "".join(p.capitalize() for p in re.split(r"_+", fault) if p)


class KubernetesSteps(Timeline):
    async def _k8s_cordon(self, phase: str) -> None:
        r = self._state.request
        await self._step(
            "k8s_cordon",
            lambda: workflow.execute_activity(
                contracts.k8s_cordon,
                CordonNodeInput(
                    node=r.node,
                    incident_id=r.incident_id,
                    phase=phase,
                    reason=drain_reason(r.incident_id, r.fault),
                ),
                start_to_close_timeout=K8S_CALL,
                heartbeat_timeout=HEARTBEAT,
                retry_policy=STEP_RETRY,
            ),
            detail=lambda c: c.detail or ("cordoned" if c.cordoned else ""),
        )

    async def _k8s_quarantine(self, step: StepPolicy) -> None:
        r = self._state.request
        await self._k8s_cordon("quarantine")
        await self._k8s_condition(True, condition_reason(r.fault), f"incident {r.incident_id}")
        await self._step(
            "k8s_evict",
            lambda: workflow.execute_activity(
                contracts.k8s_evict_pods,
                # Slurm is drained and idle by now, so the slurmd pod may go too.
                EvictPodsInput(
                    node=r.node,
                    timeout_s=min(step.idle_timeout_s, 600),
                    force_after_timeout=step.on_idle_timeout == "force",
                    skip_slurmd=False,
                ),
                start_to_close_timeout=timedelta(seconds=min(step.idle_timeout_s, 600) + 120),
                heartbeat_timeout=HEARTBEAT,
                retry_policy=STEP_RETRY,
            ),
            detail=lambda e: (
                f"evicted {len(e.evicted)}, forced {len(e.forced)}, skipped {len(e.skipped)}"
            ),
        )

    async def _k8s_identity(self) -> NodeIdentity:
        r = self._state.request
        return await self._step(
            "k8s_identity",
            lambda: workflow.execute_activity(
                contracts.k8s_node_identity,
                NodeIdentityInput(node=r.node),
                start_to_close_timeout=K8S_CALL,
                heartbeat_timeout=HEARTBEAT,
                retry_policy=STEP_RETRY,
            ),
            detail=lambda n: n.provider_id,
        )

    async def _k8s_wait_new_machine(self, before: NodeIdentity, done: RepairResult) -> None:
        r = self._state.request
        if done.stopped_at is None:
            return  # the machine never went away
        await self._step(
            "k8s_wait_ready",
            lambda: workflow.execute_activity(
                contracts.k8s_wait_new_node_ready,
                WaitNewNodeInput(
                    node=r.node, old_provider_id=before.provider_id, old_boot_id=before.boot_id
                ),
                start_to_close_timeout=timedelta(seconds=r.timeouts.wait_registered_s),
                heartbeat_timeout=HEARTBEAT,
                retry_policy=STEP_RETRY,
            ),
            detail=lambda n: f"Ready as {n.provider_id}",
        )
        # A new machine registers as a fresh Node with none of our marks: keep pods off it
        # until the health gate has passed.
        await self._k8s_cordon("health-gate")

    async def _k8s_return(self) -> None:
        r = self._state.request
        await self._k8s_condition(False, "HealthGatePassed", f"incident {r.incident_id}")
        await self._step(
            "k8s_uncordon",
            lambda: workflow.execute_activity(
                contracts.k8s_uncordon,
                UncordonNodeInput(node=r.node, incident_id=r.incident_id),
                start_to_close_timeout=K8S_CALL,
                heartbeat_timeout=HEARTBEAT,
                retry_policy=STEP_RETRY,
            ),
            detail=lambda u: u.detail,
        )

    async def _k8s_condition(self, unhealthy: bool, reason: str, message: str) -> None:
        r = self._state.request
        await self._step(
            "k8s_condition",
            lambda: workflow.execute_activity(
                contracts.k8s_set_condition,
                SetNodeConditionInput(
                    node=r.node, unhealthy=unhealthy, reason=reason, message=message
                ),
                start_to_close_timeout=K8S_CALL,
                heartbeat_timeout=HEARTBEAT,
                retry_policy=STEP_RETRY,
            ),
            detail=lambda c: f"GpuUnhealthy={c.status}",
        )
