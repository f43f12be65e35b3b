"""The Crusoe API v1 resources AutoClusters reads: VMs, node pools, CMK (Kubernetes) clusters,
Managed Slurm clusters and async operations.

Only the fields we use are typed; the rest are kept (`extra="allow"`), so a VM's spec can be
copied into a create request and newer API fields do not break parsing.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "SLURM_OPERATOR_ADD_ON",
    "KubernetesCluster",
    "KubernetesCredentials",
    "NodePool",
    "Operation",
    "OperationKind",
    "OperationState",
    "SlurmCluster",
    "SlurmClusterIssue",
    "Vm",
]

OperationState = Literal["IN_PROGRESS", "SUCCEEDED", "FAILED"]
# Which `.../operations/{id}` endpoint polls an operation: each API family has its own.
OperationKind = Literal["vm", "node_pool", "autocluster", "slurm_cluster", "kubernetes_cluster"]

# The CMK add-on that runs the Slurm operator (Slinky). UNCONFIRMED: Crusoe's docs do not
# give the add-on's name; this is the Crusoe emulator's.
SLURM_OPERATOR_ADD_ON = "slurm_operator"


class Vm(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    name: str
    state: str = ""  # RUNNING, SHUTOFF, ...
    type: str = ""
    location: str = ""
    created_at: str = ""


class SlurmClusterIssue(BaseModel):
    model_config = ConfigDict(extra="allow")

    code: str = ""
    message: str = ""


class SlurmCluster(BaseModel):
    """A Managed Slurm cluster (`GET /projects/{pid}/slurm/clusters/{id}`).

    `accounting_enabled` and `accounting_state` are emulator extensions, UNCONFIRMED in
    Crusoe's public API (there, accounting is set up through the Slurm operator's CRs).
    """

    model_config = ConfigDict(extra="allow")

    id: str
    name: str
    location: str = ""
    state: str = ""  # STATE_CREATING | STATE_RUNNING | STATE_DELETING | STATE_FAILED
    issues: list[SlurmClusterIssue] = Field(default_factory=list)
    login_node_endpoint: str | None = None  # "host:port" once the login node answers
    home_volume_size: str | None = None
    version: str = ""
    nodesets: list[Any] = Field(default_factory=list)
    accounting_enabled: bool = False
    accounting_state: str | None = None

    def issues_text(self) -> str:
        return "; ".join(i.message or i.code for i in self.issues) or "no issue reported"


class KubernetesCluster(BaseModel):
    """A CMK cluster (`GET /projects/{pid}/kubernetes/clusters/{id}`, client-go's
    KubernetesCluster)."""

    model_config = ConfigDict(extra="allow")

    id: str
    name: str = ""
    location: str = ""
    state: str = ""  # STATE_RUNNING when usable
    version: str = ""
    add_ons: list[str] = Field(default_factory=list)
    node_pools: list[str] = Field(default_factory=list)  # the ids of its node pools
    created_at: str = ""


class KubernetesCredentials(BaseModel):
    """What `POST .../kubernetes/clusters/{id}/get-credentials` answers (client-go's
    KubernetesAuthenticationDetails); `kube_config` is a whole kubeconfig."""

    model_config = ConfigDict(extra="allow")

    cluster_name: str = ""
    cluster_address: str = ""
    cluster_ca_certificate: str = ""
    user_name: str = ""
    kube_config: str = ""


class NodePool(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    name: str = ""
    cluster_id: str = ""
    count: int = 0
    state: str = ""
    instance_ids: list[str] = Field(default_factory=list)


class Operation(BaseModel):
    model_config = ConfigDict(extra="allow")

    operation_id: str
    state: OperationState | str = "IN_PROGRESS"
    started_at: str = ""
    completed_at: str = ""
    metadata: Any = None
    result: Any = None

    @property
    def done(self) -> bool:
        return self.state != "IN_PROGRESS"

    def failure_message(self) -> str:
        """What a FAILED operation's `result` says (`{code, message}`), or its raw result."""
        if isinstance(self.result, dict):
            message = self.result.get("message") or self.result.get("code")
            if message:
                return str(message)
        return str(self.result) if self.result else "no message"
