"""Events on a Node: what the product did to it, for `kubectl get events` and
`kubectl describe node`.

node-problem-detector and NVSentinel leave an Event on the Node for every condition they set
and every cordon, taint or eviction they make; an operator reading the cluster with kubectl
sees the remediation there, beside the kubelet's own Events. Each Event is core/v1 (what
`kubectl get events` lists): `involvedObject` the Node (kind, name, uid), in namespace
`default` (where the API server keeps a cluster-scoped object's Events), `source.component`
and `reportingComponent` `autoclusters`, `type` Normal or Warning, with `count`,
`firstTimestamp` and `lastTimestamp`.

A repeat (same Node, reason and message) counts up on the same Event rather than adding one,
as client-go's event correlator does: the Event's name is derived from those three, so a
create that finds it (409) patches `count` and `lastTimestamp` instead.

Recording is best effort, as in client-go: an Event the API refuses or cannot take is logged
and dropped; it never fails the step that made the change.
"""

from __future__ import annotations

import hashlib
import json
import logging
import socket
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client import ApiException

log = logging.getLogger(__name__)

COMPONENT = "autoclusters"
NAMESPACE = "default"
NORMAL, WARNING = "Normal", "Warning"
# The reasons of the runbook's own changes (a condition's Event takes the condition's reason).
CORDONED, UNCORDONED, EVICTED = "Cordoned", "Uncordoned", "Evicted"
# A GPU-sharing move's taint: lifted when the node is lent to inference, put back after.
POOL_TAINT_LIFTED, POOL_TAINTED = "PoolTaintLifted", "PoolTainted"
MESSAGE_LIMIT = 1024  # kube-apiserver refuses a longer Event message
REQUEST_TIMEOUT_S = 10.0


def _now() -> datetime:
    return datetime.now(UTC)


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_name(node: str, reason: str, message: str) -> str:
    """The Event's name: the Node's, then a digest of what happened (one Event per repeat)."""
    digest = hashlib.sha256(f"{node}\0{reason}\0{message}".encode()).hexdigest()[:16]
    return f"{node}.{digest}"


class NodeEvents:
    """Records Events on Nodes through the Kubernetes API (`api`)."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        host: str | None = None,
        clock: Callable[[], datetime] = _now,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self._core = client.CoreV1Api(api)
        self._host = host or socket.gethostname()
        self._clock = clock
        self._timeout = request_timeout_s

    def record(
        self, node: str, uid: str, reason: str, message: str, *, warning: bool = False
    ) -> bool:
        """Record (or count again) an Event on the Node; False when the API did not take it
        (logged: an Event is never worth failing a step for)."""
        message = message[:MESSAGE_LIMIT]
        try:
            self._record(node, uid, reason, message, WARNING if warning else NORMAL)
        except Exception as e:  # the API away, a refusal: the change itself stands
            log.warning("no Event %s on node %s: %s", reason, node, e)
            return False
        return True

    def _record(self, node: str, uid: str, reason: str, message: str, kind: str) -> None:
        name, stamp = event_name(node, reason, message), _iso(self._clock())
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid},
            "reason": reason,
            "message": message,
            "type": kind,
            "source": {"component": COMPONENT, "host": self._host},
            "reportingComponent": COMPONENT,
            "reportingInstance": self._host,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            self._core.create_namespaced_event(
                NAMESPACE,
                body,  # type: ignore[arg-type]  # the API's JSON, as it is
                _request_timeout=self._timeout,
            )
            return
        except ApiException as e:
            if e.status != 409:
                raise
        seen: Any = self._core.read_namespaced_event(
            name, NAMESPACE, _request_timeout=self._timeout, _preload_content=False
        )  # the raw response (_preload_content=False), not the model
        count = int(json.loads(seen.data).get("count") or 1)
        self._core.patch_namespaced_event(
            name,
            NAMESPACE,
            {"count": count + 1, "lastTimestamp": stamp},
            _request_timeout=self._timeout,
        )
