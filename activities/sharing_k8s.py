"""Kubernetes steps of a GPU-sharing move: hand a node to the inference pool (label it,
lift the pool taint, scale the Deployment, wait for its replica there to serve) and take it
back (its pod removed first and gracefully, then the label and taint restored).

The node's pool is its `autoclusters.io/pool` label; training nodes also carry a NoSchedule
taint with that key, which inference pods do not tolerate. Node writes carry the
resourceVersion they were computed from (a concurrent writer makes them retry). A node
cordoned by an incident is the runbook's: lending refuses it.
"""

from __future__ import annotations

import asyncio
import time

from kubernetes import client
from kubernetes.client import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError

from autoclusters.activities.heartbeat import heartbeating
from autoclusters.activities.kubernetes import KubernetesActivities, api_errors
from autoclusters.core.kubernetes import INCIDENT_ANNOTATION, Obj, metadata_of
from autoclusters.core.sharing import (
    INFERENCE_APP,
    INFERENCE_APP_LABEL,
    POD_DELETION_COST,
    POOL_LABEL,
    POOL_TAINT_KEY,
    MoveCall,
    Pool,
    StepOutcome,
)
from autoclusters.integrations import k8s_events


def _pool_taint() -> Obj:
    return {"key": POOL_TAINT_KEY, "value": Pool.TRAINING.value, "effect": "NoSchedule"}


def _taints(node: Obj) -> list[Obj]:
    return list((node.get("spec") or {}).get("taints") or [])


def _without_pool_taint(node: Obj) -> list[Obj]:
    return [t for t in _taints(node) if t.get("key") != POOL_TAINT_KEY]


def _has_pool_taint(node: Obj) -> bool:
    return any(t.get("key") == POOL_TAINT_KEY for t in _taints(node))


