"""The Crusoe emulator's front door and test controls.

`Gate` stands in front of `/v1`: it records every request, holds a request back for a while
when a delay rule matches it (a slow API: chaos uses it to crash a worker whose call has
not reached the cloud yet), answers injected faults (a 429 or a 503 before the API sees the
request), and checks the signature and timestamp, answering
401 with nothing changed when they fail. `admin_router` serves `/_emulator`: fault
injection, failing operations, seeding VMs, node pools and clusters, and reading back the
world and the requests seen. It has no auth: the emulator binds loopback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from autoclusters.sandbox.crusoe import signature as crusoe_signature
from autoclusters.sandbox.crusoe.route_table import Handlers
from autoclusters.sandbox.crusoe.slurm_models import BootFault
from autoclusters.sandbox.crusoe.world import (
    Cluster,
    EmulatedVm,
    EmulatorConfig,
    Engine,
    NodePool,
    OperationKind,
    World,
)

__all__ = [
    "ApiError",
    "DelayRule",
    "FaultRule",
    "Gate",
    "RequestSeen",
    "Seed",
    "admin_router",
    "error_response",
    "instant",
    "operations_of",
]


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def instant(rfc3339: str) -> datetime:
    try:
        t = datetime.fromisoformat(rfc3339.replace("Z", "+00:00"))
    except ValueError as e:
        raise ApiError(400, "bad_request", f"not an RFC 3339 time: {rfc3339!r}") from e
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def operations_of(world: World, request: Request, kind: OperationKind) -> dict[str, Any]:
    """An operations list: `resource_id`, `state` and `lower_time_bound` filter as in the
    API's listComputeVMsInstancesOperations; this emulator lists completed ones too."""
    q = request.query_params
    after = instant(q["lower_time_bound"]) if q.get("lower_time_bound") else None
    states = {s for v in q.getlist("state") for s in v.split(",") if s}
    ops = [
        op
        for op in world.operations.values()
        if op.kind == kind
        and (not q.get("resource_id") or op.resource_id == q["resource_id"])
        and (not states or op.state in states)
        and (after is None or instant(op.started_at) >= after)
    ]
    return {"items": [op.public() for op in sorted(ops, key=lambda o: o.started_at)]}


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> Response:
    return JSONResponse({"code": code, "message": message}, status_code=status, headers=headers)


class FaultRule(BaseModel):
    status: int = Field(ge=400, le=599)
    count: int = Field(default=1, ge=1)
    path_prefix: str = "/v1"
    method: str | None = None
    retry_after: float | None = None
    message: str = "injected fault"


class DelayRule(BaseModel):
    """Hold the next `count` requests whose method matches and whose path contains
    `path_contains` for `seconds` before the API sees them (a slow network or API)."""

    seconds: float = Field(gt=0, le=600)
    count: int = Field(default=1, ge=1)
    path_contains: str = "/v1/"
    method: str | None = None


class RequestSeen(BaseModel):
    method: str
    path: str
    query: str
    status: int = 0


