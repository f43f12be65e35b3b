"""Where each node sits in the fabric, for an incident's policy snapshot: Slurm's
`topology.conf` (beside slurm.conf: a switch with Nodes= is a leaf, the switch above it
its pod), under the policy's own `topology`, which wins where both name a node. Read only
when the policy groups faults into systemic incidents (docs/systemic.md), and again only
when the file changed. A file that cannot be read leaves the policy's own topology: the
fault is then handled node by node, as without systemic incidents."""

from __future__ import annotations

import logging
from pathlib import Path

from autoclusters.core.policy import NodeTopology, Policy
from autoclusters.core.settings import Settings
from autoclusters.core.topology_conf import parse_topology_conf

log = logging.getLogger(__name__)
_read: dict[Path, tuple[float, dict[str, NodeTopology]]] = {}


def topology_conf(settings: Settings) -> Path | None:
    return settings.slurm.conf.parent / "topology.conf" if settings.slurm.conf else None


def with_fabric_topology(settings: Settings, policy: Policy) -> Policy:
    if not policy.guard.systemic.enabled or (path := topology_conf(settings)) is None:
        return policy
    try:
        mtime = path.stat().st_mtime
        seen = _read.get(path)
        if seen is None or seen[0] != mtime:
            seen = _read[path] = (mtime, parse_topology_conf(path.read_text()))
    except FileNotFoundError:
        return policy  # no topology/tree: the policy's own topology
    except OSError as e:
        log.warning("could not read %s (%s): the policy's own topology only", path, e)
        return policy
    merged = {**seen[1], **policy.topology}
    return policy.model_copy(update={"topology": merged})
