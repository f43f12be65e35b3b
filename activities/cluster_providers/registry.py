"""Which provider serves a cluster: chosen by the cluster's `provider` from those this worker
was configured with, once per call, before anything is done. A provider the worker does not
have (crusoe-cmk without a kubeconfig and a CMK cluster id, or a name it does not know) is
refused as ProviderUnavailable, non-retryable: no retry on this worker can serve it.
"""

from __future__ import annotations

from collections.abc import Mapping

from temporalio.exceptions import ApplicationError

from autoclusters.activities.cluster_providers.base import ClusterProvider
from autoclusters.activities.cluster_providers.managed_slurm import ManagedSlurmProvider
from autoclusters.core.cluster import ClusterRef
from autoclusters.integrations.crusoe.client import CrusoeClient
from autoclusters.integrations.slurm import SlurmBatchClient

PROVIDER_UNAVAILABLE = "ProviderUnavailable"
MANAGED_SLURM = ("sandbox", "crusoe-managed-slurm")
CMK = "crusoe-cmk"  # served by cmk.py when the worker is configured for it


class Providers:
    """The providers a worker serves, by provider name."""

    def __init__(self, served: Mapping[str, ClusterProvider]) -> None:
        self._served = dict(served)

    def serving(self, ref: ClusterRef) -> ClusterProvider:
        """The provider of `ref`'s cluster; ProviderUnavailable when this worker has none."""
        provider = self._served.get(ref.provider)
        if provider is None:
            raise ApplicationError(
                f"provider {ref.provider} is not available on this worker: cluster {ref.name} "
                f"cannot be provisioned, scaled or deleted through it (crusoe-cmk needs the "
                f"worker's kubeconfig and [crusoe] cluster_id; or use sandbox or "
                f"crusoe-managed-slurm)",
                type=PROVIDER_UNAVAILABLE,
                non_retryable=True,
            )
        return provider


def worker_providers(
    crusoe: CrusoeClient,
    slurm: SlurmBatchClient,
    *,
    poll_s: float,
    register_timeout_s: float,
    acceptance_timeout_s: float,
    cmk: ClusterProvider | None,
) -> Providers:
    """Managed Slurm for providers sandbox and crusoe-managed-slurm on `crusoe`, and `cmk`
    (built by the worker when it has a CMK configuration) for crusoe-cmk."""
    managed = ManagedSlurmProvider(
        crusoe,
        slurm,
        poll_s=poll_s,
        register_timeout_s=register_timeout_s,
        acceptance_timeout_s=acceptance_timeout_s,
    )
    served: dict[str, ClusterProvider] = dict.fromkeys(MANAGED_SLURM, managed)
    if cmk is not None:
        served[CMK] = cmk
    return Providers(served)
