"""What the sharing workflow decides from: inference demand from Prometheus (the policy's PromQL,
through the HTTP API), training demand from Slurm (GPUs asked for by pending jobs, held by
running ones), and every GPU node with its pool, jobs and pods.

A query with no data gives no figure (`None`): the decision then holds, since "no data"
must never read as "no demand" and hand every node back. Prometheus not answering (refused,
5xx, an error envelope, not JSON) is no figure either, and is not "no data": it raises
`PrometheusUnavailable`, as a Kubernetes outage raises `KubernetesUnavailable`, so the
evaluation fails as an outage (retryable) rather than deciding from figures it never got.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from kubernetes import client
from temporalio import activity

from autoclusters.activities.heartbeat import heartbeating
from autoclusters.activities.kubernetes import api_errors, call_json, items_of
from autoclusters.core import hostlist
from autoclusters.core.cluster_ops import is_ops_reason
from autoclusters.core.models import REASON_PREFIX, SPARE_REASON, SlurmJob, SlurmNode, job_stamp
from autoclusters.core.sharing import (
    INFERENCE_APP,
    INFERENCE_APP_LABEL,
    LENT_REASON,
    POOL_LABEL,
    Demand,
    DemandCall,
    NodeShare,
    Pool,
    is_sharing_reason,
)
from autoclusters.integrations.prometheus import instant_value
from autoclusters.integrations.slurm import SlurmClient

_ACTIVE = {"RUNNING", "CONFIGURING", "SUSPENDED", "COMPLETING"}
# A job waiting to start (again): a requeued one passes through these (borrowing reads them).
_WAITING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"}


def node_gpus(node: SlurmNode) -> int:
    """GPUs from a gres string such as `gpu:8` or `gpu:h100:8(S:0-1)`."""
    for part in node.gres.split(","):
        fields = part.split("(")[0].split(":")
        if fields and fields[0] == "gpu" and fields[-1].isdigit():
            return int(fields[-1])
    return 0


def checkpointed_at(job: SlurmJob) -> float | None:
    """A job may record its last checkpoint in its comment (`ckpt_at=<epoch s>`)."""
    return job_stamp(job, "ckpt_at")


def pool_from_slurm(node: SlurmNode) -> Pool:
    if node.drained and node.reason == LENT_REASON:
        return Pool.INFERENCE
    if node.drained and is_sharing_reason(node.reason):
        return Pool.MOVING
    return Pool.TRAINING


def in_incident(node: SlurmNode) -> bool:
    """Drained under an incident's reason (ours, not a move, a spare or a scale), or down."""
    if not node.responding:
        return True
    reason = node.reason
    return (
        node.drained
        and reason.startswith(f"{REASON_PREFIX} ")
        and not is_sharing_reason(reason)
        and reason != SPARE_REASON
        and not is_ops_reason(reason)
    )


def incident_of(node: SlurmNode) -> tuple[str | None, str | None]:
    """The incident id and fault an incident's drain reason names (`drain_reason`)."""
    if not in_incident(node) or not node.drained:
        return None, None
    parts = node.reason.split()
    return (parts[1] if len(parts) > 1 else None), (parts[2] if len(parts) > 2 else None)


def spare_free(node: SlurmNode) -> bool:
    """A hot spare waiting, drained under the fleet guard's reason and answering."""
    return node.drained and node.reason == SPARE_REASON and node.responding


def not_shareable(node: SlurmNode) -> bool:
    """Spares are the fleet guard's, an admin's drain is the admin's, a scale's node is
    about to go: none of them is in either pool."""
    if node.drained and not node.reason.startswith(f"{REASON_PREFIX} "):
        return True
    return node.drained and (node.reason == SPARE_REASON or is_ops_reason(node.reason))


# The first sample of an instant query: None for no data (or NaN), PrometheusUnavailable when
# Prometheus did not answer (integrations/prometheus.py).
prometheus_value = instant_value


