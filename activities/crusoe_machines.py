"""What both cluster providers (Managed Slurm, and Slinky on CMK) do the same way with the
Crusoe API and Slurm: read the machines' fabric placement, delete a thing until it is
gone, and wait for fresh slurmd registrations.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from autoclusters.core.cluster import Machine, Placement
from autoclusters.core.models import SlurmNode
from autoclusters.integrations.crusoe.client import CrusoeClient
from autoclusters.integrations.crusoe.errors import (
    CrusoeNotFound,
    CrusoeOperationFailed,
    CrusoeUnavailable,
)
from autoclusters.integrations.crusoe.resources import Operation, OperationKind
from autoclusters.integrations.slurm import SlurmBatchClient, SlurmError

# How far a slurmd's start time may seem to precede its VM's creation (clocks differ).
CLOCK_SKEW_S = 30.0


async def placements(crusoe: CrusoeClient, machines: list[Machine]) -> list[Placement]:
    """Each machine's pod and leaf from its VM's `topology` (EXT); unknown: unplaced."""
    if not machines:
        return []
    vms = await crusoe.list_vms(ids=[m.machine_id for m in machines])
    by_id = {vm.id: vm for vm in vms}
    out = []
    for m in machines:
        vm = by_id.get(m.machine_id)
        topo = (vm.model_extra or {}).get("topology") if vm is not None else None
        topo = topo if isinstance(topo, dict) else {}
        out.append(
            Placement(
                node=m.node,
                pod=str(topo["pod"]) if topo.get("pod") else None,
                leaf=str(topo["leaf"]) if topo.get("leaf") else None,
            )
        )
    return out


def op_meta(op: Operation, field: str) -> str | None:
    """A field of an operation's metadata (the id of what it creates), as text."""
    meta = op.metadata if isinstance(op.metadata, dict) else {}
    value = meta.get(field)
    return str(value) if value else None


async def exists(get: Callable[[], Awaitable[Any]]) -> bool:
    try:
        await get()
    except CrusoeNotFound:
        return False
    return True


async def delete_until_gone(
    crusoe: CrusoeClient,
    delete: Callable[[], Awaitable[Operation]],
    get: Callable[[], Awaitable[Any]],
    kind: OperationKind,
    poll_s: float,
) -> None:
    """Delete and wait until done. Already gone (404) is done; busy (409: an earlier try's
    delete still runs) is waited out until the thing is gone; a FAILED delete of something
    that is gone anyway is done too."""
    while True:
        try:
            await crusoe.wait_operation(await delete(), kind, poll_s=poll_s)
            return
        except CrusoeNotFound:
            return
        except CrusoeUnavailable as e:
            if e.status != 409:
                raise
        except CrusoeOperationFailed:
            if await exists(get):
                raise
            return
        if not await exists(get):
            return
        await asyncio.sleep(poll_s)


async def wait_registered(
    slurm: SlurmBatchClient,
    wanted: list[str],
    created: dict[str, float],
    *,
    poll_s: float,
    timeout_s: float,
) -> list[str]:
    """The nodes of `wanted` that answer in Slurm from a slurmd started after their VM was
    created (a replaced machine's old slurmd, which Slurm still shows as up for a while,
    does not count), once all do or `timeout_s` passed."""
    deadline = time.monotonic() + timeout_s

    def fresh(node: SlurmNode) -> bool:
        # 0: Slurm does not say when slurmd started; trust that it answers.
        started = node.slurmd_start_time
        return started == 0 or started >= created.get(node.name, 0) - CLOCK_SKEW_S

    while True:
        try:
            nodes = {n.name: n for n in await slurm.nodes()}
        except SlurmError:
            # slurmctld restarting after the new configuration, or away: unknown, so keep
            # asking; at the deadline an unanswered read is an outage, not "none came up"
            # (which would make the caller replace healthy machines).
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(poll_s)
            continue
        up = [n for n in wanted if n in nodes and nodes[n].responding and fresh(nodes[n])]
        if len(up) == len(wanted) or time.monotonic() >= deadline:
            return up
        await asyncio.sleep(poll_s)
