"""Slurm's `topology.conf` (`TopologyType=topology/tree`, as core.cluster.render_topology
writes it) read back: where each node sits, its InfiniBand leaf and pod."""

from __future__ import annotations

from autoclusters.core import hostlist
from autoclusters.core.policy import NodeTopology

__all__ = ["parse_topology_conf"]


def parse_topology_conf(text: str) -> dict[str, NodeTopology]:
    """node -> pod/leaf from a `topology/tree` topology.conf (core.cluster.render_topology):
    a switch with Nodes= is a leaf; the switch listing it is its pod, unless that switch is
    only the root over other switches with switches."""
    leaves: dict[str, list[str]] = {}
    parents: dict[str, list[str]] = {}
    for line in text.splitlines():
        fields = dict(
            f.split("=", 1) for f in line.split() if "=" in f and not line.startswith("#")
        )
        name = fields.get("SwitchName")
        if not name:
            continue
        if "Nodes" in fields:
            leaves[name] = [n for part in _split(fields["Nodes"]) for n in hostlist.expand(part)]
        if "Switches" in fields:
            parents[name] = _split(fields["Switches"])
    out: dict[str, NodeTopology] = {}
    for leaf, nodes in leaves.items():
        pod = next((p for p, kids in parents.items() if leaf in kids), None)
        for node in nodes:
            out[node] = NodeTopology(leaf=leaf, pod=pod)
    return out


def _split(hostlist_text: str) -> list[str]:
    """Split a comma list at top level (gpu-[01-02],gpu-05 is two parts)."""
    parts, depth, cur = [], 0, ""
    for ch in hostlist_text:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [p for p in [*parts, cur] if p]
