"""Crusoe Cloud: request signing, credentials, an API v1 client, and the CloudProvider.

credentials = load_credentials()
client = CrusoeClient(credentials=credentials)
cloud = CrusoeCloud(client, cluster_id=..., node_pool_ids=[...])
"""

from autoclusters.integrations.crusoe.client import CrusoeClient
from autoclusters.integrations.crusoe.credentials import (
    DEFAULT_API_ENDPOINT,
    CredentialsError,
    CrusoeCredentials,
    load_credentials,
)
from autoclusters.integrations.crusoe.errors import (
    CrusoeError,
    CrusoeNotFound,
    CrusoeOperationFailed,
    CrusoeRequestError,
    CrusoeTimeout,
    CrusoeUnavailable,
)
from autoclusters.integrations.crusoe.provider import CrusoeCloud
from autoclusters.integrations.crusoe.resources import NodePool, Operation, OperationKind, Vm
from autoclusters.integrations.crusoe.signing import CrusoeAuth, sign, verify

__all__ = [
    "DEFAULT_API_ENDPOINT",
    "CredentialsError",
    "CrusoeAuth",
    "CrusoeClient",
    "CrusoeCloud",
    "CrusoeCredentials",
    "CrusoeError",
    "CrusoeNotFound",
    "CrusoeOperationFailed",
    "CrusoeRequestError",
    "CrusoeTimeout",
    "CrusoeUnavailable",
    "NodePool",
    "Operation",
    "OperationKind",
    "Vm",
    "load_credentials",
    "sign",
    "verify",
]
