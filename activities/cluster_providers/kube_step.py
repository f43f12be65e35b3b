"""A CMK provider's step: a Crusoe step (crusoe_step.py: heartbeats, Crusoe errors as the
workflow reads them) that also turns Kubernetes API errors into ApplicationErrors.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import urllib3.exceptions
from kubernetes.client.exceptions import ApiException
from temporalio.exceptions import ApplicationError

from autoclusters.activities.cluster_providers.crusoe_step import crusoe_step
from autoclusters.activities.kubernetes import kubernetes_outage, unavailable_error

KUBERNETES_ERROR = "KubernetesError"


@contextlib.asynccontextmanager
async def kube_step(what: str) -> AsyncIterator[None]:
    """`crusoe_step` (heartbeats; Crusoe errors as ApplicationErrors) that also turns Kubernetes
    API errors into ApplicationErrors: the API not answering (429, 5xx, status 0, no
    connection, a timeout) is `KubernetesUnavailable`, an outage; 409 is retryable; any
    other 4xx is non-retryable."""
    try:
        async with crusoe_step(what):
            yield
    except (ApiException, urllib3.exceptions.HTTPError) as e:
        outage = kubernetes_outage(e)
        if outage is not None:
            raise unavailable_error(outage) from e
        assert isinstance(e, ApiException)
        status = e.status or 0
        raise ApplicationError(
            f"Kubernetes API: {status} {e.reason}: {str(e.body or '')[:300]}",
            type=KUBERNETES_ERROR,
            non_retryable=400 <= status < 500 and status != 409,
        ) from e
