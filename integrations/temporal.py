"""Connecting to Temporal, and the search attributes incidents carry."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.common import SearchAttributeKey
from temporalio.contrib.pydantic import pydantic_data_converter

from autoclusters.core.settings import Settings

INCIDENT_ID = SearchAttributeKey.for_keyword("IncidentId")
CLUSTER = SearchAttributeKey.for_keyword("Cluster")
NODE = SearchAttributeKey.for_keyword("Node")
FAULT = SearchAttributeKey.for_keyword("Fault")
# Kept up to date by the workflow: open, waiting_approval, resolved, failed, rejected, ...
INCIDENT_STATUS = SearchAttributeKey.for_keyword("IncidentStatus")
REPAIR_ACTION = SearchAttributeKey.for_keyword("RepairAction")  # the rung: reboot, replace, ...

SEARCH_ATTRIBUTES = [INCIDENT_ID, CLUSTER, NODE, FAULT, INCIDENT_STATUS, REPAIR_ACTION]


async def connect(settings: Settings) -> Client:
    return await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        data_converter=pydantic_data_converter,
    )
