"""Kubernetes steps of the runbook: cordon, evict, wait for the new machine, mark, uncordon.

Every step is idempotent and undoes only its own marks (core/kubernetes.py): a cordon
someone else made stands, and uncordon leaves it. Writes that replace a list (`spec.taints`)
carry the resourceVersion they were computed from, so a concurrent writer makes them retry
instead of being overwritten.

On Slinky, a slurmd pod is never evicted here by default: evicting it tells Slurm nothing.
The workflow drains through Slurm, waits for IDLE+DRAIN, then deals with that pod.

Each change (cordon and taint, uncordon, evictions, the condition) also leaves an Event on
the Node, as node-problem-detector does (integrations/k8s_events.py); best effort: an Event
the API refuses never fails the step.

Each step is given a Slurm node and acts on that node's Kubernetes Node
(activities/machine_of.py): on CMK the Node carrying its name as Slinky's hostname-override,
else the Node of its own name. A Slurm node no Node is is `UnknownNode`.

Failures (activities/kubernetes_calls.py): a Node that does not exist is `UnknownNode`
(non-retryable); 409 is a retryable conflict; other refusals are non-retryable; the API not
answering is `KubernetesUnavailable` (retryable, an outage the workflow waits out). A read
that failed is never taken as "no pods" or "node absent".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError

from autoclusters.activities.heartbeat import heartbeating

# How a call is made and its failures read; imported from here too, where it was written.
from autoclusters.activities.kubernetes_calls import (
    KubernetesUnavailable,
    api_errors,
    call_json,
    items_of,
    kubernetes_outage,
    status_body,
    translate,
)
from autoclusters.activities.kubernetes_calls import unavailable_error as unavailable_error
from autoclusters.activities.machine_of import MachineOf
from autoclusters.core.kubernetes import (
    CORDON_REASON_ANNOTATION,
    GPU_UNHEALTHY,
    INCIDENT_ANNOTATION,
    PHASE_LABEL,
    TAINT_KEY,
    CordonNodeInput,
    CordonNodeResult,
    EvictPodsInput,
    EvictPodsResult,
    FindSlurmdPodInput,
    FindSlurmdPodResult,
    NodeIdentity,
    NodeIdentityInput,
    Obj,
    SetNodeConditionInput,
    SetNodeConditionResult,
    UncordonNodeInput,
    UncordonNodeResult,
    WaitNewNodeInput,
    drain_skip_reason,
    identity_of,
    is_slurmd,
    is_unschedulable,
    metadata_of,
    other_taints,
    our_taints,
    pod_ref,
    slurmd_pod_of,
)
from autoclusters.integrations import k8s_events
from autoclusters.integrations.k8s_events import NodeEvents

# A write computed from a stale read is recomputed this many times before the step fails
# (retryably) and Temporal takes over.
_CONFLICT_ATTEMPTS = 5
R = TypeVar("R")


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubernetesActivities:
    """The runbook's Kubernetes steps. `machines`: how a Slurm node's Node is found (default:
    read from `api`'s cluster, activities/machine_of.py)."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        request_timeout_s: float = 30,
        machines: MachineOf | None = None,
        events: NodeEvents | None = None,
    ) -> None:
        self._core = client.CoreV1Api(api)
        self._timeout = request_timeout_s
        self._machines = machines or MachineOf(api, request_timeout_s=request_timeout_s)
        # An Event is worth less than the step: it waits no longer than the recorder's own
        # bound, even when the step's calls may take longer.
        self._events = events or NodeEvents(
            api, request_timeout_s=min(request_timeout_s, k8s_events.REQUEST_TIMEOUT_S)
        )

    async def _note(self, node: Obj, reason: str, message: str, *, warning: bool) -> None:
        """An Event on the Node for a change just made (best effort: never fails the step)."""
        meta = metadata_of(node)
        await asyncio.to_thread(
            self._events.record,
            str(meta["name"]),
            str(meta.get("uid", "")),
            reason,
            message,
            warning=warning,
        )

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Obj:
        return await call_json(fn, *args, timeout_s=self._timeout, **kwargs)

    async def _node(self, name: str) -> Obj:
        return await self._call(self._core.read_node, name)

    async def _node_of(self, slurm_node: str) -> str:
        """The name of the Slurm node's Kubernetes Node; `UnknownNode` when no Node is it."""
        node = await self._machines.kube_node(slurm_node)
        if node is None:
            raise ApplicationError(
                f"node {slurm_node} is not in this Kubernetes cluster (no Node is named so "
                "or carries it as its hostname-override)",
                type="UnknownNode",
                non_retryable=True,
            )
        return str(metadata_of(node)["name"])

    async def _pods_on(self, node: str) -> list[Obj]:
        pods = await self._call(
            self._core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}"
        )
        return items_of(pods, "pods")

    async def _rewrite_node(self, name: str, plan: Callable[[Obj], tuple[Obj | None, R]]) -> R:
        return (await self._rewrite(name, plan))[0]

    async def _rewrite(
        self, name: str, plan: Callable[[Obj], tuple[Obj | None, R]]
    ) -> tuple[R, Obj]:
        """Read the node, plan a patch from it, send it with the read's resourceVersion:
        (the plan's result, the node as read).

        A 409 means someone wrote in between: read and plan again, a few times.
        """
        for attempt in range(_CONFLICT_ATTEMPTS):
            node = await self._node(name)
            patch, result = plan(node)
            if patch is None:
                return result, node
            patch["metadata"] = {**patch.get("metadata", {}), "resourceVersion": _rv(node)}
            try:
                await self._call(self._core.patch_node, name, patch)
            except ApiException as e:
                if e.status == 409 and attempt + 1 < _CONFLICT_ATTEMPTS:
                    continue
                raise
            return result, node
        raise AssertionError("unreachable")

    @activity.defn(name="k8s_cordon")
    async def cordon_node(self, inp: CordonNodeInput) -> CordonNodeResult:
        async with heartbeating(f"k8s_cordon {inp.node}"):
            return await self._cordon_node(inp)

    async def _cordon_node(self, inp: CordonNodeInput) -> CordonNodeResult:
        with api_errors(inp.node):
            name = await self._node_of(inp.node)
            result, node = await self._rewrite(name, lambda node: _cordon_plan(node, inp))
        if result.changed:
            taint = f"{TAINT_KEY}={inp.phase}:NoSchedule"
            await self._note(
                node,
                k8s_events.CORDONED,
                f"incident {inp.incident_id}: cordoned and tainted {taint}: {inp.reason}",
                warning=True,
            )
        return result

    @activity.defn(name="k8s_uncordon")
    async def uncordon_node(self, inp: UncordonNodeInput) -> UncordonNodeResult:
        async with heartbeating(f"k8s_uncordon {inp.node}"):
            return await self._uncordon_node(inp)

    async def _uncordon_node(self, inp: UncordonNodeInput) -> UncordonNodeResult:
        with api_errors(inp.node):
            name = await self._node_of(inp.node)
            result, node = await self._rewrite(name, lambda node: _uncordon_plan(node, inp))
        if result.changed:
            what = "cordon lifted, taint kept" if inp.keep_taint else "uncordoned, taint removed"
            await self._note(
                node, k8s_events.UNCORDONED, f"incident {inp.incident_id}: {what}", warning=False
            )
        return result

    @activity.defn(name="k8s_evict_pods")
    async def evict_pods(self, inp: EvictPodsInput) -> EvictPodsResult:
        async with heartbeating(f"k8s_evict_pods {inp.node}"):
            return await self._evict_pods(inp)

    async def _evict_pods(self, inp: EvictPodsInput) -> EvictPodsResult:
        """Evict every pod on the node that a drain should move; PDB refusals are retried.

        Waits until the evicted pods are gone (by uid: a pod recreated under the same name is
        another pod). What is still there after `timeout_s` is force-deleted when
        `force_after_timeout`, else the step fails with `EvictionBlocked`.
        """
        with api_errors(inp.node):
            name = await self._node_of(inp.node)
            node = await self._node(name)
            result = EvictPodsResult()
            wanted: dict[str, Obj] = {}
            for pod in await self._pods_on(name):
                why = drain_skip_reason(pod, skip_slurmd=inp.skip_slurmd)
                if why:
                    result.skipped[pod_ref(pod)] = why
                else:
                    wanted[pod_ref(pod)] = pod
            start, delay = time.monotonic(), inp.poll_s
            pending = {
                r: p for r, p in wanted.items() if not metadata_of(p).get("deletionTimestamp")
            }
            blocked: dict[str, str] = {}
            while True:
                for ref, pod in list(pending.items()):
                    refusal = await self._evict(pod, inp.grace_period_s)
                    if refusal is None:
                        pending.pop(ref)
                        blocked.pop(ref, None)
                        result.evicted.append(ref)
                    else:
                        blocked[ref] = refusal
                left = await self._still_there(name, wanted)
                waited = time.monotonic() - start
                if not left or waited >= inp.timeout_s:
                    break
                activity.heartbeat({"blocked": blocked, "terminating": sorted(left - set(blocked))})
                await asyncio.sleep(min(delay, inp.timeout_s - waited))
                delay = min(delay * 2, inp.max_backoff_s)
            result.waited_s = time.monotonic() - start
            if left and not inp.force_after_timeout:
                stuck = {ref: blocked.get(ref, "still terminating") for ref in sorted(left)}
                raise ApplicationError(
                    f"{inp.node}: {len(left)} pod(s) still on the node after "
                    f"{inp.timeout_s:.0f}s: {stuck}",
                    stuck,
                    type="EvictionBlocked",
                    non_retryable=True,
                )
            for ref in sorted(left):
                await self._force_delete(wanted[ref])
                result.forced.append(ref)
        if result.evicted or result.forced:
            message = f"evicted {len(result.evicted)} pod(s): {', '.join(result.evicted)}"
            if result.forced:
                message += f"; force-deleted after {inp.timeout_s:.0f}s: {', '.join(result.forced)}"
            await self._note(node, k8s_events.EVICTED, message, warning=True)
        return result

    async def _evict(self, pod: Obj, grace: int | None) -> str | None:
        """None when the pod is on its way out (or already gone); else why it was refused."""
        meta = metadata_of(pod)
        body = client.V1Eviction(
            metadata=client.V1ObjectMeta(name=meta["name"], namespace=meta["namespace"]),
            delete_options=client.V1DeleteOptions(
                grace_period_seconds=grace, preconditions=client.V1Preconditions(uid=meta["uid"])
            ),
        )
        try:
            await self._call(
                self._core.create_namespaced_pod_eviction, meta["name"], meta["namespace"], body
            )
        except ApiException as e:
            if e.status in (404, 409):  # gone, or replaced by another pod of that name
                return None
            status = status_body(e)
            if e.status == 429 and status.get("kind") == "Status":
                # The eviction API's refusal (a PodDisruptionBudget): a Status document.
                # The API server's overload 429 is plain text (its max-in-flight and
                # priority-and-fairness filters), an outage that _translate reports.
                causes = (status.get("details") or {}).get("causes") or []
                return "; ".join(c.get("message", "") for c in causes) or "TooManyRequests"
            if e.status == 500 and "PodDisruptionBudget" in str(status.get("message")):
                # "This pod has more than one PodDisruptionBudget, which the eviction
                # subresource does not support.": an answer about this pod, not an outage.
                raise ApplicationError(
                    f"Kubernetes {e.status}: {status['message']}", type="KubernetesRetryable"
                ) from e
            raise
        return None

    async def _still_there(self, node: str, wanted: dict[str, Obj]) -> set[str]:
        uids = {metadata_of(p).get("uid") for p in await self._pods_on(node)}
        return {ref for ref, pod in wanted.items() if metadata_of(pod).get("uid") in uids}

    async def _force_delete(self, pod: Obj) -> None:
        meta = metadata_of(pod)
        try:
            await self._call(
                self._core.delete_namespaced_pod,
                meta["name"],
                meta["namespace"],
                grace_period_seconds=0,
                body=client.V1DeleteOptions(
                    grace_period_seconds=0, preconditions=client.V1Preconditions(uid=meta["uid"])
                ),
            )
        except ApiException as e:
            if e.status not in (404, 409):
                raise

    @activity.defn(name="k8s_wait_new_node_ready")
    async def wait_new_node_ready(self, inp: WaitNewNodeInput) -> NodeIdentity:
        async with heartbeating(f"k8s_wait_new_node_ready {inp.node}"):
            return await self._wait_new_node_ready(inp)

    async def _wait_new_node_ready(self, inp: WaitNewNodeInput) -> NodeIdentity:
        """Poll until the node is back as another machine (providerID) or a new boot (bootID).

        A missing node is expected mid-replacement, and a passing API outage only delays the
        answer; the activity's start-to-close timeout bounds the wait. On CMK the new
        machine's Node joins without the slot's Slurm name: it is given it here, once
        (activities/machine_of.py `new_node`), before the cordon, so Slinky runs its slurmd
        under that name.
        """
        cordoned = False
        while True:
            ident: NodeIdentity | None = None
            seen = "not registered"
            try:
                node = await self._machines.new_node(inp.node, inp.old_provider_id)
                ident = identity_of(node) if node is not None else None
            except ApiException as e:
                outage = kubernetes_outage(e)
                if outage is None:
                    raise translate(e, inp.node) from e
                seen = str(outage)  # unknown, not "not registered": keep asking
            except KubernetesUnavailable as e:
                seen = str(e)
            new = ident is not None and _is_new(ident, inp)
            if new and inp.cordon and not cordoned:
                cordoned = await self._cordon_on_sight(inp.cordon)
            if new and ident is not None and ident.ready:
                return ident
            activity.heartbeat(
                seen
                if ident is None
                else f"provider_id={ident.provider_id} boot_id={ident.boot_id} ready={ident.ready}"
            )
            await asyncio.sleep(inp.poll_s)

    async def _cordon_on_sight(self, inp: CordonNodeInput) -> bool:
        """Cordon the new Node now; False (the next poll tries again, and the workflow's own
        cordon step follows) when the API refuses or is away."""
        try:
            await self._cordon_node(inp)
        except ApplicationError as e:  # api_errors: whatever the API answered, translated
            activity.logger.warning("cordoning the new Node %s: %s", inp.node, e)
            return False
        return True

    @activity.defn(name="k8s_set_condition")
    async def set_node_condition(self, inp: SetNodeConditionInput) -> SetNodeConditionResult:
        async with heartbeating(f"k8s_set_condition {inp.node}"):
            return await self._set_node_condition(inp)

    async def _set_node_condition(self, inp: SetNodeConditionInput) -> SetNodeConditionResult:
        """Set or clear GpuUnhealthy through nodes/status, merged by type: others stay as is."""
        status = "True" if inp.unhealthy else "False"
        with api_errors(inp.node):
            name = await self._node_of(inp.node)
            node = await self._node(name)
            conds = (node.get("status") or {}).get("conditions") or []
            cur = next((c for c in conds if c.get("type") == GPU_UNHEALTHY), None)
            if cur is None and not inp.unhealthy:
                return SetNodeConditionResult(changed=False, status="")
            if cur is not None and (cur.get("status"), cur.get("reason"), cur.get("message")) == (
                status,
                inp.reason,
                inp.message,
            ):
                return SetNodeConditionResult(changed=False, status=status)
            stamp = _iso(datetime.now(UTC))
            moved = cur is None or cur.get("status") != status or not cur.get("lastTransitionTime")
            condition = {
                "type": GPU_UNHEALTHY,
                "status": status,
                "reason": inp.reason,
                "message": inp.message,
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": stamp if moved or cur is None else cur["lastTransitionTime"],
            }
            await self._call(
                self._core.patch_node_status, name, {"status": {"conditions": [condition]}}
            )
        # As node-problem-detector does: the condition's reason, Warning for a problem.
        text = f"{GPU_UNHEALTHY}={status}" + (f": {inp.message}" if inp.message else "")
        await self._note(node, inp.reason, text, warning=inp.unhealthy)
        return SetNodeConditionResult(changed=True, status=status)

    @activity.defn(name="k8s_node_identity")
    async def node_identity(self, inp: NodeIdentityInput) -> NodeIdentity:
        async with heartbeating(f"k8s_node_identity {inp.node}"):
            return await self._node_identity(inp)

    async def _node_identity(self, inp: NodeIdentityInput) -> NodeIdentity:
        with api_errors(inp.node):
            return identity_of(await self._node(await self._node_of(inp.node)))

    @activity.defn(name="k8s_find_slurmd_pod")
    async def find_slurmd_pod(self, inp: FindSlurmdPodInput) -> FindSlurmdPodResult:
        async with heartbeating(f"k8s_find_slurmd_pod {inp.node}"):
            return await self._find_slurmd_pod(inp)

    async def _find_slurmd_pod(self, inp: FindSlurmdPodInput) -> FindSlurmdPodResult:
        """The slurmd pod a Slinky NodeSet runs on the node, if any (a live one first)."""
        with api_errors(inp.node):
            name = await self._node_of(inp.node)
            await self._node(name)
            pods = [p for p in await self._pods_on(name) if is_slurmd(p)]
        pods.sort(
            key=lambda p: (bool(metadata_of(p).get("deletionTimestamp")), metadata_of(p)["name"])
        )
        return FindSlurmdPodResult(pod=slurmd_pod_of(pods[0]) if pods else None)


