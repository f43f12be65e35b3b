"""Cloud steps of the runbook: replace the node's machine."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from temporalio import activity
from temporalio.exceptions import ApplicationError

from autoclusters.core.models import RepairInput, RepairResult, ReplaceInput, ReplaceResult
from autoclusters.integrations.cloud import CloudError, CloudProvider


class CloudActivities:
    def __init__(self, provider: CloudProvider, heartbeat_s: float = 2.0) -> None:
        self._provider = provider
        self._heartbeat_s = heartbeat_s

    @activity.defn(name="repair_node")
    async def repair_node(self, inp: RepairInput) -> RepairResult:
        async with self._heartbeating(f"{inp.rung.value} {inp.node}"):
            return await self._provider.repair(inp.node, inp.rung, idempotency_key=inp.key)

    @activity.defn(name="replace_node")
    async def replace_node(self, inp: ReplaceInput) -> ReplaceResult:
        """The first runbook's repair; kept for incidents started under it."""
        async with self._heartbeating(f"replacing {inp.node}"):
            return await self._provider.replace(inp.node, idempotency_key=inp.incident_id)

    @contextlib.asynccontextmanager
    async def _heartbeating(self, what: str) -> AsyncIterator[None]:
        # A reboot or replacement takes minutes (the machine boots); heartbeat so a dead
        # worker is noticed in seconds, and so the workflow can cancel it.
        async def beat() -> None:
            while True:
                activity.heartbeat(what)
                await asyncio.sleep(self._heartbeat_s)

        beater = asyncio.create_task(beat())
        try:
            yield
        except CloudError as e:
            raise ApplicationError(
                str(e), type="CloudError", non_retryable=getattr(e, "non_retryable", False)
            ) from e
        finally:
            beater.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beater
