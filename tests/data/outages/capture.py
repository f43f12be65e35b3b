"""Capture what the real programs answer when they cannot answer (tests/data/outages/).

    .venv/bin/python tests/data/outages/capture.py

Starts Debian's `prometheus` (2.42) on a free loopback port with its own data dir, asks it
before its TSDB is ready and then with queries that fail, and stops it by its PID; asks the
sandbox's Crusoe API emulator (in-process, on loopback) for a VM list while a 503 is
injected. Each answer is written as `NAME.http`: the status line, the headers that matter
(Content-Type, Retry-After) and the body byte for byte. The Kubernetes documents are not
captured here (no kube-apiserver on this machine): see README.md.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from pydantic import SecretStr

HERE = Path(__file__).resolve().parent
KEEP = ("content-type", "retry-after")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write(name: str, resp: httpx.Response) -> None:
    head = [f"HTTP/1.1 {resp.status_code} {resp.reason_phrase}"]
    head += [f"{k.title()}: {v}" for k, v in resp.headers.items() if k.lower() in KEEP]
    (HERE / f"{name}.http").write_bytes(("\n".join(head) + "\n\n").encode() + resp.content)
    print(f"{name}: {resp.status_code} {resp.content[:120]!r}")


def _start_prometheus(work: Path, *flags: str) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    shutil.rmtree(work / "data", ignore_errors=True)
    (work / "prometheus.yml").write_text("global: {scrape_interval: 1s, evaluation_interval: 1s}\n")
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--web.external-url={base}/",
            *flags,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return proc, base


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)


def _first_answer(base: str) -> httpx.Response:
    """The first answer to a query, as soon as the port accepts."""
    deadline = time.monotonic() + 10
    with httpx.Client(base_url=base, timeout=10, trust_env=False) as http:
        while True:
            try:
                return http.get("/api/v1/query", params={"query": "up"})
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.001)


def _until_ready(http: httpx.Client) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if http.get("/-/ready").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise TimeoutError("prometheus did not get ready")


def prometheus() -> None:
    work = Path(tempfile.mkdtemp(prefix="prom-capture-"))
    try:
        # While the TSDB opens, a query answers 503 "Service Unavailable" (plain text): the
        # window is a few ms on an empty data dir, so try a few starts.
        for _ in range(10):
            proc, base = _start_prometheus(work)
            try:
                first = _first_answer(base)
            finally:
                _stop(proc)
            if first.status_code == 503:
                _write("prometheus_not_ready", first)
                break
        else:
            print("never saw prometheus before its TSDB was ready", file=sys.stderr)
        proc, base = _start_prometheus(work)
        try:
            with httpx.Client(base_url=base, timeout=10, trust_env=False) as http:
                _until_ready(http)
                _capture_queries(http)
        finally:
            _stop(proc)
        # A small sample budget, so a query over it fails at once with a 422.
        proc, base = _start_prometheus(work, "--query.max-samples=1000")
        try:
            with httpx.Client(base_url=base, timeout=10, trust_env=False) as http:
                _until_ready(http)
                _write(
                    "prometheus_query_execution_error",
                    http.get(
                        "/api/v1/query", params={"query": "count_over_time(vector(1)[1h:1s])"}
                    ),
                )
        finally:
            _stop(proc)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _capture_queries(http: httpx.Client) -> None:
    q = "/api/v1/query"
    _write("prometheus_query_vector", http.get(q, params={"query": "vector(0.75)"}))
    _write("prometheus_query_empty", http.get(q, params={"query": "DCGM_FI_DEV_GPU_UTIL"}))
    _write("prometheus_query_bad_data", http.get(q, params={"query": "sum(rate(x[5m])"}))
    window = {"start": "1700000000", "end": "1700003600", "step": "15"}
    slow = {"query": "count_over_time(vector(1)[30d:1s])", "timeout": "1ms"}
    _write("prometheus_query_range_timeout", http.get("/api/v1/query_range", params=slow | window))
    empty = {"query": 'DCGM_FI_DEV_GPU_UTIL{Hostname="gpu-02"}'}
    _write("prometheus_query_range_empty", http.get("/api/v1/query_range", params=empty | window))


def crusoe_emulator() -> None:
    from autoclusters.integrations.crusoe.signing import CrusoeAuth
    from autoclusters.sandbox.crusoe.emulator import EmulatorServer, create_app
    from autoclusters.sandbox.crusoe.world import EmulatorConfig

    secret = base64.urlsafe_b64encode(os.urandom(32)).decode().rstrip("=")
    config = EmulatorConfig(access_key_id="ak", secret_key=SecretStr(secret), project_id="p")
    with EmulatorServer(create_app(config)) as server:
        vms = "/v1/projects/p/compute/vms/instances"
        httpx.post(
            f"{server.url}/_emulator/inject",
            json={"status": 503, "count": 1, "path_prefix": vms, "method": "GET"},
        ).raise_for_status()
        auth = CrusoeAuth("ak", SecretStr(secret))
        with httpx.Client(base_url=server.url, auth=auth, trust_env=False) as http:
            _write("crusoe_emulator_503", http.get(vms))


if __name__ == "__main__":
    prometheus()
    crusoe_emulator()
