"""A Kubernetes API server emulator, for the sandbox and the tests (no kube-apiserver runs here).

The official `kubernetes` client talks to it over a real loopback socket with a bearer token,
and gets what a real API server would answer for what AutoClusters uses:

- `/api/v1/nodes[/{name}[/status]]`, `/api/v1/namespaces[/{name}]`, `/api/v1/pods`,
  `/api/v1/namespaces/{ns}/pods[/{name}[/status|/eviction]]`,
  `/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets[/{name}]`,
  `/api/v1/namespaces/{ns}/configmaps|persistentvolumeclaims[/{name}]`,
  `/apis/apps/v1/namespaces/{ns}/deployments[/{name}[/status|/scale]]` (a Deployment
  controller keeps its pods at `spec.replicas`; a scheduler binds pods with no nodeName:
  `sandbox.k8s_deployments`, `sandbox.k8s_scheduler`),
  `/apis/slinky.slurm.net/v1beta1[/namespaces/{ns}]/nodesets|controllers|accountings|
  loginsets[/{name}]`, `/apis/slurm.crusoe.ai/v1alpha1[/namespaces/{ns}]/slurmclusters|
  slurmusers[/{name}]` (custom resources stored as given: no operator acts on them),
  `/version`;
- list with `labelSelector` / `fieldSelector`; create, get, PUT (409 on a stale
  resourceVersion), PATCH (strategic merge, merge and JSON patch; 415 for a strategic merge
  on a custom resource), delete with a grace period, eviction (429 under a
  PodDisruptionBudget);
- errors as `Status` objects (401, 404, 405, 409, 415, 422, 429).

Watches, server-side apply and dryRun are refused explicitly rather than half-done.

An unauthenticated admin API under `/_emulator/` plays the machines and the kubelet's probes:
`POST /_emulator/nodes` registers a machine as a node (a new providerID under an existing
name is a new machine), `POST /_emulator/nodes/{name}/ready` flips Ready,
`DELETE /_emulator/nodes/{name}` removes a machine,
`POST /_emulator/pods/{ns}/{name}/ready` sets a pod's readiness (and starts a pod an
external kubelet runs: `--external-kubelet SELECTOR`), `POST
/_emulator/pods/{ns}/{name}/terminated` finishes such a pod's graceful deletion,
`POST /_emulator/faults`
makes the next requests to a path fail (409, 429, 5xx), `GET /_emulator/state` dumps all.

Run: `python -m sandbox.k8s_emulator --port P --token T [--state FILE]`.
"""

from __future__ import annotations

import argparse
import hmac
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from autoclusters.sandbox.k8s_objects import (
    BY_PATH,
    DEPLOYMENTS,
    PODS,
    ApiError,
    Kind,
    bad_request,
)
from autoclusters.sandbox.k8s_store import Store

VERSION = {
    "major": "1",
    "minor": "33",
    "gitVersion": "v1.33.0-autoclusters-emulator",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-04-23T00:00:00Z",
    "goVersion": "go1.24.2",
    "compiler": "gc",
    "platform": "linux/amd64",
}
THREAD_NAME = "k8s-emulator"
_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


class MachineSpec(BaseModel):
    name: str
    provider_id: str = ""
    boot_id: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    ready: bool = True
    # The kubelet's --node-labels / --register-with-taints: only when the Node is created.
    register_labels: dict[str, str] = Field(default_factory=dict)
    register_taints: list[dict[str, str]] = Field(default_factory=list)
    gpus: int | None = Field(default=None, ge=0)  # the device plugin's nvidia.com/gpu


class FaultSpec(BaseModel):
    """Answer the next `times` requests for `method` `path` with an error instead."""

    method: str
    path: str
    code: int = 503
    times: int = 1


_FAULT_REASONS = {409: "Conflict", 429: "TooManyRequests", 500: "InternalError",
                  503: "ServiceUnavailable", 504: "Timeout"}  # fmt: skip


class ReadySpec(BaseModel):
    ready: bool
    reason: str = ""
    message: str = ""


def create_app(
    token: str, *, state_file: Path | None = None, kubelet: bool = True, external_kubelet: str = ""
) -> FastAPI:
    """The emulator as an ASGI app; `app.state.store` is its `Store`. Pods matching the
    `external_kubelet` label selector are run by a kubelet outside (see `Store`)."""
    store = Store(state_file, kubelet=kubelet, external_kubelet=external_kubelet)
    faults: list[FaultSpec] = []
    app = FastAPI(title="kubernetes emulator", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.store = store

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.status(), status_code=exc.code)

    def authenticate(request: Request) -> None:
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise ApiError(401, "Unauthorized", "Unauthorized")

    @app.get("/version")
    async def version(request: Request) -> JSONResponse:
        authenticate(request)
        return JSONResponse(VERSION)

    @app.api_route("/api/{path:path}", methods=_METHODS)
    @app.api_route("/apis/{path:path}", methods=_METHODS)
    async def resources(request: Request) -> JSONResponse:
        authenticate(request)
        for fault in faults:
            if fault.times > 0 and (fault.method, fault.path) == (request.method, request.url.path):
                fault.times -= 1
                reason = _FAULT_REASONS.get(fault.code, "InternalError")
                raise ApiError(fault.code, reason, f"{reason} (injected by the emulator)")
        code, body = await _dispatch(store, request)
        return JSONResponse(body, status_code=code)

    @app.post("/_emulator/nodes")
    async def put_machine(spec: MachineSpec) -> JSONResponse:
        return JSONResponse(store.put_machine(**spec.model_dump()))

    @app.post("/_emulator/nodes/{name}/ready")
    async def node_ready(name: str, spec: ReadySpec) -> JSONResponse:
        node = store.set_node_ready(
            name, ready=spec.ready, reason=spec.reason, message=spec.message
        )
        return JSONResponse(node)

    @app.delete("/_emulator/nodes/{name}")
    async def remove_machine(name: str) -> JSONResponse:
        store.remove_machine(name)
        return JSONResponse({"removed": name})

    @app.post("/_emulator/pods/{ns}/{name}/ready")
    async def pod_ready(ns: str, name: str, spec: ReadySpec) -> JSONResponse:
        return JSONResponse(store.set_pod_ready(ns, name, ready=spec.ready))

    @app.post("/_emulator/pods/{ns}/{name}/terminated")
    async def pod_terminated(ns: str, name: str) -> JSONResponse:
        return JSONResponse(store.finish_pod(ns, name))

    @app.post("/_emulator/faults")
    async def add_fault(spec: FaultSpec) -> JSONResponse:
        faults.append(spec)
        return JSONResponse(spec.model_dump())

    @app.get("/_emulator/state")
    async def state() -> JSONResponse:
        return JSONResponse(store.dump())

    return app


