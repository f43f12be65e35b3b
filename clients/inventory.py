"""Which nodes exist: an alert naming any other node starts nothing.

Slurm is the truth (`sinfo`); a fixed list serves where the API host cannot run sinfo
(or in tests). Both answer for a whole payload at once, so a storm costs one sinfo.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection, Iterable
from typing import Protocol

from autoclusters.core import hostlist
from autoclusters.core.settings import Settings
from autoclusters.integrations.slurm import SlurmCli, SlurmClient


class NodeInventory(Protocol):
    async def known(self, nodes: Collection[str]) -> set[str]:
        """The subset of `nodes` that are nodes of the cluster."""
        ...


class StaticInventory:
    """A fixed list of node names; entries may be hostlist expressions (gpu-[001-128])."""

    def __init__(self, nodes: Iterable[str]) -> None:
        self._nodes = frozenset(n for expr in nodes for n in hostlist.expand(expr))

    async def known(self, nodes: Collection[str]) -> set[str]:
        return set(self._nodes.intersection(nodes))


class SlurmInventory:
    """Slurm's node list, cached for `ttl_s`; a name missing from the cache refreshes it
    (at most once a second), so a node added to Slurm is known at once."""

    def __init__(self, slurm: SlurmClient, ttl_s: float = 0) -> None:
        self._slurm = slurm
        self._ttl_s = ttl_s
        self._names: frozenset[str] = frozenset()
        self._fetched_at = -float("inf")
        self._lock = asyncio.Lock()

    @classmethod
    def for_settings(cls, settings: Settings, ttl_s: float = 0) -> SlurmInventory:
        return cls(SlurmCli(settings.slurm.conf, settings.slurm.bin_dir), ttl_s=ttl_s)

    async def known(self, nodes: Collection[str]) -> set[str]:
        age = time.monotonic() - self._fetched_at
        missing = not self._names.issuperset(nodes)
        if age > self._ttl_s or (missing and age > min(1.0, self._ttl_s)):
            async with self._lock:
                if self._fetched_at < time.monotonic() - min(1.0, self._ttl_s):
                    self._names = frozenset(n.name for n in await self._slurm.nodes())
                    self._fetched_at = time.monotonic()
        return set(self._names.intersection(nodes))
