"""The inference server stand-in: one per inference pod, started by the sandbox's kubelet.

It serves `slots` requests at a time (a model server's batch), each spending
`ms_per_request` of simulated GPU time; more wait for a slot (the gateway never sends more
than `slots`). `/healthz` is the readiness probe. `/metrics` (Prometheus):
`inference_server_requests_total` and `inference_server_busy_seconds_total` (slot-seconds
of simulated GPU time), both labelled `node`, and `inference_server_inflight_requests`.

SIGTERM, as a pod's graceful deletion sends it: new requests get 503 (the gateway sends
them elsewhere), the ones in flight finish, then the process exits 0.

Run: `python -m autoclusters.sandbox.inference.server --node N --port 0 [--slots 4]
[--ms-per-request 100] [--port-file F]` (port 0: a free port, written to F once serving).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
from pathlib import Path
from types import FrameType

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

from autoclusters.clients.web.quiet_server import QuietServer

DEFAULT_SLOTS = 4
DEFAULT_MS_PER_REQUEST = 100.0


class Server:
    """The server's state: slots, the drain flag, and its metrics."""

    def __init__(self, node: str, slots: int, ms_per_request: float) -> None:
        self.node, self.slots, self.ms = node, slots, ms_per_request
        self.draining = False
        self.inflight = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self._sem: asyncio.Semaphore | None = None
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "inference_server_requests_total",
            "Requests served (simulated GPU time spent)",
            ["node"],
            registry=self.registry,
        ).labels(node=node)
        self.busy = Counter(
            "inference_server_busy_seconds_total",
            "Slot-seconds of simulated GPU time spent serving requests",
            ["node"],
            registry=self.registry,
        ).labels(node=node)
        self.inflight_gauge = Gauge(
            "inference_server_inflight_requests",
            "Requests in the server (serving or waiting for a slot)",
            ["node"],
            registry=self.registry,
        ).labels(node=node)

    async def serve_one(self) -> None:
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.slots)
        self.inflight += 1
        self.inflight_gauge.inc()
        self.idle.clear()
        try:
            async with self._sem:
                await asyncio.sleep(self.ms / 1000)
                self.busy.inc(self.ms / 1000)
                self.requests.inc()
        finally:
            self.inflight -= 1
            self.inflight_gauge.dec()
            if self.inflight == 0:
                self.idle.set()


def create_app(server: Server) -> FastAPI:
    app = FastAPI(title="inference server stand-in", docs_url=None, redoc_url=None)

    @app.post("/v1/infer")
    async def infer(request: Request) -> JSONResponse:
        if server.draining:
            return JSONResponse({"error": "draining"}, status_code=503)
        await request.body()
        await server.serve_one()
        return JSONResponse({"node": server.node, "ms": server.ms})

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        if server.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return JSONResponse({"status": "ok", "node": server.node, "slots": server.slots})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(server.registry), media_type=CONTENT_TYPE_LATEST)

    return app


class _Uvicorn(QuietServer):
    """SIGTERM drains (503 for new requests, in-flight ones finish) and exits 0; uvicorn's
    own handling would re-raise the signal after its shutdown (exit -15)."""

    def __init__(self, config: uvicorn.Config, server: Server) -> None:
        super().__init__(config)
        self.server = server
        self._drain: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig != signal.SIGTERM:
            super().handle_exit(sig, frame)
            return
        self.server.draining = True
        loop = asyncio.get_event_loop()
        loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        if self._drain is None:
            self._drain = asyncio.ensure_future(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        await self.server.idle.wait()
        self.should_exit = True


async def _serve(args: argparse.Namespace) -> None:
    server = Server(args.node, args.slots, args.ms_per_request)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        create_app(server), log_level="warning", lifespan="off", access_log=False
    )
    runner = _Uvicorn(config, server)
    serving = asyncio.ensure_future(runner.serve(sockets=[sock]))
    while not runner.started and not serving.done():
        await asyncio.sleep(0.01)
    if args.port_file and runner.started:
        tmp = Path(f"{args.port_file}.tmp")
        tmp.write_text(json.dumps({"port": port, "pid": os.getpid()}))
        tmp.replace(args.port_file)
    await serving


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m autoclusters.sandbox.inference.server")
    parser.add_argument("--node", required=True, help="the node this pod runs on (a label)")
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--slots", type=int, default=DEFAULT_SLOTS)
    parser.add_argument("--ms-per-request", type=float, default=DEFAULT_MS_PER_REQUEST)
    parser.add_argument("--port-file", type=Path, help="where to write the port once serving")
    args = parser.parse_args(argv)
    asyncio.run(_serve(args))


if __name__ == "__main__":
    main()