def _no_route() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def _not_allowed() -> ApiError:
    return ApiError(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
    )


@dataclass
class _Route:
    kind: Kind
    ns: str | None
    name: str | None
    sub: str | None


def _route(path: str) -> _Route:
    segs = [s for s in path.split("/") if s]
    if len(segs) >= 2 and segs[0] == "api":
        gv, rest = segs[1], segs[2:]
    elif len(segs) >= 3 and segs[0] == "apis":
        gv, rest = f"{segs[1]}/{segs[2]}", segs[3:]
    else:
        raise _no_route()
    ns = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        ns, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3:
        raise _no_route()
    kind = BY_PATH.get((gv, rest[0]))
    if kind is None or (ns is not None and not kind.namespaced):
        raise _no_route()
    name = rest[1] if len(rest) > 1 else None
    if name is not None and kind.namespaced and ns is None:
        raise _no_route()
    return _Route(kind, ns, name, rest[2] if len(rest) > 2 else None)


async def _body(request: Request, *, required: bool = True) -> Any:
    raw = await request.body()
    if not raw:
        if required:
            raise bad_request("the request body is empty")
        return {}
    try:
        return json.loads(raw)
    except ValueError as e:
        raise bad_request(f"the object provided is unrecognized (not JSON: {e})") from None


async def _dispatch(store: Store, request: Request) -> tuple[int, Any]:
    r = _route(request.url.path)
    q = request.query_params
    if q.get("watch") in ("true", "1"):
        raise bad_request("watch is not supported by the emulator")
    if q.get("dryRun"):
        raise bad_request("dryRun is not supported by the emulator")
    method = request.method
    if r.name is None:
        if method == "GET":
            return 200, store.list_objects(
                r.kind, r.ns, q.get("labelSelector", ""), q.get("fieldSelector", "")
            )
        if method == "POST" and (r.ns is not None or not r.kind.namespaced):
            return 201, store.create(r.kind, r.ns, await _body(request))
        raise _not_allowed()
    if r.sub is None or (r.sub == "status" and r.kind.status_subresource):
        if method == "GET":
            return 200, store.get(r.kind, r.ns, r.name)
        if method == "PUT":
            return 200, store.replace(r.kind, r.ns, r.name, await _body(request), r.sub)
        if method == "PATCH":
            ctype = request.headers.get("content-type", "")
            return 200, store.patch(r.kind, r.ns, r.name, ctype, await _body(request), r.sub)
        if method == "DELETE" and r.sub is None:
            options = await _body(request, required=False)
            grace = q.get("gracePeriodSeconds")
            return 200, store.delete(
                r.kind, r.ns, r.name, options, None if grace is None else int(grace)
            )
        raise _not_allowed()
    if r.sub == "scale" and r.kind is DEPLOYMENTS and r.ns is not None:
        if method == "GET":
            return 200, store.get_scale(r.ns, r.name)
        if method == "PUT":
            return 200, store.replace_scale(r.ns, r.name, await _body(request))
        if method == "PATCH":
            ctype = request.headers.get("content-type", "")
            return 200, store.patch_scale(r.ns, r.name, ctype, await _body(request))
        raise _not_allowed()
    if r.sub == "eviction" and r.kind is PODS and r.ns is not None:
        if method != "POST":
            raise _not_allowed()
        return 201, store.evict(r.ns, r.name, await _body(request))
    raise _no_route()


# -- running it -------------------------------------------------------------------------------


@dataclass
class Running:
    """A started emulator: where it listens, its token, and its state for direct inspection."""

    url: str
    token: str
    store: Store


@contextmanager
def running(
    token: str, *, state_file: Path | None = None, kubelet: bool = True, external_kubelet: str = ""
) -> Iterator[Running]:
    """Serve the emulator on a free loopback port in a background thread; stop it on exit."""
    app = create_app(
        token, state_file=state_file, kubelet=kubelet, external_kubelet=external_kubelet
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name=THREAD_NAME, daemon=True
    )
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the kubernetes emulator did not start")
            time.sleep(0.02)
        yield Running(url=f"http://127.0.0.1:{port}", token=token, store=app.state.store)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sandbox.k8s_emulator", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--token", required=True, help="the bearer token clients must send")
    parser.add_argument("--state", type=Path, help="keep the objects in this JSON file")
    parser.add_argument("--no-kubelet", action="store_true", help="pods never start")
    parser.add_argument(
        "--external-kubelet",
        default="",
        metavar="SELECTOR",
        help="pods matching this label selector are run by a kubelet outside the emulator",
    )
    args = parser.parse_args(argv)
    app = create_app(
        args.token,
        state_file=args.state,
        kubelet=not args.no_kubelet,
        external_kubelet=args.external_kubelet,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
