"""The health gate: checks on the node itself before it may take jobs again.

Implementations: `sandbox.health.SandboxHealth`. On real nodes the checks come from the
node health agent (NVML, InfiniBand) and DCGM diagnostics.
"""

from __future__ import annotations

from typing import Protocol

from autoclusters.models import HealthReport


class HealthGate(Protocol):
    async def check(self, node: str) -> HealthReport: ...
