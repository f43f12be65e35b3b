"""Cloud steps of the runbook: replace the node's machine."""

from __future__ import annotations

import asyncio
import contextlib

from temporalio import activity
from temporalio.exceptions import ApplicationError

from autoclusters.cloud import CloudError, CloudProvider
from autoclusters.models import ReplaceInput, ReplaceResult


class CloudActivities:
    def __init__(self, provider: CloudProvider, heartbeat_s: float = 2.0) -> None:
        self._provider = provider
        self._heartbeat_s = heartbeat_s

    @activity.defn(name="replace_node")
    async def replace_node(self, inp: ReplaceInput) -> ReplaceResult:
        # A replacement takes minutes (the new VM boots); heartbeat so a dead worker is
        # noticed in seconds, and so the workflow can cancel it.
        async def beat() -> None:
            while True:
                activity.heartbeat(f"replacing {inp.node}")
                await asyncio.sleep(self._heartbeat_s)

        beater = asyncio.create_task(beat())
        try:
            return await self._provider.replace(inp.node, idempotency_key=inp.incident_id)
        except CloudError as e:
            raise ApplicationError(str(e), type="CloudError") from e
        finally:
            beater.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beater