def _terminated(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _ready(pod: Obj) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


class ShareKubernetesActivities(KubernetesActivities):
    def __init__(
        self, api: client.ApiClient, *, request_timeout_s: float = 30, poll_s: float = 0.5
    ) -> None:
        super().__init__(api, request_timeout_s=request_timeout_s)
        self._apps = client.AppsV1Api(api)
        self._poll_s = poll_s

    async def _inference_pods_on(self, node: str, call: MoveCall) -> list[Obj]:
        return [
            p
            for p in await self._pods_on(node)
            if metadata_of(p).get("namespace") == call.policy.inference.namespace
            and (metadata_of(p).get("labels") or {}).get(INFERENCE_APP_LABEL) == INFERENCE_APP
            and not _terminated(p)
        ]

    async def _scale(self, call: MoveCall) -> None:
        target = call.policy.inference
        await self._call(
            self._apps.patch_namespaced_deployment_scale,
            target.deployment,
            target.namespace,
            {"spec": {"replicas": call.replicas}},
        )

    @activity.defn(name="share_k8s_lend")
    async def lend(self, call: MoveCall) -> StepOutcome:
        """Label the node for the inference pool and lift the pool taint (a cordoned node is
        someone else's: refused)."""
        async with heartbeating(f"share_k8s_lend {call.node}"):
            with api_errors(call.node):

                def plan(node: Obj) -> tuple[Obj | None, StepOutcome]:
                    meta = metadata_of(node)
                    owner = (meta.get("annotations") or {}).get(INCIDENT_ANNOTATION)
                    if owner is not None:
                        raise ApplicationError(
                            f"{call.node} is cordoned by incident {owner}: not lent",
                            type="NodeNotOurs",
                            non_retryable=True,
                        )
                    labels = meta.get("labels") or {}
                    spec = node.get("spec") or {}
                    if (
                        labels.get(POOL_LABEL) == Pool.INFERENCE.value
                        and not _has_pool_taint(node)
                        and not spec.get("unschedulable")
                    ):
                        return None, StepOutcome(
                            changed=False, detail="already in the inference pool"
                        )
                    if spec.get("unschedulable"):
                        raise ApplicationError(
                            f"{call.node} is cordoned by someone else: not lent",
                            type="NodeNotOurs",
                            non_retryable=True,
                        )
                    patch: Obj = {
                        "metadata": {"labels": {POOL_LABEL: Pool.INFERENCE.value}},
                        "spec": {"taints": _without_pool_taint(node) or None},
                    }
                    return patch, StepOutcome(changed=True, detail="labelled inference, untainted")

                outcome, node = await self._rewrite(call.node, plan)
            if outcome.changed:
                text = f"lent to the inference pool: taint {POOL_TAINT_KEY} lifted"
                await self._note(node, k8s_events.POOL_TAINT_LIFTED, text, warning=False)
            return outcome

    @activity.defn(name="share_scale_inference")
    async def scale_inference(self, call: MoveCall) -> StepOutcome:
        """Set the inference Deployment's replicas (an absolute number: a retry sets the
        same one)."""
        async with heartbeating(f"share_scale_inference {call.replicas}"):
            with api_errors(call.node):
                await self._scale(call)
                return StepOutcome(changed=True, detail=f"replicas={call.replicas}")

    @activity.defn(name="share_wait_serving")
    async def wait_serving(self, call: MoveCall) -> StepOutcome:
        """Until an inference pod on the node is Ready (its readiness probe passes)."""
        async with heartbeating(f"share_wait_serving {call.node}"):
            with api_errors(call.node):
                deadline = time.monotonic() + call.policy.ready_timeout_s
                while time.monotonic() < deadline:
                    ready = [p for p in await self._inference_pods_on(call.node, call) if _ready(p)]
                    if ready:
                        name = metadata_of(ready[0]).get("name")
                        return StepOutcome(changed=False, detail=f"pod {name} Ready")
                    await asyncio.sleep(self._poll_s)
                raise ApplicationError(
                    f"no inference pod Ready on {call.node} "
                    f"within {call.policy.ready_timeout_s:g}s",
                    type="NotServing",
                )

    @activity.defn(name="share_k8s_release")
    async def release(self, call: MoveCall) -> StepOutcome:
        """Remove the node's inference pod by scaling down: it is marked cheapest to delete
        (Kubernetes' pod-deletion-cost), so the ReplicaSet removes that one, gracefully
        (in-flight requests finish); wait until no inference pod is left on the node."""
        async with heartbeating(f"share_k8s_release {call.node}"):
            with api_errors(call.node):
                for pod in await self._inference_pods_on(call.node, call):
                    meta = metadata_of(pod)
                    if (meta.get("annotations") or {}).get(POD_DELETION_COST) == "-1000":
                        continue
                    try:
                        await self._call(
                            self._core.patch_namespaced_pod,
                            meta["name"],
                            meta["namespace"],
                            {"metadata": {"annotations": {POD_DELETION_COST: "-1000"}}},
                        )
                    except ApiException as e:
                        if e.status != 404:  # gone meanwhile: nothing to mark
                            raise
                await self._scale(call)
                deadline = time.monotonic() + call.policy.ready_timeout_s
                while await self._inference_pods_on(call.node, call):
                    if time.monotonic() > deadline:
                        raise ApplicationError(
                            f"inference pods still on {call.node} after "
                            f"{call.policy.ready_timeout_s:g}s",
                            type="PodsStillThere",
                        )
                    await asyncio.sleep(self._poll_s)
                return StepOutcome(changed=True, detail=f"replicas={call.replicas}; node emptied")

    @activity.defn(name="share_k8s_reclaim")
    async def reclaim(self, call: MoveCall) -> StepOutcome:
        """Back to the training pool: label and taint restored, so no inference pod lands."""
        async with heartbeating(f"share_k8s_reclaim {call.node}"):
            with api_errors(call.node):

                def plan(node: Obj) -> tuple[Obj | None, StepOutcome]:
                    labels = metadata_of(node).get("labels") or {}
                    if labels.get(POOL_LABEL) == Pool.TRAINING.value and _has_pool_taint(node):
                        return None, StepOutcome(
                            changed=False, detail="already in the training pool"
                        )
                    patch: Obj = {
                        "metadata": {"labels": {POOL_LABEL: Pool.TRAINING.value}},
                        "spec": {"taints": [*_without_pool_taint(node), _pool_taint()]},
                    }
                    return patch, StepOutcome(changed=True, detail="labelled training, tainted")

                outcome, node = await self._rewrite(call.node, plan)
            if outcome.changed:
                taint = f"{POOL_TAINT_KEY}={Pool.TRAINING.value}:NoSchedule"
                text = f"back in the training pool: tainted {taint}"
                await self._note(node, k8s_events.POOL_TAINTED, text, warning=False)
            return outcome
