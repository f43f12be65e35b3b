"""The health gate's Slurm side: slurmd registered again and answers with all its GPUs.

The hardware side comes from the node's own agent: its health snapshots reach the
incident (the API forwards them as an update) and the workflow waits for a fresh healthy
one (`workflows/health_gate_steps.py`).
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Protocol

from autoclusters.core.models import HealthCheck, HealthReport
from autoclusters.integrations.slurm import SlurmClient


class HealthGate(Protocol):
    async def check(self, node: str) -> HealthReport: ...


# How long a node the controller has not heard from since it restarted may stay UNKNOWN
# before the gate judges it: slurmctld asks every node to register within seconds.
UNKNOWN_GRACE_S = 30.0
_GPUS = re.compile(r"gpu(?::[^:(,]+)?:(\d+)")


def gres_gpus(gres: str) -> int:
    """GPUs a Slurm node offers: `gpu:8`, `gpu:h100:8`, `gpu:8(S:0-1)` -> 8."""
    m = _GPUS.search(gres)
    return int(m.group(1)) if m else 0


class SlurmHealthGate:
    """What Slurm itself can prove: slurmd answers, and the node offers all its GPUs.

    The node agent's evidence (NVML, InfiniBand) is judged in the workflow after this.
    """

    def __init__(
        self,
        slurm: SlurmClient,
        expected_gpus: int = 8,
        *,
        unknown_grace_s: float = UNKNOWN_GRACE_S,
        poll_s: float = 1.0,
    ) -> None:
        self._slurm = slurm
        self._expected = expected_gpus
        self._unknown_grace_s = unknown_grace_s
        self._poll_s = poll_s

    async def check(self, node: str) -> HealthReport:
        n = await self._slurm.node(node)
        deadline = time.monotonic() + self._unknown_grace_s
        while n is not None and n.state == "unknown" and time.monotonic() < deadline:
            # A controller that just restarted shows every node UNKNOWN until its slurmd
            # registers again (it asks them within a few seconds): not heard from yet is
            # not "failed". One still UNKNOWN after the grace fails the gate below, so a
            # slurmd that never comes back is repaired, not waited for.
            await asyncio.sleep(self._poll_s)
            n = await self._slurm.node(node)
        gpus = gres_gpus(n.gres) if n else 0
        checks = [
            HealthCheck(
                name="slurmd",
                passed=n is not None and n.responding,
                detail=n.display_state if n else "not in Slurm",
            ),
            HealthCheck(
                name="gpu_count",
                passed=gpus == self._expected,
                detail=f"{gpus} of {self._expected} GPUs",
            ),
        ]
        return HealthReport(
            node=node,
            passed=all(c.passed for c in checks),
            checks=checks,
            checked_at=time.time(),
            expected_gpus=self._expected,
        )
