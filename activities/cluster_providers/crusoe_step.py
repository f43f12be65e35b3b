"""A provider's step against the Crusoe API: heartbeats while it runs, and a Crusoe error
leaves it as the ApplicationError the workflow reads (quota -> QuotaExceeded, capacity ->
CapacityUnavailable, both non-retryable with the provider's message; an outage keeps its
type so the step waits it out; any other refusal is a CloudError).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from temporalio.exceptions import ApplicationError

from autoclusters.activities.cloud import cloud_failure
from autoclusters.activities.heartbeat import heartbeating
from autoclusters.core.cluster import CAPACITY_UNAVAILABLE, QUOTA_EXCEEDED
from autoclusters.integrations.crusoe.errors import CrusoeError


def refused(e: CrusoeError) -> ApplicationError:
    """A Crusoe error as the workflow reads it."""
    status = getattr(e, "status", None)
    message = getattr(e, "message", None) or str(e)
    lowered = str(e).lower()
    if status == 403 and "quota" in lowered:
        return ApplicationError(message, type=QUOTA_EXCEEDED, non_retryable=True)
    if "capacity" in lowered:
        return ApplicationError(message, type=CAPACITY_UNAVAILABLE, non_retryable=True)
    return cloud_failure(e)  # an outage keeps its type (the step waits it out); else CloudError


@contextlib.asynccontextmanager
async def crusoe_step(what: str) -> AsyncIterator[None]:
    """Heartbeat `what` while the block runs; Crusoe errors leave as ApplicationErrors."""
    try:
        async with heartbeating(what):
            yield
    except CrusoeError as e:
        raise refused(e) from e
