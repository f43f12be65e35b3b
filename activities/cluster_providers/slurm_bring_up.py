"""Slurm's side of bringing machines into a cluster, the same on every provider: wait for
the nodes' fresh slurmd registrations, the health gate's Slurm half, and the acceptance job.
Whatever made the machines (Managed Slurm VMs, CMK node pools), what Slurm must show of
them is the same, so both providers hold one of these rather than a copy each.

Slurm not answering (SlurmError) leaves as an ApplicationError of the error's type.
"""

from __future__ import annotations

from datetime import UTC, datetime

from temporalio import activity
from temporalio.exceptions import ApplicationError

from autoclusters.activities.acceptance_job import run_acceptance
from autoclusters.activities.crusoe_machines import wait_registered
from autoclusters.activities.heartbeat import heartbeating
from autoclusters.core.cluster import AcceptanceCall, AcceptanceResult, NodeGateCall
from autoclusters.core.models import HealthReport
from autoclusters.integrations.health import SlurmHealthGate
from autoclusters.integrations.slurm import SlurmBatchClient, SlurmError


class SlurmBringUp:
    """Slurm's side of a provider.

    Args:
        slurm: the cluster's Slurm.
        poll_s: how often a wait polls Slurm.
        register_timeout_s: how long `registered` waits for nodes to register; a node still
            missing then is left out (the workflow replaces it).
        acceptance_timeout_s: the longest an acceptance job may take before it is cancelled
            and counted failed.
    """

    def __init__(
        self,
        slurm: SlurmBatchClient,
        *,
        poll_s: float,
        register_timeout_s: float,
        acceptance_timeout_s: float,
    ) -> None:
        self._slurm = slurm
        self._poll_s = poll_s
        self._register_timeout_s = register_timeout_s
        self._acceptance_timeout_s = acceptance_timeout_s

    async def registered(self, wanted: list[str], created: dict[str, float]) -> list[str]:
        """The nodes of `wanted` that answer from a slurmd started after their machine was
        `created` (epoch seconds by node), once all do or the register timeout passed. The
        caller's step heartbeats."""
        return await wait_registered(
            self._slurm,
            wanted,
            created,
            poll_s=self._poll_s,
            timeout_s=self._register_timeout_s,
        )

    async def drain(self, node: str, reason: str) -> None:
        """Drain `node` under `reason` (the caller's registration step heartbeats)."""
        try:
            await self._slurm.drain(node, reason)
        except SlurmError as e:
            raise ApplicationError(str(e), type=type(e).__name__) from e

    async def health_gate(self, call: NodeGateCall) -> HealthReport:
        """Slurm's half of the gate: slurmd answers with all its GPUs. The node agent's half
        (NVML, InfiniBand) is judged in the workflow (workflows/agent_gate.py)."""
        async with heartbeating(f"health gate {call.machine.node}"):
            try:
                return await SlurmHealthGate(self._slurm, call.expected_gpus).check(
                    call.machine.node
                )
            except SlurmError as e:
                raise ApplicationError(str(e), type=type(e).__name__) from e

    async def acceptance_job(self, call: AcceptanceCall) -> AcceptanceResult:
        """`srun hostname` on every node of the set in one batch job (activities/
        acceptance_job.py); a retry adopts the job this workflow run submitted."""
        async with heartbeating(f"acceptance job on {call.node_set.name}"):
            try:
                return await run_acceptance(
                    self._slurm,
                    call.node_set,
                    _run_id(),
                    poll_s=self._poll_s,
                    timeout_s=self._acceptance_timeout_s,
                )
            except SlurmError as e:
                raise ApplicationError(str(e), type=type(e).__name__) from e


def created_epoch(rfc3339: str) -> float:
    """A machine's creation time from the API as epoch seconds; 0 when missing or
    unreadable (no constraint on its slurmd's start)."""
    try:
        t = datetime.fromisoformat(rfc3339.replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    return (t if t.tzinfo is not None else t.replace(tzinfo=UTC)).timestamp()


def _run_id() -> str:
    run_id = activity.info().workflow_run_id if activity.in_activity() else None
    return run_id or "no-run"
