"""Where each node sits in the fabric, for an incident's policy snapshot. Per node and
level (leaf, pod, rack), the first source that names it (core/topology_labels.py):

1. the policy's own `topology`;
2. the labels of the node's Kubernetes Node (the policy's `topology_labels` keys: a rack
   label, NVIDIA GPU feature discovery's NVLink clique, Topograph's leaf), where the cluster
   has Kubernetes; each Node is the Slurm node the Kubernetes steps act on
   (activities/machine_of.py: Slinky's hostname-override, else the Node's own name);
3. Slurm's `topology.conf` beside slurm.conf (a switch with Nodes= is a leaf, the switch
   above it its pod).

Read only when the policy groups faults into systemic incidents (docs/systemic.md):
topology.conf again only when it changed, the Nodes at most every LABELS_MAX_AGE_S. A file
that cannot be read leaves the other sources. A failed read of the Nodes is unknown, not
"no labels": the last map read is kept (and the log says so); with none read yet, the
policy and topology.conf alone place the nodes, and the log says that too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from autoclusters.core.kubernetes import metadata_of
from autoclusters.core.policy import NodeTopology, Policy
from autoclusters.core.settings import Settings
from autoclusters.core.topology_conf import parse_topology_conf
from autoclusters.core.topology_labels import merged_topology, topology_from_labels

log = logging.getLogger(__name__)

# Racks and cliques change when machines move, not per alert: an alert storm opens many
# incidents and reads the Nodes once. The read is bounded: an API that does not answer
# delays an opening by at most LABELS_READ_BOUND_S (each request LABELS_READ_TIMEOUT_S; the
# first read also loads the client and its kubeconfig, seconds on a loaded machine).
LABELS_MAX_AGE_S = 30.0
LABELS_READ_TIMEOUT_S = 5.0
LABELS_READ_BOUND_S = 10.0


@dataclass
class _NodeLabels:
    """The last good read of one cluster's Node labels, and when a read was last tried."""

    labels: dict[str, dict[str, str]] | None = None
    read_at: float = 0.0
    tried_at: float = 0.0


_read: dict[Path, tuple[float, dict[str, NodeTopology]]] = {}
_labels: dict[Path, _NodeLabels] = {}


def topology_conf(settings: Settings) -> Path | None:
    return settings.slurm.conf.parent / "topology.conf" if settings.slurm.conf else None


def _conf_topology(settings: Settings) -> dict[str, NodeTopology]:
    """topology.conf's placements ({}: none, or the file cannot be read: logged)."""
    if (path := topology_conf(settings)) is None:
        return {}
    try:
        mtime = path.stat().st_mtime
        seen = _read.get(path)
        if seen is None or seen[0] != mtime:
            seen = _read[path] = (mtime, parse_topology_conf(path.read_text()))
    except FileNotFoundError:
        return {}  # no topology/tree
    except OSError as e:
        log.warning("could not read %s (%s): placing nodes without it", path, e)
        return {}
    return seen[1]


async def _read_node_labels(kubeconfig: Path) -> dict[str, dict[str, str]]:
    """One list of the Nodes: each Slurm node's Node's labels. Raises on a failed read
    (`KubernetesUnavailable`, the client's `ApiException`, ...), never answers {}."""
    # Loaded on a cluster with Kubernetes only: a Slurm-only API never imports the client.
    from kubernetes import client

    from autoclusters.activities.kubernetes_calls import call_json, items_of
    from autoclusters.activities.machine_of import nodes_by_slurm_node
    from autoclusters.integrations.k8s import api_client

    with api_client(kubeconfig=kubeconfig) as api:
        doc = await call_json(client.CoreV1Api(api).list_node, timeout_s=LABELS_READ_TIMEOUT_S)
    return {
        slurm_node: {str(k): str(v) for k, v in (metadata_of(node).get("labels") or {}).items()}
        for slurm_node, node in nodes_by_slurm_node(items_of(doc, "nodes")).items()
    }


async def node_labels(kubeconfig: Path) -> dict[str, dict[str, str]] | None:
    """Slurm node -> its Node's labels, read at most every LABELS_MAX_AGE_S; None: never
    read yet (unknown). A failed read keeps the last good one."""
    seen = _labels.setdefault(kubeconfig, _NodeLabels())
    now = time.monotonic()
    # With a map in hand, one read at a time: the others (a storm's openings) use it.
    if seen.labels is not None and now - seen.tried_at < LABELS_MAX_AGE_S:
        return seen.labels
    seen.tried_at = now
    try:
        # The client's own timeout is per request, and it retries a failed connection: the
        # whole read is bounded here.
        labels = await asyncio.wait_for(_read_node_labels(kubeconfig), LABELS_READ_BOUND_S)
    except Exception as e:  # noqa: BLE001 - no answer, a refusal (403: no RBAC to list
        # Nodes), a kubeconfig that cannot be used: whatever it is, the placement is unknown,
        # and never a reason not to open the incident.
        why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        if seen.labels is None:
            log.warning(
                "could not read the Kubernetes Nodes' labels (%s): none read yet, so nodes "
                "are placed by the policy and topology.conf alone",
                why,
            )
        else:
            log.warning(
                "could not read the Kubernetes Nodes' labels (%s): keeping the map read %.0f s ago",
                why,
                now - seen.read_at,
            )
        return seen.labels
    seen.labels, seen.read_at = labels, time.monotonic()
    return labels


async def with_fabric_topology(settings: Settings, policy: Policy) -> Policy:
    """`policy` with its `topology` completed from the Nodes' labels and topology.conf
    (unchanged when the policy groups nothing)."""
    if not policy.guard.systemic.enabled:
        return policy
    kubeconfig = settings.kubernetes.kubeconfig
    labels = await node_labels(kubeconfig) if kubeconfig is not None else None
    merged = merged_topology(
        policy=policy.topology,
        labels=topology_from_labels(labels or {}, policy.topology_labels),
        conf=_conf_topology(settings),
    )
    if merged == policy.topology:
        return policy
    return policy.model_copy(update={"topology": merged})
