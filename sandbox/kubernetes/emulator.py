"""A Kubernetes API server emulator, for the sandbox and the tests (no kube-apiserver runs here).

The official `kubernetes` client talks to it over a real loopback socket with a bearer token,
and gets what a real API server would answer for what AutoClusters uses:

- `/api/v1/nodes[/{name}[/status]]`, `/api/v1/namespaces[/{name}]`, `/api/v1/pods`,
  `/api/v1/namespaces/{ns}/pods[/{name}[/status|/eviction]]`,
  `/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets[/{name}]`,
  `/api/v1/namespaces/{ns}/configmaps|persistentvolumeclaims|events[/{name}]`,
  `/api/v1/events` (the Events the product records on Nodes: `kubectl get events -A`),
  `/apis/apps/v1/namespaces/{ns}/deployments[/{name}[/status|/scale]]` (a Deployment
  controller keeps its pods at `spec.replicas`; a scheduler binds pods with no nodeName:
  `sandbox.kubernetes.deployments`, `sandbox.kubernetes.scheduler`),
  `/apis/slinky.slurm.net/v1beta1[/namespaces/{ns}]/nodesets|controllers|accountings|
  loginsets[/{name}]` (checked against Slinky's published CRD schemas on every create,
  update and patch, unknown fields pruned: `crd_schema`; a NodeSet's `/scale` as its
  CRD declares it: `scale`),
  `/apis/slurm.crusoe.ai/v1alpha1[/namespaces/{ns}]/slurmclusters|slurmusers[/{name}]`
  (stored as given); no operator acts on any of them here;
  `POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews` (`kubectl auth can-i`:
  `access`); `/version`;
- list with `labelSelector` / `fieldSelector`; create, get, PUT (409 on a stale
  resourceVersion), PATCH (strategic merge, merge and JSON patch; 415 for a strategic merge
  on a custom resource), delete with a grace period, eviction (429 under a
  PodDisruptionBudget);
- errors as `Status` objects (401, 404, 405, 409, 415, 422, 429).

- discovery, Tables, watches (`?watch=true`), OpenAPI v3 stubs, a Swagger 2.0 `/openapi/v2`
  and protobuf request bodies for the kinds kubectl's typed clients send, so that a real
  `kubectl` works too (`discovery`, `table`, `watch_stream`, `openapi`,
  `openapi_v2`, `protobuf`); the
  API is served over HTTPS, since kubectl sends its token only over TLS (`tls`:
  `--cert-dir` keeps the certificate, `--kubeconfig FILE` writes a kubeconfig for it).

Server-side apply and dryRun are refused explicitly rather than half-done.

An unauthenticated admin API under `/_emulator/` plays the machines and the kubelet's probes:
`POST /_emulator/nodes` registers a machine as a node (a new providerID under an existing
name is a new machine), `POST /_emulator/nodes/{name}/ready` flips Ready,
`DELETE /_emulator/nodes/{name}` removes a machine,
`POST /_emulator/pods/{ns}/{name}/ready` sets a pod's readiness (and its container's id and
restarts, when said; it starts a pod an
external kubelet runs: `--external-kubelet SELECTOR`), `POST
/_emulator/pods/{ns}/{name}/terminated` finishes such a pod's graceful deletion,
`POST /_emulator/faults`
makes the next requests to a path fail (409, 429, 5xx), `GET /_emulator/state` dumps all.

Run: `python -m sandbox.kubernetes.emulator --port P --token T [--state FILE] [--cert-dir DIR]
[--kubeconfig FILE]`.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from autoclusters.clients.web.quiet_server import QuietServer
from autoclusters.sandbox.kubernetes import access, openapi_v2
from autoclusters.sandbox.kubernetes import protobuf as k8s_protobuf
from autoclusters.sandbox.kubernetes.crd_schema import FieldValidation
from autoclusters.sandbox.kubernetes.discovery import CRD_RESOURCE, discover
from autoclusters.sandbox.kubernetes.objects import (
    BY_PATH,
    PODS,
    ApiError,
    Kind,
    bad_request,
)
from autoclusters.sandbox.kubernetes.openapi import document as openapi_document
from autoclusters.sandbox.kubernetes.scale import has_scale
from autoclusters.sandbox.kubernetes.store import Store
from autoclusters.sandbox.kubernetes.table import table, wanted_table
from autoclusters.sandbox.kubernetes.tls import (
    CERT,
    KEY,
    certificate,
    kubeconfig,
    self_signed,
    trusting,
)
from autoclusters.sandbox.kubernetes.watch_stream import watch_response

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
# Open watches never finish by themselves: a stop waits this long for them, then cuts them.
_SHUTDOWN_S = 2
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
    # An external kubelet's container, as a pod's containerStatuses show it: its id (the
    # sandbox's agent pods: `pid://<PID>` of the process) and its restarts.
    container_id: str | None = None
    restart_count: int | None = None


def create_app(
    token: str, *, state_file: Path | None = None, kubelet: bool = True, external_kubelet: str = ""
) -> FastAPI:
    """The emulator as an ASGI app; `app.state.store` is its `Store`. Pods matching the
    `external_kubelet` label selector are run by a kubelet outside (see `Store`)."""
    store = Store(state_file, kubelet=kubelet, external_kubelet=external_kubelet)
    faults: list[FaultSpec] = []
    # No trailing-slash redirects: the API server answers `/api` and `/api/` alike (a 307 to
    # `/api/` made kubectl drop its token and fail with a 401).
    app = FastAPI(
        title="kubernetes emulator",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        redirect_slashes=False,
    )
    app.state.store = store

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.status(), status_code=exc.code)

    def authenticate(request: Request) -> None:
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise ApiError(401, "Unauthorized", "Unauthorized")

    @app.get("/version")
    @app.get("/version/")
    async def version(request: Request) -> JSONResponse:
        authenticate(request)
        return JSONResponse(VERSION)

    @app.get("/openapi/{path:path}")
    async def openapi(request: Request, path: str) -> JSONResponse:
        authenticate(request)
        if path.strip("/") == "v2":
            if openapi_v2.wants_protobuf_only(request.headers.get("accept", "")):
                raise ApiError(406, "NotAcceptable", "only application/json is served here")
            return JSONResponse(openapi_v2.document())
        return JSONResponse(openapi_document(path))

    @app.api_route("/api", methods=_METHODS)
    @app.api_route("/apis", methods=_METHODS)
    @app.api_route("/api/{path:path}", methods=_METHODS)
    @app.api_route("/apis/{path:path}", methods=_METHODS)
    async def resources(request: Request) -> Response:
        authenticate(request)
        for fault in faults:
            if fault.times > 0 and (fault.method, fault.path) == (request.method, request.url.path):
                fault.times -= 1
                reason = _FAULT_REASONS.get(fault.code, "InternalError")
                raise ApiError(fault.code, reason, f"{reason} (injected by the emulator)")
        path = request.url.path
        if path.rstrip("/") == access.PATH:
            if request.method != "POST":
                raise _not_allowed()
            return JSONResponse(access.review(await _body(request)), status_code=201)
        found = discover(path, request.url.netloc)
        if found is not None:
            if request.method != "GET":
                raise _not_allowed()
            return _answer(request, CRD_RESOURCE, 200, found)
        r = _route(path)
        q = request.query_params
        if request.method == "GET" and r.name is None and q.get("watch") in ("true", "1"):
            return watch_response(store, request, r.kind, r.ns)
        fields = FieldValidation(q.get("fieldValidation", ""))
        code, body = await _dispatch(store, r, request, fields)
        response = _answer(request, r.kind.resource, code, body)
        for text in fields.warnings:  # an unknown field pruned (fieldValidation=Warn)
            quoted = text.replace("\\", "\\\\").replace('"', '\\"')
            response.headers.append("Warning", f'299 - "{quoted}"')
        return response

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
        pod = store.set_pod_ready(
            ns,
            name,
            ready=spec.ready,
            container_id=spec.container_id,
            restart_count=spec.restart_count,
        )
        return JSONResponse(pod)

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
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype == k8s_protobuf.PROTOBUF:  # kubectl's typed clients: namespaces, evictions
        return k8s_protobuf.decode(raw)
    try:
        return json.loads(raw)
    except ValueError as e:
        raise bad_request(f"the object provided is unrecognized (not JSON: {e})") from None


def _answer(request: Request, resource: str, code: int, body: Any) -> JSONResponse:
    """`body` as a Table when the client asks for one (`kubectl get`); Status objects and
    everything else as they are."""
    version = wanted_table(request.headers.get("accept", ""))
    if request.method == "GET" and version and body.get("kind") != "Status":
        include = request.query_params.get("includeObject", "Metadata")
        body = table(resource, body, version, include)
    return JSONResponse(body, status_code=code)


async def _dispatch(
    store: Store, r: _Route, request: Request, fields: FieldValidation
) -> tuple[int, Any]:
    q = request.query_params
    if q.get("watch") in ("true", "1"):
        raise _not_allowed()  # a watch of one object by its path: only lists are watched
    if q.get("dryRun"):
        raise bad_request("dryRun is not supported by the emulator")
    method = request.method
    if r.name is None:
        if method == "GET":
            return 200, store.list_objects(
                r.kind, r.ns, q.get("labelSelector", ""), q.get("fieldSelector", "")
            )
        if method == "POST" and (r.ns is not None or not r.kind.namespaced):
            return 201, store.create(r.kind, r.ns, await _body(request), fields)
        raise _not_allowed()
    if r.sub is None or (r.sub == "status" and r.kind.status_subresource):
        if method == "GET":
            return 200, store.get(r.kind, r.ns, r.name)
        if method == "PUT":
            return 200, store.replace(r.kind, r.ns, r.name, await _body(request), r.sub, fields)
        if method == "PATCH":
            ctype = request.headers.get("content-type", "")
            body = await _body(request)
            return 200, store.patch(r.kind, r.ns, r.name, ctype, body, r.sub, fields)
        if method == "DELETE" and r.sub is None:
            options = await _body(request, required=False)
            grace = q.get("gracePeriodSeconds")
            return 200, store.delete(
                r.kind, r.ns, r.name, options, None if grace is None else int(grace)
            )
        raise _not_allowed()
    if r.sub == "scale" and has_scale(r.kind) and r.ns is not None:
        if method == "GET":
            return 200, store.get_scale(r.kind, r.ns, r.name)
        if method == "PUT":
            return 200, store.replace_scale(r.kind, r.ns, r.name, await _body(request))
        if method == "PATCH":
            ctype = request.headers.get("content-type", "")
            return 200, store.patch_scale(r.kind, r.ns, r.name, ctype, await _body(request))
        raise _not_allowed()
    if r.sub == "eviction" and r.kind is PODS and r.ns is not None:
        if method != "POST":
            raise _not_allowed()
        return 201, store.evict(r.ns, r.name, await _body(request))
    raise _no_route()


# -- running it -------------------------------------------------------------------------------


@dataclass
class Running:
    """A started emulator: where it listens, its token, and its state for direct inspection.
    With TLS, `url` is `https://` and `ca_pem` the certificate it presents."""

    url: str
    token: str
    store: Store
    ca_pem: str = ""

    @property
    def verify(self) -> ssl.SSLContext | bool:
        """What httpx's `verify=` needs to talk to it."""
        return trusting(self.ca_pem) if self.ca_pem else True

    def kubeconfig(self) -> str:
        """A kubeconfig for kubectl and the Python client (TLS only: kubectl's rule)."""
        return kubeconfig(self.url, self.token, self.ca_pem)