class Gate:
    """In front of `/v1`: records each request, answers injected faults, checks signatures."""

    def __init__(self, config: EmulatorConfig) -> None:
        self.config = config
        self.faults: list[FaultRule] = []
        self.delays: list[DelayRule] = []
        self.seen: list[RequestSeen] = []

    def _take_fault(self, method: str, path: str) -> FaultRule | None:
        for rule in self.faults:
            if path.startswith(rule.path_prefix) and rule.method in (None, method):
                rule.count -= 1
                if rule.count == 0:
                    self.faults.remove(rule)
                return rule
        return None

    def _take_delay(self, method: str, path: str) -> DelayRule | None:
        for rule in self.delays:
            if rule.path_contains in path and rule.method in (None, method):
                rule.count -= 1
                if rule.count == 0:
                    self.delays.remove(rule)
                return rule
        return None

    async def __call__(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        path: str = request.scope["path"]
        if not path.startswith("/v1/"):
            return await call_next(request)
        query: bytes = request.scope["query_string"]
        entry = RequestSeen(method=request.method, path=path, query=query.decode("latin-1"))
        self.seen.append(entry)
        delay = self._take_delay(request.method, path)
        if delay is not None:
            await asyncio.sleep(delay.seconds)
        fault = self._take_fault(request.method, path)
        if fault is not None:
            entry.status = fault.status
            headers = {"Retry-After": f"{fault.retry_after:g}"} if fault.retry_after else None
            return error_response(fault.status, "injected", fault.message, headers)
        try:
            # Our own check, written from the public algorithm: not the client's code.
            crusoe_signature.check(
                method=request.method,
                raw_path=request.scope.get("raw_path") or path.encode(),
                raw_query=query,
                headers=dict(request.headers),
                access_key_id=self.config.access_key_id,
                secret=self.config.secret_key.get_secret_value(),
                max_skew=timedelta(seconds=self.config.max_skew_s),
            )
        except crusoe_signature.Refused as e:
            entry.status = 401
            return error_response(401, "unauthorized", str(e))
        response = await call_next(request)
        entry.status = response.status_code
        return response


class SeedVm(EmulatedVm):
    model_config = ConfigDict(extra="allow")

    node_pool_id: str | None = None


class Seed(BaseModel):
    clusters: list[Cluster] = Field(default_factory=list)
    node_pools: list[NodePool] = Field(default_factory=list)
    vms: list[SeedVm] = Field(default_factory=list)


class OperationFailures(BaseModel):
    count: int = Field(default=1, ge=1)
    message: str = "injected operation failure"


class Quota(BaseModel):
    max_vms: int | None = Field(default=None, ge=0)


class Timings(BaseModel):
    operation_s: float | None = Field(default=None, ge=0)
    boot_delay_s: float | None = Field(default=None, ge=0)


def admin_router(engine: Engine, gate: Gate, router: Handlers) -> Handlers:
    """Write the endpoints, closures over `engine` and `gate`, into `router`
    (sandbox.crusoe.route_table)."""
    world = engine.world

    @router.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @router.post("/inject")
    async def inject(rule: FaultRule) -> dict[str, int]:
        gate.faults.append(rule)
        return {"faults": len(gate.faults)}

    @router.delete("/inject")
    async def clear_faults() -> dict[str, int]:
        gate.faults.clear()
        return {"faults": 0}

    @router.post("/delay")
    async def delay(rule: DelayRule) -> dict[str, int]:
        gate.delays.append(rule)
        return {"delays": len(gate.delays)}

    @router.delete("/delay")
    async def clear_delays() -> dict[str, int]:
        gate.delays.clear()
        return {"delays": 0}

    @router.post("/operation-failures")
    async def fail_operations(spec: OperationFailures) -> dict[str, int]:
        engine.failures += [spec.message] * spec.count
        return {"pending": len(engine.failures)}

    @router.post("/boot-faults")
    async def boot_faults(fault: BootFault) -> dict[str, int]:
        engine.boot_faults.append(fault)
        return {"boot_faults": len(engine.boot_faults)}

    @router.delete("/boot-faults")
    async def clear_boot_faults() -> dict[str, int]:
        engine.boot_faults.clear()
        return {"boot_faults": 0}

    @router.post("/quota")
    async def quota(new: Quota) -> dict[str, int | None]:
        engine.max_vms = new.max_vms
        return {"max_vms": engine.max_vms}

    @router.post("/timings")
    async def timings(new: Timings) -> dict[str, float]:
        """Slow operations down (or speed them up) from here on."""
        config = engine.config
        if new.operation_s is not None:
            config.operation_s = new.operation_s
        if new.boot_delay_s is not None:
            config.boot_delay_s = new.boot_delay_s
        return {"operation_s": config.operation_s, "boot_delay_s": config.boot_delay_s}

    @router.post("/vms")
    async def seed(seed: Seed) -> dict[str, Any]:
        pid = engine.config.project_id
        for cluster in seed.clusters:
            world.clusters[cluster.id] = cluster.model_copy(update={"project_id": pid})
        for pool in seed.node_pools:
            world.pools[pool.id] = pool.model_copy(update={"project_id": pid})
        vms = []
        for item in seed.vms:
            pool_id = item.node_pool_id
            if pool_id is not None and pool_id not in world.pools:
                raise ApiError(400, "bad_request", f"node pool {pool_id} not found")
            vm = EmulatedVm.model_validate(
                {**item.model_dump(exclude={"node_pool_id"}), "project_id": pid}
            )
            world.vms[vm.id] = vm
            if pool_id is not None:
                world.pools[pool_id].instance_ids.append(vm.id)
                world.pools[pool_id].count += 1
            vms.append(vm.model_dump())
        engine.save()
        return {"vms": vms, "node_pools": [world.pools[p.id].public() for p in seed.node_pools]}

    @router.get("/state")
    async def state() -> dict[str, Any]:
        return world.model_dump(mode="json")

    @router.get("/requests")
    async def requests() -> list[dict[str, Any]]:
        return [r.model_dump() for r in gate.seen]

    @router.delete("/requests")
    async def forget_requests() -> dict[str, int]:
        gate.seen.clear()
        return {"requests": 0}

    return router
