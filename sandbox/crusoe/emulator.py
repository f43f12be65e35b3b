"""A local Crusoe Cloud API v1, for the sandbox and the tests.

It speaks the endpoints AutoClusters uses (VMs, VM operations, node pools (list, create,
get, PATCH count, delete; a pool refills to its count), AutoClusters
remediation, Managed Slurm clusters: `sandbox/crusoe/slurm_api.py`, CMK clusters (create
with add-ons, list, get, PATCH, delete, get-credentials, their operations):
`sandbox/crusoe/cmk_api.py`) and verifies each `/v1` request's signature and timestamp as
Crusoe does:
a request that fails gets 401 and changes nothing. Its "VMs" are whatever the `VmBackend`
makes of them (`sandbox/crusoe/world.py`). The real API's habits are kept: mutations answer
with an async operation, 409 while another operation runs on the VM, 404 for unknown ids,
400 with a message for a bad body, `{"code", "message"}` error bodies.

Test controls live beside the API under `/_emulator` (no auth; the server binds loopback):
  POST /_emulator/inject {"status", "count", "path_prefix", "method", "retry_after"}
  POST|DELETE /_emulator/delay {"seconds", "count", "path_contains", "method"}: hold the
    next matching requests back before the API sees them
  POST /_emulator/operation-failures {"count", "message"}: the next operations end FAILED
  POST /_emulator/timings {"operation_s", "boot_delay_s"}: change how long operations take
  POST /_emulator/vms {"clusters": [...], "node_pools": [...], "vms": [...]}: seed the world
    (a CMK cluster: {"id", "name", "add_ons", "state", ...}; it runs, with AutoClusters on,
    unless told otherwise)
  POST /_emulator/boot-faults {"name", "mode": "fail"|"hang", "count"}: the next boots of a
    VM name ("*": any) fail (VM FAILED) or hang (PROVISIONING until deleted)
  POST /_emulator/quota {"max_vms": N|null}: a VM create (or a node pool's create or
    growth) beyond N VMs answers 403 quota_exceeded, creating nothing
  GET /_emulator/state, GET|DELETE /_emulator/requests, GET /_emulator/health
  (the API's own GET .../operations lists take resource_id, state, lower_time_bound)
  GET /_emulator/operations[?vm_name=N][&since=RFC3339]: every operation the emulator
    performed (kept in its world, so across restarts with --state), oldest first

    python -m sandbox.crusoe.emulator --port 8787 --access-key-id K --secret-key S --project P
        [--kubeconfig PATH]  (what a CMK cluster's get-credentials hands out)
"""

from __future__ import annotations

import argparse
import importlib
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import SecretStr
from starlette.exceptions import HTTPException as StarletteHTTPException

from autoclusters.clients.web.quiet_server import QuietServer, serve
from autoclusters.sandbox.crusoe.cmk_api import cmk_router
from autoclusters.sandbox.crusoe.controls import (
    ApiError,
    Gate,
    admin_router,
    error_response,
    operations_of,
)
from autoclusters.sandbox.crusoe.controls import instant as _instant
from autoclusters.sandbox.crusoe.route_table import Handlers, RouteTable
from autoclusters.sandbox.crusoe.slurm_api import slurm_router
from autoclusters.sandbox.crusoe.world import (
    EmulatedVm,
    EmulatorConfig,
    Engine,
    InMemoryBackend,
    NodePool,
    Operation,
    OperationKind,
    VmBackend,
)

__all__ = [
    "EmulatorConfig",
    "EmulatorServer",
    "InMemoryBackend",
    "VmBackend",
    "create_app",
    "main",
]

P = "/projects/{project_id}"
_ROUTES = RouteTable()  # the app's routes, built by the first `create_app` of the process
# action -> (backend hook, state after)
ACTIONS = {
    "RESET": ("on_reset", "RUNNING"),
    "STOP": ("on_stop", "SHUTOFF"),
    "START": ("on_start", "RUNNING"),
}
UNSUPPORTED_ACTIONS = ("RESERVE", "UNRESERVE", "UPDATE")


