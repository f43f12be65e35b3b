"""The stand-in cluster (sandbox/standin/cluster.py) over HTTP, with its nodes' agents.

One process holds the cluster; every worker process reaches it through
`sandbox/standin/clients.py`, so a node drained by one worker is drained for all. Its
agents stand in for the node agent: when a machine comes back from a repair, its agent
reports a healthy snapshot, and the report goes to the node's open incident exactly as
the API forwards an agent's (`clients/api/evidence.forward`).

    python -m autoclusters.sandbox.standin.server --nodes 2000 --port 0 \\
        [--temporal 127.0.0.1:7233 --cluster bench]

prints `standin listening on http://127.0.0.1:<port>` once it serves.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from temporalio.client import Client

from autoclusters.core.evidence import HealthSnapshot
from autoclusters.core.policy import Rung
from autoclusters.sandbox.standin.cluster import GPUS_PER_NODE, StandInCluster, StandInError

log = logging.getLogger("autoclusters.standin")
CLUSTER: web.AppKey[StandInCluster] = web.AppKey("cluster", StandInCluster)
AGENT_POLL_S = 0.2
AGENT_RETRIES = 10


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status)


def _refused(e: StandInError) -> web.Response:
    return _json({"error": str(e)}, status=409)


async def nodes(request: web.Request) -> web.Response:
    return _json([n.model_dump() for n in request.app[CLUSTER].node_list()])


async def node(request: web.Request) -> web.Response:
    n = request.app[CLUSTER].node(request.match_info["name"])
    return _json(n.model_dump() if n is not None else None)


async def jobs(request: web.Request) -> web.Response:
    listed = request.app[CLUSTER].job_list(request.query.get("node"))
    return _json([j.model_dump() for j in listed])


async def node_action(request: web.Request) -> web.Response:
    c, name, action = request.app[CLUSTER], request.match_info["name"], request.match_info["act"]
    try:
        if action == "drain":
            c.drain(name, (await request.json())["reason"])
        elif action == "resume":
            c.resume(name)
        else:
            raise web.HTTPNotFound()
    except StandInError as e:
        return _refused(e)
    return _json({})


async def job_action(request: web.Request) -> web.Response:
    c, action = request.app[CLUSTER], request.match_info["act"]
    job_id = int(request.match_info["id"])
    try:
        if action == "requeue":
            c.requeue(job_id)
        elif action == "release_hold":
            c.release_hold(job_id)
        elif action == "admin_comment":
            c.set_admin_comment(job_id, (await request.json())["text"])
        elif action == "cancel":
            c.cancel(job_id)
        else:
            raise web.HTTPNotFound()
    except StandInError as e:
        return _refused(e)
    return _json({})


async def vm(request: web.Request) -> web.Response:
    try:
        return _json({"vm_id": request.app[CLUSTER].vm_id(request.match_info["node"])})
    except StandInError as e:
        return _json({"error": str(e)}, status=404)


async def repair(request: web.Request) -> web.Response:
    body = await request.json()
    try:
        done = request.app[CLUSTER].repair(body["node"], Rung(body["rung"]), body["key"])
    except StandInError as e:
        return _json({"error": str(e)}, status=404)
    return _json(
        {
            "node": done.node,
            "rung": done.rung.value,
            "old_vm_id": done.old_vm_id,
            "new_vm_id": done.new_vm_id,
            "stopped_at": done.stopped_at,
        }
    )


async def state(request: web.Request) -> web.Response:
    c = request.app[CLUSTER]
    listed = c.node_list()
    return _json(
        {
            "nodes": len(listed),
            "drained": sum(n.drained for n in listed),
            "down": sum(not n.responding for n in listed),
            "jobs": {s: sum(j.job_state == s for j in c.jobs.values()) for s in _job_states(c)},
            "repairs": len(c.repairs),
        }
    )


def _job_states(c: StandInCluster) -> set[str]:
    return {j.job_state for j in c.jobs.values()}


def make_app(cluster: StandInCluster) -> web.Application:
    app = web.Application()
    app[CLUSTER] = cluster
    app.add_routes(
        [
            web.get("/slurm/nodes", nodes),
            web.get("/slurm/nodes/{name}", node),
            web.get("/slurm/jobs", jobs),
            web.post("/slurm/nodes/{name}/{act}", node_action),
            web.post("/slurm/jobs/{id}/{act}", job_action),
            web.get("/cloud/vms/{node}", vm),
            web.post("/cloud/repair", repair),
            web.get("/_standin/state", state),
        ]
    )
    return app


# --- the nodes' agents ------------------------------------------------------------------


async def agents(cluster: StandInCluster, client: Client, cluster_name: str) -> None:
    """Each machine that comes back reports once, healthy, from its new boot."""
    from autoclusters.clients.api.evidence import forward

    async def report(node: str, boot_id: str) -> None:
        snap = HealthSnapshot.build(
            node=node,
            observed_at=datetime.now(UTC),
            boot_id=boot_id,
            gpu_count=GPUS_PER_NODE,
            expected_gpus=GPUS_PER_NODE,
            backend="standin",
        )
        for attempt in range(AGENT_RETRIES):
            try:
                await forward(client, cluster_name, snap)
                return
            except Exception as e:  # Temporal busy: the real agent sends again too
                log.warning("agent of %s: report not taken (%s), attempt %d", node, e, attempt)
                await asyncio.sleep(1)

    sending: set[asyncio.Task[None]] = set()
    while True:
        for node_name, boot_id in cluster.take_booted():
            task = asyncio.create_task(report(node_name, boot_id))
            sending.add(task)
            task.add_done_callback(sending.discard)
        await asyncio.sleep(AGENT_POLL_S)


async def serve(args: argparse.Namespace) -> None:
    cluster = StandInCluster(
        size=args.nodes, boot_delay_s=args.boot_delay, busy_fraction=args.busy_fraction
    )
    runner = web.AppRunner(make_app(cluster), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"standin listening on http://127.0.0.1:{port}", flush=True)
    agent_task = None
    if args.temporal:
        from autoclusters.integrations import temporal

        client = await Client.connect(
            args.temporal, data_converter=temporal.pydantic_data_converter
        )
        agent_task = asyncio.create_task(agents(cluster, client, args.cluster))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    if agent_task is not None:
        agent_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await agent_task
    await runner.cleanup()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--boot-delay", type=float, default=1.0)
    p.add_argument("--busy-fraction", type=float, default=0.5)
    p.add_argument("--temporal", help="Temporal address: the agents report there")
    p.add_argument("--cluster", default="bench")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(serve(args))
    sys.stdout.flush()
    os._exit(0)  # Temporal's Rust threads can hang a normal interpreter exit (sdk#300)


if __name__ == "__main__":
    main()
