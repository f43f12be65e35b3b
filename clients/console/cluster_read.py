"""One read of the cluster as the console shows it: Slurm's nodes, the provisioning
workflow's node sets and topology, the policy's topology, the fleet guard and the open
incidents, made into the topology view and its JSON once, for every viewer (shared_read.py
shares it).

The JSON is encoded, and gzipped, here, off the requests: a poll of 2,000 nodes is then a
copy of bytes, whoever asks. A source that fails is named in the view's errors; Slurm
failing keeps the nodes of the previous read (with the error saying so) rather than
showing every node as gone.
"""

from __future__ import annotations

import asyncio
import functools
import gzip
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TypeVar

from autoclusters.clients.console import topology
from autoclusters.clients.console.sources import ConsoleSource
from autoclusters.core.models import IncidentState, SlurmNode
from autoclusters.core.policy import NodeTopology, Policy

T = TypeVar("T")


@dataclass(frozen=True)
class ClusterRead:
    view: topology.TopologyView
    slurm: dict[str, SlurmNode] = field(default_factory=dict)
    body: bytes = b""  # the view's JSON
    gzipped: bytes = b""
    etag: str = ""  # the body's hash: the same cluster, the same ETag, whichever read
    # The open incidents it was built from (the node page's marks on its jobs' ranks).
    open_incidents: tuple[IncidentState, ...] = ()

    def place(self, node: str) -> tuple[topology.Tile, str, str, str] | None:
        """The node's tile and its pod, leaf and node set."""
        for p in self.view.pods:
            for lf in p.leaves:
                for g in lf.groups:
                    for t in g.tiles:
                        if t.node == node:
                            return t, p.name, lf.name, g.name
        return None


@functools.lru_cache(maxsize=4)
def _placements(topology_conf: str) -> dict[str, NodeTopology]:
    # The fabric changes when the cluster is provisioned again, not between two reads:
    # parsing 2,000 nodes' topology.conf costs more than building their view.
    return topology.parse_topology_conf(topology_conf)


async def read_or_note(what: str, read: Callable[[], Awaitable[T]], errors: list[str]) -> T | None:
    """`read()`, or None with what failed noted in `errors` (every console page reads this
    way). The read is started here, where it is awaited: a coroutine made before gather
    starts its task would never be awaited if the read were cancelled in between."""
    try:
        return await read()
    except Exception as e:  # a page shows what it could read and says what it could not
        errors.append(f"{what}: {str(e) or type(e).__name__}")
        return None


async def read_cluster(
    *,
    cluster: str,
    source: ConsoleSource,
    policy: Callable[[], Policy],
    previous: ClusterRead | None,
    stale_after_s: float,
) -> ClusterRead:
    errors: list[str] = []
    now = datetime.now(UTC)
    nodes, state, guard, open_ = await asyncio.gather(
        read_or_note("Slurm", source.slurm_nodes, errors),
        read_or_note("provisioning", source.cluster, errors),
        read_or_note("fleet guard", source.guard, errors),
        read_or_note("incidents", source.open_incidents, errors),
    )
    if nodes is None and previous is not None and previous.slurm:
        nodes = list(previous.slurm.values())
        at = previous.view.updated_at.strftime("%H:%M:%S")
        errors.append(f"Slurm: showing its last answer, read at {at} UTC")
    placements = dict(_placements(state.topology_conf)) if state else {}
    try:
        placements.update(policy().topology)
    except Exception as e:
        errors.append(f"policy: {e}")

    def build() -> ClusterRead:
        view = topology.build(
            cluster=cluster,
            now=now,
            slurm_nodes=nodes or [],
            node_sets=state.node_sets if state else {},
            placements=placements,
            open_incidents=open_ or [],
            guard=guard,
            errors=errors,
        )
        view.stale_after_s = stale_after_s
        body, etag = topology.to_json(view)
        return ClusterRead(
            view=view,
            slurm={n.name: n for n in nodes or []},
            body=body,
            gzipped=gzip.compress(body, compresslevel=6),
            etag=etag,
            open_incidents=tuple(open_ or []),
        )

    # In a thread: 2,000 nodes take tens of milliseconds to build and encode, and the
    # requests of every viewer go on being answered meanwhile.
    return await asyncio.to_thread(build)
