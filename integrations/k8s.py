"""The Kubernetes API client (the vocabulary and step models are in core/kubernetes.py)."""

from __future__ import annotations

from pathlib import Path

from kubernetes import client, config


def api_client(
    *, kubeconfig: Path | str | None = None, context: str | None = None
) -> client.ApiClient:
    """A client for the cluster in `kubeconfig` (its `context`), or the in-cluster service account.

    Each call gets its own `Configuration`, so two clusters can be talked to side by side.
    """
    if kubeconfig is None:
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
        return client.ApiClient(configuration)
    return config.new_client_from_config(
        config_file=str(kubeconfig), context=context, persist_config=False
    )
