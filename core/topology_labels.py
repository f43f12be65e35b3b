"""Where each node sits, from its Kubernetes Node's labels, and the one map an incident
opens with: per node and level, the policy's `topology` first, then the Nodes' labels
(the policy's `topology_labels` keys), then Slurm's `topology.conf` (docs/systemic.md
"Topology"). A level no source names stays unknown: the node is no member at that level.
"""

from __future__ import annotations

from collections.abc import Mapping

from autoclusters.core.policy import NodeTopology, TopologyLabels

__all__ = ["merged_topology", "topology_from_labels"]


def _first(labels: Mapping[str, str], keys: list[str]) -> str | None:
    """The value of the first of `keys` the Node carries (an empty value says nothing)."""
    return next((labels[k] for k in keys if labels.get(k)), None)


def topology_from_labels(
    labels: Mapping[str, Mapping[str, str]], keys: TopologyLabels
) -> dict[str, NodeTopology]:
    """Slurm node -> its leaf, pod, NVLink domain and rack as its Node's labels name them;
    a node whose Node names none is left out."""
    out: dict[str, NodeTopology] = {}
    for node in sorted(labels):
        node_labels = labels[node]
        where = NodeTopology(
            leaf=_first(node_labels, keys.leaf),
            pod=_first(node_labels, keys.pod),
            nvlink=_first(node_labels, keys.nvlink),
            rack=_first(node_labels, keys.rack),
        )
        if where != NodeTopology():
            out[node] = where
    return out


def merged_topology(
    *,
    policy: Mapping[str, NodeTopology],
    labels: Mapping[str, NodeTopology],
    conf: Mapping[str, NodeTopology],
) -> dict[str, NodeTopology]:
    """Per node and per level, the first source that names it: the policy, the Nodes'
    labels, topology.conf. Level by level, so a policy that names only a node's rack keeps
    the leaf topology.conf gives it."""
    out: dict[str, NodeTopology] = {}
    for node in sorted({*policy, *labels, *conf}):
        said = [t for t in (policy.get(node), labels.get(node), conf.get(node)) if t is not None]
        out[node] = NodeTopology(
            leaf=next((t.leaf for t in said if t.leaf), None),
            pod=next((t.pod for t in said if t.pod), None),
            nvlink=next((t.nvlink for t in said if t.nvlink), None),
            rack=next((t.rack for t in said if t.rack), None),
        )
    return out