class ShareDemandActivities:
    def __init__(
        self,
        slurm: SlurmClient,
        http: httpx.AsyncClient,
        *,
        prometheus_url: str | None,
        kube: client.ApiClient | None = None,
        request_timeout_s: float = 15,
    ) -> None:
        self._slurm = slurm
        self._http = http
        self._prometheus_url = prometheus_url
        self._core = client.CoreV1Api(kube) if kube is not None else None
        self._apps = client.AppsV1Api(kube) if kube is not None else None
        self._timeout = request_timeout_s

    async def _k8s(self, fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return await call_json(fn, *args, timeout_s=self._timeout, **kwargs)

    async def _read_kubernetes(
        self, call: DemandCall
    ) -> tuple[dict[str, str], dict[str, int], int]:
        """Each node's pool label, the inference pods on each node, the ready replicas."""
        assert self._core is not None and self._apps is not None
        target = call.policy.inference
        labels: dict[str, str] = {}
        for item in items_of(await self._k8s(self._core.list_node), "nodes"):
            meta = item.get("metadata") or {}
            pool = (meta.get("labels") or {}).get(POOL_LABEL)
            if pool:
                labels[meta.get("name", "")] = pool
        pods_doc = await self._k8s(
            self._core.list_namespaced_pod,
            target.namespace,
            label_selector=f"{INFERENCE_APP_LABEL}={INFERENCE_APP}",
        )
        pods: dict[str, int] = {}
        for pod in items_of(pods_doc, "pods"):
            where = (pod.get("spec") or {}).get("nodeName")
            if where and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                pods[where] = pods.get(where, 0) + 1
        try:
            dep = await self._k8s(
                self._apps.read_namespaced_deployment, target.deployment, target.namespace
            )
        except client.ApiException as e:
            if e.status != 404:
                raise
            return labels, pods, 0  # no Deployment (yet): nothing serves
        return labels, pods, int((dep.get("status") or {}).get("readyReplicas") or 0)

    @activity.defn(name="share_read_demand")
    async def read_demand(self, call: DemandCall) -> Demand:
        async with heartbeating(f"share_read_demand {call.cluster}"):
            return await self._read_demand(call)

    async def _read_demand(self, call: DemandCall) -> Demand:
        target = call.policy.inference
        url = call.prometheus_url or self._prometheus_url
        value = rps = None
        if url:
            value, rps = await asyncio.gather(
                prometheus_value(self._http, url, target.demand_query),
                prometheus_value(self._http, url, target.rate_query),
            )
        labels: dict[str, str] = {}
        pods: dict[str, int] = {}
        ready = 0
        if self._core is not None and self._apps is not None:
            with api_errors():
                labels, pods, ready = await self._read_kubernetes(call)
        slurm_nodes, jobs = await asyncio.gather(self._slurm.nodes(), self._slurm.jobs())
        gpus_of = {n.name: node_gpus(n) for n in slurm_nodes}
        on_node: dict[str, list[SlurmJob]] = {}
        pending_gpus = running_gpus = 0
        pending: list[int] = []
        for job in jobs:
            names = hostlist.expand(job.nodes) if job.nodes else []
            per_node = max((gpus_of.get(n, 0) for n in names), default=0)
            if job.job_state in _WAITING:
                pending.append(job.job_id)
            if job.job_state == "PENDING":
                pending_gpus += job.gpus or job.node_count * max(gpus_of.values(), default=0)
            elif job.job_state in _ACTIVE:
                running_gpus += job.gpus or per_node * len(names)
                for n in names:
                    on_node.setdefault(n, []).append(job)
        shares: list[NodeShare] = []
        for node in slurm_nodes:
            if gpus_of[node.name] == 0 or not_shareable(node):
                continue
            if node.name in call.pools:
                pool = call.pools[node.name]
            elif node.name in labels and labels[node.name] in {p.value for p in Pool}:
                pool = Pool(labels[node.name])
            else:
                pool = pool_from_slurm(node)
            here = on_node.get(node.name, [])
            stamps = [t for t in (checkpointed_at(j) for j in here) if t is not None]
            incident, fault = incident_of(node)
            shares.append(
                NodeShare(
                    name=node.name,
                    pool=pool,
                    gpus=gpus_of[node.name],
                    jobs=[j.job_id for j in here],
                    last_checkpoint_at=max(stamps) if stamps else None,
                    pods=pods.get(node.name, 0),
                    in_incident=in_incident(node),
                    incident_id=incident,
                    incident_fault=fault,
                )
            )
        return Demand(
            at=time.time(),
            inference_value=value,
            slo=target.slo,
            inference_rps=rps,
            ready_replicas=ready,
            training_pending_gpus=pending_gpus,
            training_running_gpus=running_gpus,
            nodes=shares,
            spares_free=sum(1 for n in slurm_nodes if spare_free(n)),
            pending_jobs=sorted(pending),
        )
