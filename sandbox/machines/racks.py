"""Which rack and NVLink clique a sandbox machine is in, as its Node's labels say: what a
provider's node labeller (the rack) and NVIDIA GPU feature discovery (the clique) set on
a real cluster's Nodes, read by the API for systemic incidents (clients/fabric_topology.py).

Like the fabric (sandbox/crusoe/slurm_models.py `vm_topology`), from the Slurm node's name
alone: gpu-01..04 share rack-01 and its one NVLink clique, gpu-05..08 rack-02, so the same
node always lands in the same rack, across restarts and replacements too.
"""

from __future__ import annotations

import re
import uuid

from autoclusters.core.policy import GPU_CLIQUE_LABEL, RACK_LABEL

NODES_PER_RACK = 4


def rack_of(slurm_node: str) -> str:
    digits = re.search(r"(\d+)$", slurm_node)
    index = int(digits.group(1)) - 1 if digits else sum(slurm_node.encode()) % 64
    return f"rack-{max(index, 0) // NODES_PER_RACK + 1:02d}"


def rack_labels(slurm_node: str) -> dict[str, str]:
    """The Node's rack label and NVLink clique (`<fabric cluster uuid>.<clique id>`, one
    fabric per rack, as on a GB200 NVL72)."""
    rack = rack_of(slurm_node)
    fabric = uuid.uuid5(uuid.NAMESPACE_URL, f"autoclusters-sandbox/{rack}")
    return {RACK_LABEL: rack, GPU_CLIQUE_LABEL: f"{fabric}.1"}
