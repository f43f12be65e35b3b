"""Which Slurm node each sandbox machine is: one mapping, machine (VM) name -> Slurm node.

On the Managed Slurm platform a VM and its Slurm node share a name (gpu-01). On the CMK
platform they do not: the node pool names its VMs (cmk-gpu-1) and the provider names the
Slurm node by the Node's hostname-override annotation (gpu-01). What the sandbox keeps by
Slurm node (the slurmd and the agent, their spools, the agent's fake GPU file, the machine's
hardware faults) must be found from the VM the cloud acts on (a reset, a replacement), and
the VM from the Slurm node (the demo breaks the machine of one of the job's nodes).

The emulated kubelet (sandbox/slinky/kubelet.py), the one that sees both names (a slurmd pod:
its Node and its Slurm node), records them in <state>/machines/slurm-nodes.json; the
machines (sandbox/machines/backend.py, in the Crusoe emulator's process) and the tools read it. An
entry outlives its Node: a replacement keeps the VM's name, and the new machine's boot
must clear the old one's faults before its Node, let alone its slurmd pod, exists.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from autoclusters.sandbox.machines.vms import VmRecord, VmRegistry
from autoclusters.sandbox.runtime.config import SandboxConfig


def _path(cfg: SandboxConfig) -> Path:
    return cfg.state_dir / "machines" / "slurm-nodes.json"


def _read(cfg: SandboxConfig) -> dict[str, str]:
    try:
        data = json.loads(_path(cfg).read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def record(cfg: SandboxConfig, seen: Mapping[str, str]) -> bool:
    """Merge what the pods say now (machine -> Slurm node); True when the file changed. A
    Slurm node has one machine: an older machine of the same node loses its entry."""
    names = _read(cfg)
    merged = {m: n for m, n in names.items() if n not in seen.values() or seen.get(m) == n}
    merged.update(seen)
    if merged == names:
        return False
    path = _path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(merged, indent=2, sort_keys=True))
    tmp.replace(path)  # the emulator's process reads it at any time
    return True


def slurm_node(cfg: SandboxConfig, machine: str) -> str:
    """The Slurm node of a VM (its own name on Managed Slurm, or when not known yet)."""
    return _read(cfg).get(machine, machine) if cfg.cmk else machine


def machine(cfg: SandboxConfig, node: str) -> str:
    """The VM of a Slurm node (the node's name on Managed Slurm, or when not known)."""
    if not cfg.cmk:
        return node
    return next((m for m, n in _read(cfg).items() if n == node), node)


def vm_of(cfg: SandboxConfig, node: str) -> VmRecord | None:
    """The VM record (sandbox/machines/vms.py, kept by VM name) of a Slurm node's machine."""
    return VmRegistry(cfg.state_dir).get(machine(cfg, node))