async def _body(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise ApiError(400, "bad_request", "the request body is not JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "bad_request", "the request body must be a JSON object")
    return body


def _api(engine: Engine, router: Handlers) -> Handlers:
    world = engine.world

    def project(project_id: str) -> None:
        if project_id != engine.config.project_id:
            raise ApiError(404, "not_found", f"project {project_id} not found")

    def vm_or_404(project_id: str, vm_id: str) -> EmulatedVm:
        project(project_id)
        vm = world.vms.get(vm_id)
        if vm is None:
            raise ApiError(404, "not_found", f"VM {vm_id} not found")
        return vm

    def not_busy(vm_id: str) -> None:
        if vm_id in engine.busy:
            raise ApiError(
                409, "conflict", f"operation {engine.busy[vm_id]} is in progress on VM {vm_id}"
            )

    def operation_or_404(project_id: str, op_id: str, kind: OperationKind) -> dict[str, Any]:
        project(project_id)
        op = world.operations.get(op_id)
        if op is None or op.kind != kind:
            raise ApiError(404, "not_found", f"operation {op_id} not found")
        return op.public()

    def answer(op: Operation) -> dict[str, Any]:
        return {"operation": op.public()}

    def quota(project_id: str) -> None:
        """403 with nothing created when one more VM would exceed the project's quota."""
        limit = engine.max_vms
        used = sum(1 for vm in world.vms.values() if vm.project_id == project_id)
        if limit is not None and used + 1 > limit:
            raise ApiError(
                403,
                "quota_exceeded",
                f"quota exceeded: {used} VMs of {limit} used in project {project_id}",
            )

    # Listing operations (declared before `{vm_id}`/`{pool_id}`, which would match too).
    def list_operations(project_id: str, request: Request, kind: OperationKind) -> dict[str, Any]:
        project(project_id)
        return operations_of(world, request, kind)

    @router.get(P + "/compute/vms/instances/operations")
    async def vm_operations(project_id: str, request: Request) -> dict[str, Any]:
        return list_operations(project_id, request, "vm")

    @router.get(P + "/kubernetes/nodepools/operations")
    async def pool_operations(project_id: str, request: Request) -> dict[str, Any]:
        return list_operations(project_id, request, "node_pool")

    @router.get(P + "/kubernetes/autocluster-operations")
    async def autocluster_operations(project_id: str, request: Request) -> dict[str, Any]:
        return list_operations(project_id, request, "autocluster")

    @router.get(P + "/compute/vms/instances")
    async def list_vms(project_id: str, request: Request) -> dict[str, Any]:
        project(project_id)

        def wanted(field: str) -> set[str]:
            values = request.query_params.getlist(field)
            return {v for value in values for v in value.split(",") if v}

        names, ids, states = wanted("names"), wanted("ids"), wanted("states")
        items = [
            vm.model_dump()
            for vm in world.vms.values()
            if (not names or vm.name in names)
            and (not ids or vm.id in ids)
            and (not states or vm.state in states)
        ]
        return {"items": items}

    @router.post(P + "/compute/vms/instances")
    async def create_vm(project_id: str, request: Request) -> dict[str, Any]:
        project(project_id)
        body = await _body(request)
        for field in ("name", "type", "location"):
            if not isinstance(body.get(field), str) or not body[field]:
                raise ApiError(400, "bad_request", f"{field} is required")
        if world.vm_named(body["name"]) is not None:
            raise ApiError(400, "bad_request", f"a VM named {body['name']} already exists")
        quota(project_id)
        spec = {k: v for k, v in body.items() if k not in ("id", "state", "created_at")}
        vm = EmulatedVm.model_validate({**spec, "project_id": project_id, "state": "DEFINING"})
        world.vms[vm.id] = vm
        fault = engine.take_boot_fault(vm.name)

        async def work(op: Operation) -> None:
            await engine.boot(vm, fault)

        return answer(engine.start("vm", vm.id, work, {"vm_id": vm.id, "action": "CREATE"}))

    @router.get(P + "/compute/vms/instances/operations/{op_id}")
    async def vm_operation(project_id: str, op_id: str) -> dict[str, Any]:
        return operation_or_404(project_id, op_id, "vm")

    @router.get(P + "/compute/vms/instances/{vm_id}")
    async def get_vm(project_id: str, vm_id: str) -> dict[str, Any]:
        return vm_or_404(project_id, vm_id).model_dump()

    @router.patch(P + "/compute/vms/instances/{vm_id}")
    async def patch_vm(project_id: str, vm_id: str, request: Request) -> dict[str, Any]:
        vm = vm_or_404(project_id, vm_id)
        action = (await _body(request)).get("action")
        if action in UNSUPPORTED_ACTIONS:
            raise ApiError(400, "bad_request", f"action {action} is not supported here")
        if not isinstance(action, str) or action not in ACTIONS:
            expected = ", ".join(sorted(ACTIONS))
            raise ApiError(400, "bad_request", f"unknown action {action!r}: expected {expected}")
        not_busy(vm.id)
        hook, state_after = ACTIONS[action]

        async def work(op: Operation) -> None:
            await getattr(engine.backend, hook)(vm.model_copy())
            vm.state = state_after

        return answer(engine.start("vm", vm.id, work, {"vm_id": vm.id, "action": action}))

    @router.delete(P + "/compute/vms/instances/{vm_id}")
    async def delete_vm(project_id: str, vm_id: str) -> dict[str, Any]:
        vm = vm_or_404(project_id, vm_id)
        engine.release_hang(vm.id)  # a boot that hangs ends with its VM
        not_busy(vm.id)

        async def work(op: Operation) -> None:
            pool = await engine.remove(vm)
            if pool is not None and pool.wants_replacement():
                engine.replace_later(pool, vm)

        return answer(engine.start("vm", vm.id, work, {"vm_id": vm.id, "action": "DELETE"}))

    @router.get(P + "/kubernetes/nodepools/operations/{op_id}")
    async def pool_operation(project_id: str, op_id: str) -> dict[str, Any]:
        return operation_or_404(project_id, op_id, "node_pool")

    def pool_or_404(project_id: str, pool_id: str) -> NodePool:
        project(project_id)
        pool = world.pools.get(pool_id)
        if pool is None:
            raise ApiError(404, "not_found", f"node pool {pool_id} not found")
        return pool

    def pool_quota(project_id: str, more: int) -> None:
        """403 with nothing created when `more` VMs would exceed the project's quota."""
        limit = engine.max_vms
        used = sum(1 for vm in world.vms.values() if vm.project_id == project_id)
        if limit is not None and more > 0 and used + more > limit:
            raise ApiError(
                403,
                "quota_exceeded",
                f"quota exceeded: {used} VMs of {limit} used in project {project_id}, "
                f"{more} more requested",
            )

    def not_busy_pool(pool: NodePool) -> None:
        if pool.id in engine.busy:
            raise ApiError(
                409,
                "conflict",
                f"operation {engine.busy[pool.id]} is in progress on node pool {pool.id}",
            )

    def pool_count(body: dict[str, Any], default: int | None = None) -> int:
        count = body.get("count", default)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ApiError(400, "bad_request", "count must be an integer >= 0")
        return count

    def booting(pool: NodePool, n: int) -> Callable[[Operation], Awaitable[None]]:
        """The pool's operation: its `n` new VMs are defined now and boot in the
        background; the pool is STATE_RUNNING when the operation ends."""
        new = engine.grow_pool(pool, n)

        async def work(op: Operation) -> None:
            for vm in new:
                engine.boot_later(vm)
            pool.state = "STATE_RUNNING"

        return work

    @router.get(P + "/kubernetes/nodepools")
    async def list_pools(project_id: str) -> dict[str, Any]:
        project(project_id)
        return {"items": [p.public() for p in world.pools.values() if p.project_id == project_id]}

    @router.post(P + "/kubernetes/nodepools")
    async def create_pool(project_id: str, request: Request) -> dict[str, Any]:
        """§2.4: `cluster_id`, `name`, `product_name`, `count`, `node_labels`,
        `node_taints`, `transport_partition_id` (`ib_partition_id`, deprecated)."""
        project(project_id)
        body = await _body(request)
        for field in ("cluster_id", "name", "product_name"):
            if not isinstance(body.get(field), str) or not body[field]:
                raise ApiError(400, "bad_request", f"{field} is required")
        if body["cluster_id"] not in world.clusters:
            raise ApiError(404, "not_found", f"cluster {body['cluster_id']} not found")
        count = pool_count(body, 1)
        labels = body.get("node_labels") or {}
        if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise ApiError(400, "bad_request", "node_labels must map strings to strings")
        pool_quota(project_id, count)
        pool = NodePool(
            name=body["name"],
            cluster_id=body["cluster_id"],
            project_id=project_id,
            count=count,
            state="STATE_PROVISIONING",
            product_name=body["product_name"],
            location=str(body.get("location") or ""),
            node_labels=labels,
            node_taints=list(body.get("node_taints") or []),
            transport_partition_id=body.get("transport_partition_id")
            or body.get("ib_partition_id"),
        )
        world.pools[pool.id] = pool
        meta = {"node_pool_id": pool.id, "action": "CREATE"}
        op = engine.start("node_pool", pool.id, booting(pool, count), meta, resource_name=pool.name)
        return answer(op)

    @router.patch(P + "/kubernetes/nodepools/{pool_id}")
    async def patch_pool(project_id: str, pool_id: str, request: Request) -> dict[str, Any]:
        """`{count, node_labels, node_taints}` (action UPDATE, the default). A larger count
        makes VMs; a smaller one deletes none: the caller deletes the VMs it chose (as
        Crusoe's autoscaler does, §2.4), and the pool no longer replaces them."""
        pool = pool_or_404(project_id, pool_id)
        body = await _body(request)
        action = body.get("action", "UPDATE")
        if action in ("RESERVE", "UNRESERVE"):
            raise ApiError(400, "bad_request", f"action {action} is not supported here")
        if action != "UPDATE":
            raise ApiError(400, "bad_request", f"unknown action {action!r}")
        not_busy_pool(pool)
        count = pool_count(body, pool.count)
        grow = max(0, count - len(pool.instance_ids) - len(pool.pending))
        pool_quota(project_id, grow)
        if isinstance(body.get("node_labels"), dict):
            pool.node_labels = {str(k): str(v) for k, v in body["node_labels"].items()}
        if isinstance(body.get("node_taints"), list):
            pool.node_taints = list(body["node_taints"])
        pool.count = count
        meta = {"node_pool_id": pool.id, "action": "UPDATE", "count": count}
        op = engine.start("node_pool", pool.id, booting(pool, grow), meta, resource_name=pool.name)
        return answer(op)

    @router.delete(P + "/kubernetes/nodepools/{pool_id}")
    async def delete_pool(project_id: str, pool_id: str) -> dict[str, Any]:
        """The pool and its VMs."""
        pool = pool_or_404(project_id, pool_id)
        not_busy_pool(pool)
        pool.state = "STATE_DELETING"

        async def work(op: Operation) -> None:
            pool.count = 0
            for vm_id in list(pool.instance_ids):
                vm = world.vms.get(vm_id)
                if vm is not None:
                    engine.release_hang(vm.id)
                    await engine.remove(vm)
            pool.pending.clear()
            world.pools.pop(pool.id, None)

        meta = {"node_pool_id": pool.id, "action": "DELETE"}
        return answer(engine.start("node_pool", pool.id, work, meta, resource_name=pool.name))

    @router.get(P + "/kubernetes/nodepools/{pool_id}")
    async def get_pool(project_id: str, pool_id: str) -> dict[str, Any]:
        return pool_or_404(project_id, pool_id).public()

    @router.get(P + "/kubernetes/nodepools/{pool_id}/vms")
    async def pool_vms(project_id: str, pool_id: str) -> dict[str, Any]:
        pool = pool_or_404(project_id, pool_id)
        vms = [world.vms[i].model_dump() for i in pool.instance_ids if i in world.vms]
        return {"items": vms}

    @router.post(P + "/kubernetes/clusters/{cluster_id}/autoclusters/vms/{vm_id}/remediate")
    async def remediate(project_id: str, cluster_id: str, vm_id: str) -> dict[str, Any]:
        project(project_id)
        cluster = world.clusters.get(cluster_id)
        if cluster is None:
            raise ApiError(404, "not_found", f"cluster {cluster_id} not found")
        if not cluster.autoclusters:
            raise ApiError(400, "bad_request", f"AutoClusters is not enabled on {cluster_id}")
        vm = vm_or_404(project_id, vm_id)
        pool = world.pool_of(vm.id)
        if pool is None or pool.cluster_id != cluster_id:
            raise ApiError(400, "bad_request", f"VM {vm_id} is not a node of {cluster_id}")
        not_busy(vm.id)

        async def work(op: Operation) -> None:
            spec = engine.successor_spec(vm)
            await engine.remove(vm)
            new = EmulatedVm.model_validate(spec)
            pool.instance_ids.append(new.id)
            op.metadata["new_vm_id"] = new.id
            await engine.boot(new)

        meta = {"operation_type": "REPLACE_NODE", "cluster_id": cluster_id, "vm_id": vm.id}
        return answer(engine.start("autocluster", vm.id, work, meta))

    @router.get(P + "/kubernetes/autocluster-operations/{op_id}")
    async def autocluster_operation(project_id: str, op_id: str) -> dict[str, Any]:
        return operation_or_404(project_id, op_id, "autocluster")

    return router


def create_app(config: EmulatorConfig, backend: VmBackend | None = None) -> FastAPI:
    """The emulator as an ASGI app; `app.state.engine` holds its world."""
    engine = Engine(config, backend if backend is not None else InMemoryBackend())
    gate = Gate(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.resume()
        yield
        await engine.stop()

    app = FastAPI(lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None)
    app.state.engine, app.state.gate = engine, gate
    app.middleware("http")(gate)
    # This app's endpoints, closures over its engine and gate, answer the routes FastAPI
    # analyses once per process (sandbox.crusoe.route_table: ~40 ms of CPU an app otherwise).
    handlers = Handlers()
    slurm_router(engine, handlers.under("/v1"))  # before `_api`'s `{vm_id}` paths
    cmk_router(engine, handlers.under("/v1"))
    _api(engine, handlers.under("/v1"))
    admin_router(engine, gate, handlers.under("/_emulator"))

    @handlers.under("").get("/_emulator/operations")
    async def operations(vm_name: str | None = None, since: str | None = None) -> dict[str, Any]:
        """The emulator's own record of the operations it performed (read-only)."""
        after = _instant(since) if since is not None else None
        ops = [
            op.record()
            for op in engine.world.operations.values()
            if (vm_name is None or op.resource_name == vm_name)
            and (after is None or _instant(op.started_at) >= after)
        ]
        return {"operations": sorted(ops, key=lambda o: _instant(o["started_at"]))}

    _ROUTES.install(app, handlers)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError) -> Response:
        return error_response(e.status, e.code, e.message)

    @app.exception_handler(RequestValidationError)
    async def bad_body(request: Request, e: RequestValidationError) -> Response:
        first = e.errors()[0] if e.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return error_response(400, "bad_request", f"{where}: {first.get('msg', 'invalid request')}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> Response:
        return error_response(
            e.status_code, "not_found" if e.status_code == 404 else "error", str(e.detail)
        )

    return app


class EmulatorServer:
    """Serves an app on 127.0.0.1 from a background thread; `stop()` ends the thread.

    Example:
        with EmulatorServer(create_app(config)) as server:
            endpoint = server.url + "/v1"
    """

    def __init__(self, app: FastAPI, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app = app
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = self._sock.getsockname()[:2]
        config = uvicorn.Config(app, log_level="warning", lifespan="on")
        self._server = QuietServer(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 10.0) -> EmulatorServer:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the Crusoe emulator did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._server.should_exit = True  # wakes its loop at once
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self._sock.close()

    def __enter__(self) -> EmulatorServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m sandbox.crusoe.emulator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--access-key-id", required=True)
    ap.add_argument(
        "--secret-key",
        default=os.environ.get("CRUSOE_SECRET_KEY"),
        help="base64url secret key (default: $CRUSOE_SECRET_KEY, kept out of `ps`)",
    )
    ap.add_argument("--project", required=True, help="the one project id it serves")
    ap.add_argument("--state", type=Path, default=None, help="JSON file keeping the world")
    ap.add_argument("--max-skew-s", type=float, default=300.0)
    ap.add_argument("--operation-s", type=float, default=0.5)
    ap.add_argument("--boot-delay-s", type=float, default=2.0)
    ap.add_argument(
        "--backend",
        default=None,
        help="MODULE:CALLABLE making the VmBackend (default: in memory, no machines)",
    )
    ap.add_argument("--backend-arg", default=None, help="one string passed to --backend")
    ap.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="the kubeconfig a CMK cluster's get-credentials hands out (default: none; "
        "get-credentials answers 404)",
    )
    args = ap.parse_args(argv)
    if not args.secret_key:
        ap.error("--secret-key or CRUSOE_SECRET_KEY is required")
    config = EmulatorConfig(
        access_key_id=args.access_key_id,
        secret_key=SecretStr(args.secret_key),
        project_id=args.project,
        max_skew_s=args.max_skew_s,
        operation_s=args.operation_s,
        boot_delay_s=args.boot_delay_s,
        state_file=args.state,
        kubeconfig=args.kubeconfig,
    )
    backend = _load_backend(args.backend, args.backend_arg) if args.backend else None
    app = create_app(config, backend)
    serve(app, host=args.host, port=args.port, log_level="warning")


def _load_backend(spec: str, arg: str | None) -> VmBackend:
    module_name, _, attr = spec.partition(":")
    factory = getattr(importlib.import_module(module_name), attr)
    backend: VmBackend = factory(arg) if arg is not None else factory()
    return backend


if __name__ == "__main__":
    main()
