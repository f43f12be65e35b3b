"""The agent's half of a new machine's health gate, for ClusterProvisioning and ScaleNodeSet:
the judgement the remediation runbook's gate makes (`core.evidence.judge`), on the
snapshots the node's own agent sends after the machine booted.

Slurm's half (slurmd registered with all its GPUs) is the provider's `cluster_health_gate`;
a node passes only when both do. Snapshots arrive through the workflow's
`health_evidence` update, which the API calls (`clients/api/evidence.py`) for a node
whose gate is waiting (`wants_evidence`); nothing else is kept, so agents reporting every
few seconds cost the history nothing outside a gate.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from autoclusters.core.evidence import EvidenceAck, HealthSnapshot, Judgement, judge
    from autoclusters.core.models import HealthCheck

KEEP_PER_NODE = 10


class AgentGate:
    """Mixed into a workflow whose `__init__` calls `_init_agent_gate`: brings the
    `health_evidence` update and the `wants_evidence` query the API calls."""

    _gate_since: dict[str, datetime]  # node -> its machine booted at (gate open)
    _gate_evidence: dict[str, list[HealthSnapshot]]

    @workflow.update
    def health_evidence(self, snap: HealthSnapshot) -> EvidenceAck:
        """A health snapshot from a node's agent, while that node's gate waits for one
        (the API forwards them)."""
        return self._gate_take(snap, workflow.info().workflow_id)

    @health_evidence.validator
    def _check_evidence(self, snap: HealthSnapshot) -> None:
        # A refused update leaves no event in the history.
        if not self._gate_wants(snap):
            raise ValueError(f"no health gate of {workflow.info().workflow_id} waits for it")

    @workflow.query
    def wants_evidence(self, snap: HealthSnapshot) -> bool:
        """Would `health_evidence` keep this snapshot? (The API asks first.)"""
        return self._gate_wants(snap)

    def _init_agent_gate(self) -> None:
        self._gate_since = {}
        self._gate_evidence = {}

    def _gate_wants(self, snap: HealthSnapshot) -> bool:
        since = self._gate_since.get(snap.node)
        if since is None or snap.observed_at < since:
            return False
        kept = self._gate_evidence.get(snap.node, [])
        return all(s.snapshot_id != snap.snapshot_id for s in kept)

    def _gate_take(self, snap: HealthSnapshot, owner: str) -> EvidenceAck:
        kept = self._gate_wants(snap)
        ev = self._gate_evidence.setdefault(snap.node, [])
        if kept:
            ev.append(snap)
            del ev[:-KEEP_PER_NODE]
        return EvidenceAck(incident_id=owner, kept=kept, snapshots=len(ev))

    async def _agent_gate(
        self, node: str, since: datetime, expected_gpus: int, timeout_s: float
    ) -> list[HealthCheck]:
        """Wait up to `timeout_s` for the node's agent to say the machine is healthy: a
        snapshot observed since `since` with every GPU, no fault and every InfiniBand port
        up. Returns the judgement's checks; all pass only on a healthy report."""
        if expected_gpus == 0:  # the GPU agent (a DaemonSet on GPU nodes) does not run there
            return [HealthCheck(name="agent_report", passed=True, detail="no GPUs: no agent")]
        self._gate_since[node] = since
        self._gate_evidence[node] = []

        def verdict() -> Judgement:
            seen = self._gate_evidence[node]
            return judge(
                seen,
                since=since,
                old_boot_id=None,  # a new machine: any boot since it booted is its own
                expected_gpus=expected_gpus,
                # A new machine has no fault to outgrow: any its agent reports fails it.
                incident_faults={f.fault for s in seen for f in s.faults},
            )

        try:
            await workflow.wait_condition(
                lambda: verdict().verdict != "waiting", timeout=timedelta(seconds=timeout_s)
            )
        except TimeoutError:
            pass
        finally:
            self._gate_since.pop(node, None)
        found = verdict()
        if found.verdict == "waiting":
            return [
                HealthCheck(
                    name="agent_report",
                    passed=False,
                    detail=f"no healthy report from {node}'s agent within {timeout_s:.0f}s"
                    + "".join(f"; {c.detail}" for c in found.checks if not c.passed),
                )
            ]
        return found.checks
