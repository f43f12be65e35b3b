"""What the Crusoe emulator keeps about Managed Slurm clusters, and the bodies it accepts.

`SlurmCluster` is the API's cluster (plus what the emulator needs to run it: the login keys,
the last configuration, the users). `SlurmConfiguration` and `SlurmUser` are the bodies of
the emulator-only (EXT) endpoints; they validate strictly so a 400 can name the field.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "BootFault",
    "ClusterStarted",
    "NodeSet",
    "SlurmCluster",
    "SlurmClusterCreate",
    "SlurmConfiguration",
    "SlurmUser",
    "vm_topology",
]

SLURM_VERSION = "22.05.8"
NODE_NAME = r"^[a-z][a-z0-9-]{0,62}$"
NODES_PER_LEAF = 4
LEAVES_PER_POD = 2

ClusterState = Literal["STATE_CREATING", "STATE_RUNNING", "STATE_DELETING", "STATE_FAILED"]


def vm_topology(name: str) -> dict[str, str]:
    """Where a VM sits in the fabric, from its name alone (gpu-01..04 share a leaf, two
    leaves a pod): the same name always lands in the same place, across restarts too."""
    digits = re.search(r"(\d+)$", name)
    index = int(digits.group(1)) - 1 if digits else sum(name.encode()) % 64
    leaf = max(index, 0) // NODES_PER_LEAF
    return {"pod": f"pod-{leaf // LEAVES_PER_POD + 1:02d}", "leaf": f"leaf-{leaf + 1:02d}"}


class Issue(BaseModel):
    code: str
    message: str


class SlurmClusterCreate(BaseModel):
    """POST .../slurm/clusters (unknown fields are accepted and ignored, as the API does)."""

    name: str = Field(pattern=r"^[a-z][a-z0-9-]{0,62}$")
    location: str = Field(min_length=1)
    login_node_type: str = "c1a.8x"
    login_replicas: int = Field(default=1, ge=1, le=8)
    root_ssh_pub_keys: list[str] = Field(default_factory=list)
    subnet_id: str = ""
    home_volume_size: str = "1TiB"
    accounting_enabled: bool = False  # EXT


class NodeSet(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NODE_NAME)
    partition: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")
    gpus_per_node: int = Field(ge=0, le=16)
    nodes: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _names(self) -> NodeSet:
        for i, node in enumerate(self.nodes):
            if not re.match(NODE_NAME, node):
                raise ValueError(f"nodes[{i}]: {node!r} is not a node name")
        return self


class SlurmConfiguration(BaseModel):
    """PUT .../configuration (EXT): the whole Slurm node layout, idempotent."""

    model_config = ConfigDict(extra="forbid")

    node_sets: list[NodeSet] = Field(default_factory=list)
    topology_conf: str = ""
    drained: dict[str, str] = Field(default_factory=dict)

    def nodes(self) -> list[str]:
        return [n for s in self.node_sets for n in s.nodes]

    def problems(self) -> list[tuple[str, str]]:
        """(field, message) for what a schema cannot say: duplicates and unknown names."""
        out: list[tuple[str, str]] = []
        seen: dict[str, int] = {}
        for i, s in enumerate(self.node_sets):
            if s.name in {t.name for t in self.node_sets[:i]}:
                out.append((f"node_sets.{i}.name", f"node set {s.name} is listed twice"))
            for node in s.nodes:
                if node in seen:
                    where = f"node_sets.{i}.nodes"
                    out.append((where, f"node {node} is already in node_sets.{seen[node]}"))
                seen.setdefault(node, i)
        for node, reason in self.drained.items():
            if node not in seen:
                out.append((f"drained.{node}", f"node {node} is in no node set"))
            if not reason or "\n" in reason or '"' in reason:
                out.append((f"drained.{node}", "the reason must be one line without quotes"))
        for line_no, line in enumerate(self.topology_conf.splitlines(), 1):
            if line.strip() and not line.lstrip().startswith(("#", "SwitchName=")):
                out.append(("topology_conf", f"line {line_no} is not a SwitchName= line"))
        return out


class SlurmUser(BaseModel):
    """POST .../users (EXT): a login user (Crusoe's SlurmUser custom resource)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    ssh_public_keys: list[str] = Field(default_factory=list)
    slurm_account: str = Field(default="", pattern=r"^$|^[a-z0-9_-]{1,63}$")


class SlurmCluster(BaseModel):
    id: str
    name: str
    project_id: str = ""
    location: str = ""
    state: ClusterState = "STATE_CREATING"
    issues: list[Issue] = Field(default_factory=list)
    login_node_endpoint: str = ""
    login_node_type: str = ""
    login_replicas: int = 1
    subnet_id: str = ""
    home_volume_size: str = ""
    version: str = SLURM_VERSION
    nodesets: list[dict[str, Any]] = Field(default_factory=list)
    accounting_enabled: bool = False  # EXT
    accounting_state: str | None = None  # EXT: null | "STATE_RUNNING"
    controller_state: str | None = None  # EXT: slurmctld, null until a configuration lists nodes
    created_at: str = ""
    # The emulator's own record (not part of the API).
    root_ssh_pub_keys: list[str] = Field(default_factory=list)
    configuration: SlurmConfiguration | None = None
    users: dict[str, SlurmUser] = Field(default_factory=dict)

    def public(self) -> dict[str, Any]:
        return self.model_dump(
            mode="json", exclude={"project_id", "root_ssh_pub_keys", "configuration", "users"}
        )


class ClusterStarted(BaseModel):
    """What a backend reports after starting (or configuring) a cluster's daemons."""

    login_node_endpoint: str = ""
    accounting_state: str | None = None
    controller_state: str | None = None


class BootFault(BaseModel):
    """POST /_emulator/boot-faults: the next `count` boots of `name` ("*": any) fail or hang."""

    name: str = Field(min_length=1)
    mode: Literal["fail", "hang"]
    count: int = Field(default=1, ge=1)
