"""The sandbox's inference gateway: one process in front of every inference pod's server.

`POST /v1/infer` (any small JSON body) goes to a pod that is Ready, not terminating and has
a free slot (the fewest requests in flight first); with none free it waits in a FIFO queue
until a slot frees or a new replica becomes Ready, and gets 503 after `--queue-timeout`
seconds. A server that answers 503 (it is draining after SIGTERM) or cannot be reached is
not used again, and the request goes back to the head of the line: a pod's graceful
deletion fails no request. A connection dropped mid-request is retried the same way. The
pods are read from the emulated Kubernetes API at each change a watch of them reports, and
every `--poll` seconds without one (sandbox/inference/changes.py).

`/metrics` (Prometheus): `inference_requests_total{code}`, `inference_request_duration_seconds`
(end to end, the queue included), `inference_queue_length`, `inference_inflight_requests`,
`inference_ready_replicas`. `/v1/status`: the replicas and the queue, as JSON. `/healthz`.

Run: `python -m autoclusters.sandbox.inference.gateway --kubeconfig K --port P
[--queue-timeout 30] [--poll 10] [--slots 4]`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from autoclusters.clients.web.quiet_server import serve
from autoclusters.sandbox.inference import pods
from autoclusters.sandbox.inference.changes import Changes
from autoclusters.sandbox.inference.server import DEFAULT_SLOTS

log = logging.getLogger("inference-gateway")
# Fine around the SLOs a demo sets (0.05 .. 5 s): a p95 from these buckets moves visibly.
BUCKETS = (0.025, 0.05, 0.075, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.75, 1.0,
           1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0, 20.0, 30.0)  # fmt: skip
# Below uvicorn's keep-alive timeout (5 s): the client side lets an idle connection go first.
KEEPALIVE_S = 2.0
# Without a watch event, the pods are read again after this (an event a watch missed while it
# reconnected: a new watch starts with every pod, so that pass comes anyway). Every second,
# those reads were a good part of an idle sandbox's API emulator CPU (issue 41).
RESYNC_S = 10.0


@dataclass
class Backend:
    pod: str  # namespace/name
    node: str
    port: int
    slots: int
    inflight: int = 0
    serving: bool = True  # Ready and not terminating, as last read
    broken: bool = False  # answered 503 or could not be reached: never again


class Gateway:
    def __init__(
        self,
        access: pods.Access,
        *,
        queue_timeout_s: float = 30.0,
        poll_s: float = RESYNC_S,
        default_slots: int = DEFAULT_SLOTS,
        request_timeout_s: float = 60.0,
    ) -> None:
        self.access = access
        self.queue_timeout_s, self.poll_s = queue_timeout_s, poll_s
        self.default_slots, self.request_timeout_s = default_slots, request_timeout_s
        self.backends: dict[tuple[str, int], Backend] = {}
        self.waiters: deque[asyncio.Future[Backend]] = deque()
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "inference_requests", "Inference requests answered, by HTTP code", ["code"],
            registry=self.registry,
        )  # fmt: skip
        self.duration = Histogram(
            "inference_request_duration_seconds",
            "Inference request latency, end to end (queueing included)",
            buckets=BUCKETS,
            registry=self.registry,
        )
        Gauge(
            "inference_queue_length", "Requests waiting for a free replica slot",
            registry=self.registry,
        ).set_function(lambda: len(self.waiters))  # fmt: skip
        Gauge(
            "inference_inflight_requests", "Requests being served by a replica",
            registry=self.registry,
        ).set_function(lambda: sum(b.inflight for b in self.backends.values()))  # fmt: skip
        Gauge(
            "inference_ready_replicas", "Replicas the gateway routes to",
            registry=self.registry,
        ).set_function(lambda: len(self.routable()))  # fmt: skip

    # -- replicas ---------------------------------------------------------------------------

    def routable(self) -> list[Backend]:
        return [b for b in self.backends.values() if b.serving and not b.broken]

    def update(self, listed: list[pods.Pod]) -> None:
        """The replicas, from the pods just read."""
        seen = set()
        for pod in listed:
            port = pods.port(pod)
            if port is None:
                continue
            k = (pods.key(pod), port)
            seen.add(k)
            b = self.backends.get(k)
            if b is None:
                if not pods.serving(pod):
                    continue
                b = self.backends[k] = Backend(
                    pod=k[0],
                    node=pod["spec"].get("nodeName", ""),
                    port=port,
                    slots=pods.slots(pod, self.default_slots),
                )
                log.info("replica %s on %s (port %d) serving", b.pod, b.node, port)
            b.serving = pods.serving(pod)
        for k, b in list(self.backends.items()):
            if k not in seen:
                b.serving = False
            if not b.serving and b.inflight == 0:
                del self.backends[k]
        self._dispatch()

    def _free(self) -> Backend | None:
        free = [b for b in self.routable() if b.inflight < b.slots]
        return min(free, key=lambda b: (b.inflight, b.pod)) if free else None

    def _dispatch(self) -> None:
        while self.waiters:
            b = self._free()
            if b is None:
                return
            fut = self.waiters.popleft()
            if fut.done():
                continue
            b.inflight += 1
            fut.set_result(b)

    async def acquire(self, deadline: float, *, front: bool = False) -> Backend | None:
        """A replica slot, FIFO; None when the deadline (loop time) passes first."""
        if not self.waiters:
            b = self._free()
            if b is not None:
                b.inflight += 1
                return b
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Backend] = loop.create_future()
        (self.waiters.appendleft if front else self.waiters.append)(fut)
        try:
            await asyncio.wait({fut}, timeout=max(0.0, deadline - loop.time()))
        finally:
            if not fut.done():
                fut.cancel()
                self.waiters.remove(fut)
        return fut.result() if not fut.cancelled() else None

    def release(self, b: Backend) -> None:
        b.inflight -= 1
        if not b.serving and b.inflight == 0:
            self.backends.pop((b.pod, b.port), None)
        self._dispatch()

    async def watch(self) -> None:
        watched = {"/api/v1/pods": {"labelSelector": pods.SELECTOR}}
        async with self.access.client() as k8s, Changes(k8s, watched) as changes:
            while True:
                try:
                    self.update(await pods.list_pods(k8s))
                except (httpx.HTTPError, ValueError) as e:
                    log.warning("cannot read the inference pods: %s", e)
                await changes.wait(self.poll_s)

    # -- requests ---------------------------------------------------------------------------

    async def infer(self, http: httpx.AsyncClient, body: bytes) -> tuple[int, Any]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = start + self.queue_timeout_s
        retry = False
        while True:
            b = await self.acquire(deadline, front=retry)
            if b is None:
                return 503, {"error": f"no replica free within {self.queue_timeout_s:g}s"}
            try:
                r = await http.post(
                    f"http://127.0.0.1:{b.port}/v1/infer",
                    content=body,
                    headers={"Content-Type": "application/json"},
                )
            except httpx.ConnectError as e:
                # Nothing listens there any more: the pod's process is gone.
                log.info("replica %s unreachable (%s): retrying elsewhere", b.pod, e)
                b.broken = True
                retry = True
                continue
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as e:
                # The connection dropped under the request: the pod is going away, or the
                # replica closed a kept-alive connection just as it was reused. The second
                # says nothing against the replica, so it stays routable; a pod that is
                # going away answers the retry with 503 or refuses the connection.
                log.info("replica %s dropped the connection (%r): retrying", b.pod, e)
                retry = True
                continue
            except httpx.TimeoutException:
                return 504, {"error": f"replica {b.pod} timed out"}
            finally:
                self.release(b)
            if r.status_code == 503:  # draining: its pod is going away
                b.broken = True
                retry = True
                continue
            return r.status_code, r.json()

    def status(self) -> dict[str, Any]:
        return {
            "queue": len(self.waiters),
            "replicas": [
                {"pod": b.pod, "node": b.node, "port": b.port, "slots": b.slots,
                 "inflight": b.inflight, "serving": b.serving and not b.broken}
                for b in self.backends.values()
            ],
        }  # fmt: skip


def create_app(gateway: Gateway) -> FastAPI:
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Idle connections expire here before the replicas' uvicorn closes them (5 s), so a
        # request is never sent on a connection the replica is closing.
        limits = httpx.Limits(
            max_connections=None, max_keepalive_connections=200, keepalive_expiry=KEEPALIVE_S
        )
        async with httpx.AsyncClient(timeout=gateway.request_timeout_s, limits=limits) as http:
            state["http"] = http
            watcher = asyncio.create_task(gateway.watch())
            try:
                yield
            finally:
                watcher.cancel()

    app = FastAPI(title="inference gateway", docs_url=None, redoc_url=None, lifespan=lifespan)

    @app.post("/v1/infer")
    async def infer(request: Request) -> JSONResponse:
        start = time.monotonic()
        body = await request.body()
        code, doc = await gateway.infer(state["http"], body or b"{}")
        gateway.duration.observe(time.monotonic() - start)
        gateway.requests.labels(code=str(code)).inc()
        return JSONResponse(doc, status_code=code)

    @app.get("/v1/status")
    async def status() -> JSONResponse:
        return JSONResponse(gateway.status())

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(gateway.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m autoclusters.sandbox.inference.gateway")
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--queue-timeout", type=float, default=30.0)
    parser.add_argument(
        "--poll", type=float, default=RESYNC_S, help="seconds between reads without a change"
    )
    parser.add_argument("--slots", type=int, default=DEFAULT_SLOTS, help="when a pod says none")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    # A line for every request of its passes and probes: a log that grew each second idle.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    gateway = Gateway(
        pods.Access.from_kubeconfig(args.kubeconfig),
        queue_timeout_s=args.queue_timeout,
        poll_s=args.poll,
        default_slots=args.slots,
    )
    serve(
        create_app(gateway), host=args.host, port=args.port, log_level="warning", access_log=False
    )


if __name__ == "__main__":
    main()