def _rv(obj: Obj) -> str:
    return str(metadata_of(obj).get("resourceVersion", ""))


def _cordon_plan(node: Obj, inp: CordonNodeInput) -> tuple[Obj | None, CordonNodeResult]:
    annotations = metadata_of(node).get("annotations") or {}
    owner = annotations.get(INCIDENT_ANNOTATION)
    if is_unschedulable(node) and owner is None:
        # Someone cordoned it without us: their cordon already keeps pods off, and our marks
        # would make our uncordon lift it later.
        reason = annotations.get(CORDON_REASON_ANNOTATION, "")
        return None, CordonNodeResult(
            cordoned=True,
            changed=False,
            foreign=True,
            detail=f"already cordoned by someone else (reason {reason!r}); left as it was",
        )
    if _is_cordoned_as(node, inp):
        return None, CordonNodeResult(cordoned=True, changed=False, detail="already ours")
    ours = {"key": TAINT_KEY, "value": inp.phase, "effect": "NoSchedule"}
    patch = {
        "metadata": {
            "labels": {PHASE_LABEL: inp.phase},
            "annotations": {
                INCIDENT_ANNOTATION: inp.incident_id,
                CORDON_REASON_ANNOTATION: inp.reason,
            },
        },
        "spec": {"unschedulable": True, "taints": [*other_taints(node), ours]},
    }
    previous = owner if owner not in (None, inp.incident_id) else None
    return patch, CordonNodeResult(cordoned=True, changed=True, previous_incident=previous)