async def _serve(server: QuietServer, sock: socket.socket, store: Store) -> None:
    async def close_watches() -> None:
        # A stop (a signal, or `running` exits) ends the open watches, which would
        # otherwise hold the graceful shutdown up.
        await server.exiting()
        store.close_watches()

    closer = asyncio.create_task(close_watches())
    try:
        await server.serve(sockets=[sock])
    finally:
        closer.cancel()


def _server(app: FastAPI, tls: tuple[Path, Path] | None) -> QuietServer:
    cert, key = tls if tls else (None, None)
    config = uvicorn.Config(
        app,
        log_level="warning",
        lifespan="off",
        timeout_graceful_shutdown=_SHUTDOWN_S,
        ssl_certfile=cert,
        ssl_keyfile=key,
    )
    return QuietServer(config)


def _bind(host: str, port: int = 0) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


@contextmanager
def running(
    token: str,
    *,
    state_file: Path | None = None,
    kubelet: bool = True,
    external_kubelet: str = "",
    tls: bool = False,
) -> Iterator[Running]:
    """Serve the emulator on a free loopback port in a background thread (over HTTPS with
    `tls`, as kubectl needs; plain HTTP is enough for the Python client); stop it on exit."""
    app = create_app(
        token, state_file=state_file, kubelet=kubelet, external_kubelet=external_kubelet
    )
    with tempfile.TemporaryDirectory(prefix="k8s-emulator-tls-") as tmp:
        cert_key = self_signed(Path(tmp)) if tls else None
        sock = _bind("127.0.0.1")
        server = _server(app, cert_key)
        thread = threading.Thread(
            target=asyncio.run,
            args=(_serve(server, sock, app.state.store),),
            name=THREAD_NAME,
            daemon=True,
        )
        thread.start()
        try:
            while not server.started:
                if not thread.is_alive():
                    raise RuntimeError("the kubernetes emulator did not start")
                time.sleep(0.02)
            port = sock.getsockname()[1]
            yield Running(
                url=f"{'https' if tls else 'http'}://127.0.0.1:{port}",
                token=token,
                store=app.state.store,
                ca_pem=cert_key[0].read_text() if cert_key else "",
            )
        finally:
            server.should_exit = True
            thread.join(timeout=10)
            sock.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m sandbox.kubernetes.emulator", description=__doc__
    )
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
    parser.add_argument(
        "--cert-dir",
        type=Path,
        help=f"keep the HTTPS certificate here ({CERT}, {KEY}; made if absent; default: a "
        "temporary one)",
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        help="write a kubeconfig for this server (HTTPS, its CA, the token) here",
    )
    args = parser.parse_args(argv)
    app = create_app(
        args.token,
        state_file=args.state,
        kubelet=not args.no_kubelet,
        external_kubelet=args.external_kubelet,
    )
    with tempfile.TemporaryDirectory(prefix="k8s-emulator-tls-") as tmp:
        cert, key = certificate(args.cert_dir or Path(tmp))
        if args.kubeconfig:
            server = f"https://{args.host}:{args.port}"
            args.kubeconfig.write_text(kubeconfig(server, args.token, cert.read_text()))
            args.kubeconfig.chmod(0o600)
        sock = _bind(args.host, args.port)
        asyncio.run(_serve(_server(app, (cert, key)), sock, app.state.store))


if __name__ == "__main__":
    main()
