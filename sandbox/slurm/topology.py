"""topology/tree for Slurm nodes the cluster's topology.conf does not place.

A node added by a scale-out (sandbox/slinky/autoscaler.py) is in no switch of the
topology.conf that provisioning wrote into the Controller's ConfigMap, and Slurm's
topology/tree refuses every job that asks for it ("Requested node configuration is not
available"). The emulated kubelet (sandbox/slinky/kubelet.py) hands slurmctld the ConfigMap's
topology with such nodes on a leaf switch of their own, `unplaced`, joined with the
ConfigMap's top switches under one root, so they take jobs as the others do. The ConfigMap is
left as provisioning wrote it.
"""

from __future__ import annotations

import re

UNPLACED, ROOT = "unplaced", "unplaced-root"
HEADER = "# Added by the emulated Slinky kubelet: the nodes no switch above places."


def expand(hostlist: str) -> list[str]:
    """`gpu-[01-03],cmk-gpu-3` -> each name (Slurm's hostlist syntax, one bracket per name)."""
    names: list[str] = []
    for prefix, ranges, plain in re.findall(r"([^,\[]*)\[([^\]]*)\][^,]*|([^,]+)", hostlist):
        if plain:
            names.append(plain.strip())
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            hi = hi or lo
            names += [f"{prefix}{i:0{len(lo)}d}" for i in range(int(lo), int(hi) + 1)]
    return [n for n in names if n]


def place_unplaced(topology: str, nodes: list[str]) -> str:
    """`topology` with the `nodes` it does not place on a switch of their own (unchanged when
    it places them all, or is empty: no topology/tree)."""
    if not topology.strip():
        return topology
    # Placed again from what provisioning wrote: a node gone from the list leaves it.
    if HEADER in topology:
        topology = topology[: topology.index(HEADER)]
    placed: set[str] = set()
    switches: list[str] = []
    children: set[str] = set()
    for line in topology.splitlines():
        if line.lstrip().startswith("#"):
            continue
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "SwitchName" in fields:
            switches.append(fields["SwitchName"])
            placed.update(expand(fields.get("Nodes", "")))
            children.update(expand(fields.get("Switches", "")))
    missing = [n for n in nodes if n not in placed]
    if not missing:
        return topology
    tops = [s for s in switches if s not in children]
    return "\n".join([
        topology.rstrip("\n"), HEADER,
        f"SwitchName={UNPLACED} Nodes={','.join(missing)}",
        f"SwitchName={ROOT} Switches={','.join([*tops, UNPLACED])}",
    ]) + "\n"  # fmt: skip
