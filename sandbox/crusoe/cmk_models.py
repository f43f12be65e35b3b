"""The bodies the Crusoe emulator's CMK cluster endpoints accept, and the add-ons it knows.

Field names follow Crusoe's public API v1 (client-go `swagger/v1`: KubernetesClusterPostRequest,
KubernetesClusterPatchRequest, KubernetesAuthenticationDetails). Unknown fields are accepted
and ignored, as the Managed Slurm bodies are; the known ones validate strictly, so a 400
names the field.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, field_validator, model_validator

__all__ = [
    "ADD_ONS",
    "AUTOCLUSTERS_ADD_ON",
    "CMK_VERSION",
    "SLURM_OPERATOR_ADD_ON",
    "CmkClusterCreate",
    "CmkClusterPatch",
]

# The version a cluster seeded without one runs: the Terraform provider's example
# (examples/resources/crusoe_kubernetes_cluster/resource.tf).
CMK_VERSION = "1.31.7-cmk.7"

# UNCONFIRMED: Crusoe's docs name no add-on string for AutoClusters (crusoe.md §1, §5); the
# API lists "autoclusters" among a version's supported_features, so that is the name used.
AUTOCLUSTERS_ADD_ON = "autoclusters"
# UNCONFIRMED: Crusoe's docs do not give the name of the Slurm operator's (Slinky) add-on.
SLURM_OPERATOR_ADD_ON = "slurm_operator"

# What a create may ask for (crusoe.md §2.4, §1: the active-testing one is named in the
# autoclusters-controller Helm chart's README). An unknown name is refused, so a product
# that misspells one finds out here rather than on Crusoe.
ADD_ONS = frozenset(
    {
        "crusoe_csi",
        "nvidia_gpu_operator",
        "nvidia_network_operator",
        "autocluster_active_testing",
        AUTOCLUSTERS_ADD_ON,
        SLURM_OPERATOR_ADD_ON,
    }
)

NAME = r"^[a-z][a-z0-9-]{0,62}$"


class CmkClusterCreate(BaseModel):
    """POST .../kubernetes/clusters: `name`, `location` and `version` are required there."""

    name: str = Field(pattern=NAME)
    location: str = Field(min_length=1)
    version: str = Field(min_length=1)
    add_ons: list[str] = Field(default_factory=list)
    subnet_id: str = ""
    private: bool = False
    cluster_cidr: str = ""
    service_cluster_ip_range: str = ""
    apiserver_extra_args: dict[str, str] = Field(default_factory=dict)
    controller_manager_extra_args: dict[str, str] = Field(default_factory=dict)
    scheduler_extra_args: dict[str, str] = Field(default_factory=dict)
    kubelogin_args: dict[str, str] = Field(default_factory=dict)

    @field_validator("add_ons")
    @classmethod
    def _known(cls, add_ons: list[str]) -> list[str]:
        for add_on in add_ons:
            if add_on not in ADD_ONS:
                known = ", ".join(sorted(ADD_ONS))
                raise ValueError(f"unknown add-on {add_on!r} (known: {known})")
        return list(dict.fromkeys(add_ons))  # a repeated name is one add-on


class CmkClusterPatch(BaseModel):
    """PATCH .../kubernetes/clusters/{id}: a map given replaces the cluster's (an empty one
    clears it), one left out is kept. Add-ons are not changed here (they have their own
    endpoint in the API, not emulated)."""

    apiserver_extra_args: dict[str, str] | None = None
    controller_manager_extra_args: dict[str, str] | None = None
    scheduler_extra_args: dict[str, str] | None = None
    kubelogin_args: dict[str, str] | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_add_ons(cls, body: Any) -> Any:
        # Ignored silently, an add-on asked for here would look installed to its caller.
        if isinstance(body, dict) and "add_ons" in body:
            raise ValueError("add_ons cannot be changed through PATCH")
        return body
