"""Connecting to Temporal, and the search attributes incidents carry."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.common import SearchAttributeKey
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import TLSConfig

from autoclusters.core.settings import Settings

INCIDENT_ID = SearchAttributeKey.for_keyword("IncidentId")
CLUSTER = SearchAttributeKey.for_keyword("Cluster")
NODE = SearchAttributeKey.for_keyword("Node")
FAULT = SearchAttributeKey.for_keyword("Fault")
# Kept up to date by the workflow: open, waiting_approval, resolved, failed, rejected, ...
INCIDENT_STATUS = SearchAttributeKey.for_keyword("IncidentStatus")
REPAIR_ACTION = SearchAttributeKey.for_keyword("RepairAction")  # the rung: reboot, replace, ...

SEARCH_ATTRIBUTES = [INCIDENT_ID, CLUSTER, NODE, FAULT, INCIDENT_STATUS, REPAIR_ACTION]


def quoted(value: str) -> str:
    """`value` as a string literal in a visibility query."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def tls_config(settings: Settings) -> TLSConfig | bool:
    """TLS for the connection: a TLSConfig when any certificate setting is given, True for
    TLS with the system's roots (`[temporal] tls`, or an API key), False for plaintext."""
    if settings.temporal.tls_cert is not None or settings.temporal.tls_key is not None:
        if settings.temporal.tls_cert is None or settings.temporal.tls_key is None:
            raise ValueError("mTLS needs both [temporal] tls_cert and tls_key")
    files = (settings.temporal.tls_cert, settings.temporal.tls_key, settings.temporal.tls_ca)
    if any(files) or settings.temporal.tls_server_name:
        cert, key, ca = (f.read_bytes() if f is not None else None for f in files)
        return TLSConfig(
            server_root_ca_cert=ca,
            client_cert=cert,
            client_private_key=key,
            domain=settings.temporal.tls_server_name,
        )
    return settings.temporal.tls or settings.temporal.api_key is not None


async def connect(settings: Settings) -> Client:
    api_key = settings.temporal.api_key
    return await Client.connect(
        settings.temporal.address,
        namespace=settings.temporal.namespace,
        data_converter=pydantic_data_converter,
        tls=tls_config(settings),
        api_key=api_key.get_secret_value() if api_key is not None else None,
    )
