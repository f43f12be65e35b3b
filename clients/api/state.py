"""What the routers share, made once per app (`app.state.api`): the settings, the checks,
the Temporal gate, the intake, the metrics; and the API's calls to Temporal, each failure
that a retry may cure answered 503 with Retry-After."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from functools import partial
from typing import TypeVar

from fastapi import FastAPI
from temporalio.client import (
    Client,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.service import RPCError, RPCStatusCode

from autoclusters.clients import incidents, storm_calls
from autoclusters.clients.api.alertmanager import FaultMap
from autoclusters.clients.api.checks import RequestChecks
from autoclusters.clients.api.dedupe import DedupeStore
from autoclusters.clients.api.errors import Refusals
from autoclusters.clients.api.intake import Delivered, Intake, Outcome, Signal, TemporalUnavailable
from autoclusters.clients.api.metrics import ApiMetrics
from autoclusters.clients.api.open_incidents import OpenIncident, OpenIncidents
from autoclusters.clients.api.policy_cache import PolicyCache
from autoclusters.clients.api.repaired_since import Repaired, RepairedSince
from autoclusters.clients.api.resolutions import ResolutionLog
from autoclusters.clients.api.storm import StormWatch
from autoclusters.clients.api.temporal_gate import RETRYABLE, ClientFactory, TemporalGate
from autoclusters.clients.inventory import NodeInventory, SlurmInventory, StaticInventory
from autoclusters.clients.web.auth import BearerAuth
from autoclusters.clients.web.settings import ApiSettings
from autoclusters.core.fault_evidence import FaultCleared, FaultEvidence
from autoclusters.core.models import FaultReport
from autoclusters.integrations.slurm import SlurmError, UnknownNodeError

log = logging.getLogger("autoclusters.api")

T = TypeVar("T")


def inventory_for(settings: ApiSettings) -> NodeInventory:
    if settings.api_inventory == "static":
        return StaticInventory(settings.api_nodes)
    return SlurmInventory.for_settings(settings, ttl_s=settings.api_inventory_ttl_s)


class ApiState:
    def __init__(
        self, settings: ApiSettings, client_factory: ClientFactory, inventory: NodeInventory
    ) -> None:
        self.settings = settings
        self.inventory = inventory
        self.auth = BearerAuth(settings)
        self.faults = FaultMap(settings.alert_faults())
        self.metrics = ApiMetrics()
        self.resolutions = ResolutionLog()
        self.policies = PolicyCache(settings)
        self.refusals = Refusals(self.metrics, settings.api_retry_after_s)
        self.checks = RequestChecks(settings, self.auth, self.refusals, inventory, self.policies)
        self.gate = TemporalGate(
            client_factory, settings.temporal.address, settings.api_temporal_timeout_s
        )
        self.intake: Intake | None = None  # made in the server's event loop
        self.repaired = RepairedSince(settings.cluster, settings.api_repaired_since_wait_s)

    @asynccontextmanager
    async def lifespan(self, _app: FastAPI) -> AsyncIterator[None]:
        s = self.settings
        self.intake = Intake(
            self.deliver,
            dedupe=DedupeStore[Delivered](s.api_dedupe_ttl_s, s.api_dedupe_max),
            metrics=self.metrics,
            max_in_flight=s.api_max_in_flight,
            timeout_s=s.api_temporal_timeout_s,
            open_incidents=OpenIncidents(s.api_open_incident_ttl_s),
            join_flush_s=s.api_join_flush_s,
            start=self.start,
            storm=StormWatch(s.api_storm_nodes),
            deliver_all=self.deliver_all,
        )
        if not self.auth.configured:
            log.warning("no api_tokens configured: every write will be refused (401)")
        try:
            yield
        finally:
            await self.intake.close()

    async def deliver(
        self,
        node: str,
        fault: str,
        source: str,
        key: str,
        evidence: FaultEvidence | None,
        at: datetime | None,
        alerts: int = 1,
    ) -> incidents.OpenedIncident:
        """The intake's call: open or join the node's incident (its worker took the report).
        A failure a retry may cure is TemporalUnavailable."""
        return await self._to_incident(
            node,
            partial(incidents.open_incident, settings=self.settings, node=node, fault=fault,
                    opened_by=source, policy=self.policies.current(), inventory=self.inventory,
                    key=key, evidence=evidence, at=at, alerts=alerts),
        )  # fmt: skip

    async def start(
        self,
        node: str,
        fault: str,
        source: str,
        key: str,
        evidence: FaultEvidence | None,
        at: datetime | None,
        alerts: int = 1,
    ) -> storm_calls.StartedIncident:
        """The intake's call in a storm: start the node's incident with the report in it
        (Temporal's server took it; no worker yet), or find its run running already."""
        return await self._to_incident(
            node,
            partial(storm_calls.start_incident, settings=self.settings, node=node, fault=fault,
                    opened_by=source, policy=self.policies.current(), inventory=self.inventory,
                    key=key, evidence=evidence, at=at, alerts=alerts),
        )  # fmt: skip

    async def deliver_all(
        self, node: str, reports: list[FaultReport], known: OpenIncident | None = None
    ) -> incidents.OpenedIncident:
        """The intake's call for alerts it answered already, one report per fault kind:
        one update, to the run they were answered with when it is known (an ended run is
        `closing`: the intake sends them again, and the next call opens the node's next
        incident), else opening the node's incident with the first if none is open."""
        if known is None or not known.run_id:
            return await self._to_incident(
                node,
                partial(storm_calls.report_all, settings=self.settings, node=node,
                        reports=reports, policy=self.policies.current(),
                        inventory=self.inventory),
            )  # fmt: skip
        try:
            return await self._to_incident(
                node,
                partial(storm_calls.report_to_run, settings=self.settings, node=node,
                        incident_id=known.incident_id, run_id=known.run_id, reports=reports),
            )  # fmt: skip
        except RPCError as e:
            if e.status != RPCStatusCode.NOT_FOUND:
                raise
            raise TemporalUnavailable(
                f"the incident on {node} has ended ({e.message}); retry", kind="closing"
            ) from None

    async def _to_incident(self, node: str, call: Callable[[Client], Awaitable[T]]) -> T:
        client = await self.gate.client()
        try:
            return await call(client)
        except RPCError as e:
            if e.status in RETRYABLE:
                raise TemporalUnavailable(f"Temporal: {e.message}") from None
            if _not_ready(e):  # its last workflow task failed; the worker retries it
                raise TemporalUnavailable(f"Temporal: {e.message}", kind="not_ready") from None
            raise
        except WorkflowUpdateRPCTimeoutOrCancelledError:
            raise TemporalUnavailable("Temporal did not answer in time", kind="timeout") from None
        except WorkflowUpdateFailedError as e:
            # The open incident refused the report: it is closing. A retry opens a new one.
            raise TemporalUnavailable(
                f"the incident on {node} is closing ({e.cause or e}); retry", kind="closing"
            ) from None
        except UnknownNodeError:
            raise
        except SlurmError as e:  # the node list could not be read: retry later
            raise TemporalUnavailable(f"Slurm: {e}", kind="inventory") from None

    async def submit(self, signals: list[Signal], endpoint: str) -> list[Outcome]:
        """Every signal on its node's incident, or the request's refusal."""
        assert self.intake is not None, "the API's lifespan has not started"
        if not signals:
            return []
        refusals = self.refusals
        try:
            return await self.intake.submit(signals)
        except TemporalUnavailable as e:
            raise refusals.unavailable(e, endpoint) from None
        except UnknownNodeError as e:  # Slurm dropped the node between check and start
            raise refusals.refuse(404, "unknown_node", endpoint, "unknown node", str(e)) from None
        except Exception as e:  # a bug or a misconfiguration (e.g. a namespace): loud, 500
            log.exception("alerts not accepted")
            raise refusals.refuse(500, "error", endpoint, "internal error", str(e)) from None

    async def last_repairs(self, alerts: list[tuple[str, datetime]]) -> dict[str, Repaired]:
        """The newest repair of each node that closed after its alert began (see
        clients/api/repaired_since.py); {} when not asked or not known."""
        if not alerts or self.settings.api_repaired_since_wait_s <= 0:
            return {}
        try:
            client = await self.gate.client()
        except TemporalUnavailable:  # unknown: the submit that follows answers 503
            return {}
        return await self.repaired.last_repairs(client, alerts)

    async def clear(self, node: str, cleared: FaultCleared, endpoint: str) -> bool:
        """Record on the node's open incident that a fault cleared (never starts one)."""
        try:
            client = await self.gate.client()
            return await incidents.record_cleared(client, self.settings, node, cleared)
        except RPCError as e:
            if e.status in RETRYABLE:
                down = TemporalUnavailable(f"Temporal: {e.message}")
                raise self.refusals.unavailable(down, endpoint) from None
            raise
        except TemporalUnavailable as e:
            raise self.refusals.unavailable(e, endpoint) from None

    async def read(self, call: Callable[[Client], Awaitable[T]], endpoint: str) -> T:
        """`call` with the client, within api_temporal_timeout_s."""
        try:
            client = await self.gate.client()
            return await asyncio.wait_for(call(client), self.settings.api_temporal_timeout_s)
        except TemporalUnavailable as e:
            raise self.refusals.unavailable(e, endpoint) from None
        except TimeoutError:
            late = TemporalUnavailable("Temporal (or a worker, for queries) did not answer in time")
            raise self.refusals.unavailable(late, endpoint) from None
        except RPCError as e:
            if e.status in RETRYABLE:
                raise self.refusals.unavailable(e, endpoint) from None
            raise


def _not_ready(e: RPCError) -> bool:
    """The incident's workflow task failed (a worker starved of CPU missed its deadline,
    say): Temporal refuses updates until the worker's retry of the task succeeds. Seen in
    an alert storm that opened 200 incidents on a busy 2-core machine."""
    return e.status == RPCStatusCode.FAILED_PRECONDITION and (
        b"WorkflowNotReadyFailure" in (e.raw_grpc_status or b"")
    )