def _uncordon_plan(node: Obj, inp: UncordonNodeInput) -> tuple[Obj | None, UncordonNodeResult]:
    labels = metadata_of(node).get("labels") or {}
    owner = (metadata_of(node).get("annotations") or {}).get(INCIDENT_ANNOTATION)
    if owner not in (None, inp.incident_id) or (owner is None and is_unschedulable(node)):
        who = f"incident {owner}" if owner else "someone else"
        return None, UncordonNodeResult(
            uncordoned=False,
            changed=False,
            foreign=True,
            detail=f"left cordoned: the cordon is {who}'s, not {inp.incident_id}'s",
        )
    if owner is None and not our_taints(node) and PHASE_LABEL not in labels:
        return None, UncordonNodeResult(uncordoned=True, changed=False, detail="not cordoned")
    if inp.keep_taint:
        if not is_unschedulable(node):
            return None, UncordonNodeResult(
                uncordoned=True, changed=False, detail="not cordoned; taint kept"
            )
        # The cordon is this incident's (checked above): only it goes.
        kept = UncordonNodeResult(uncordoned=True, changed=True, detail="cordon lifted; taint kept")
        return {"spec": {"unschedulable": None}}, kept
    spec: Obj = {"taints": other_taints(node) or None}
    if owner is not None:  # without our annotation the cordon was never ours to lift
        spec["unschedulable"] = None
    patch = {
        "metadata": {
            "labels": {PHASE_LABEL: None},
            "annotations": {INCIDENT_ANNOTATION: None, CORDON_REASON_ANNOTATION: None},
        },
        "spec": spec,
    }
    return patch, UncordonNodeResult(uncordoned=True, changed=True)


def _is_cordoned_as(node: Obj, inp: CordonNodeInput) -> bool:
    meta = metadata_of(node)
    annotations = meta.get("annotations") or {}
    return (
        is_unschedulable(node)
        and [(t.get("value"), t.get("effect")) for t in our_taints(node)]
        == [(inp.phase, "NoSchedule")]
        and (meta.get("labels") or {}).get(PHASE_LABEL) == inp.phase
        and annotations.get(INCIDENT_ANNOTATION) == inp.incident_id
        and annotations.get(CORDON_REASON_ANNOTATION) == inp.reason
    )


def _is_new(ident: NodeIdentity, inp: WaitNewNodeInput) -> bool:
    if not inp.old_provider_id and not inp.old_boot_id:
        return True  # nothing to compare with: any Ready node will do
    return bool(
        (inp.old_provider_id and ident.provider_id != inp.old_provider_id)
        or (inp.old_boot_id and ident.boot_id != inp.old_boot_id)
    )
