"""Optional: mirror the agent's verdict into the node's `GpuUnhealthy` condition.

Off by default (`--k8s-condition` turns it on). While any fault fires the condition is
True, its reason `Agent<Fault>` (e.g. AgentXid79) and its message the firing faults. When
none fires, the agent sets it False only if the agent set it: a GpuUnhealthy that the
remediation workflow set (core/kubernetes.py) is the incident's, and stays. Patches go
through nodes/status (merged by condition type, so other conditions stay), at a change
and otherwise every `heartbeat_s` to refresh lastHeartbeatTime; each change of status or
reason also leaves an Event on the Node (integrations/k8s_events.py). Failures are logged
and retried at the next check; they never stop the agent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from autoclusters.core.kubernetes import GPU_UNHEALTHY

log = logging.getLogger(__name__)
REASON_PREFIX = "Agent"


def reason_for(fault: str) -> str:
    """XID_79 -> AgentXid79, GPU_FELL_OFF_BUS -> AgentGpuFellOffBus (CamelCase, as k8s wants)."""
    return REASON_PREFIX + "".join(part.capitalize() for part in fault.split("_"))


class NodeCondition:
    def __init__(
        self,
        *,
        node: str,
        api_client: Any,
        heartbeat_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from kubernetes import client

        from autoclusters.integrations.k8s_events import NodeEvents

        self.node = node
        self._core = client.CoreV1Api(api_client)
        # An Event on the Node at each change of the verdict, as node-problem-detector does.
        self._events = NodeEvents(api_client)
        self._heartbeat = heartbeat_s
        self._clock = clock
        self._last: tuple[str, str, str] | None = None
        self._last_at = 0.0

    def update(self, firing: dict[str, str]) -> None:
        """`firing`: fault kind -> message, for every fault firing now."""
        try:
            self._update(firing)
        except Exception as e:  # the API server being away must not stop health checks
            log.warning("cannot set %s on node %s: %s", GPU_UNHEALTHY, self.node, e)
            self._last = None

    def _update(self, firing: dict[str, str]) -> None:
        if firing:
            faults = sorted(firing)
            want = ("True", reason_for(faults[0]), "; ".join(f"{f}: {firing[f]}" for f in faults))
        else:
            want = ("False", f"{REASON_PREFIX}Healthy", "the node agent sees no fault")
        fresh = self._clock() - self._last_at < self._heartbeat
        if want == self._last and fresh:
            return
        node = self._core.read_node_status(self.node)
        conds = list(getattr(node.status, "conditions", None) or [])
        cur = next((c for c in conds if c.type == GPU_UNHEALTHY), None)
        if not firing and (cur is None or not str(cur.reason or "").startswith(REASON_PREFIX)):
            self._last, self._last_at = want, self._clock()
            return  # never set by us, or the incident's own mark: not ours to clear
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        transition = stamp
        if cur is not None and cur.status == want[0]:
            transition = _iso(cur.last_transition_time) or stamp
        condition = {
            "type": GPU_UNHEALTHY,
            "status": want[0],
            "reason": want[1],
            "message": want[2][:1024],
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": transition,
        }
        self._core.patch_node_status(self.node, {"status": {"conditions": [condition]}})
        self._last, self._last_at = want, self._clock()
        if cur is None or (cur.status, cur.reason) != want[:2]:
            uid = str(getattr(node.metadata, "uid", "") or "")
            message = f"{GPU_UNHEALTHY}={want[0]}: {want[2]}"
            self._events.record(self.node, uid, want[1], message, warning=bool(firing))


def _iso(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, datetime):
        return v.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return str(v)
