"""How many machines the sandbox's autoscaler lets a node group grow to.

Apart from the autoscaler (sandbox/slinky/autoscaler.py), which loads the Kubernetes client:
`sandbox up` writes the bound on the operator's command line in every mode, and a plain boot
needs no Kubernetes client (~0.25 s of CPU to load).
"""

from __future__ import annotations

from autoclusters.sandbox.runtime.config import MAX_AGENT_PORTS, SandboxConfig

# Machines `kubectl scale nodeset` may add beyond the sandbox's own.
SCALE_OUT_ROOM = 2


def max_nodes(cfg: SandboxConfig) -> int:
    """How many machines the autoscaler lets a NodeSet's node group grow to: the sandbox's
    and SCALE_OUT_ROOM more (each is a slurmd and an agent on this host; and never past the
    sandbox's slurmd and agent ports)."""
    return min(cfg.nodes + cfg.spares + SCALE_OUT_ROOM, MAX_AGENT_PORTS)
