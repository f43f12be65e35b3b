"""The health gate that proves the hardware: Slurm's side and the agent's.

After a repair the node passes only when slurmd registered again and answers with all its
GPUs (the `health_gate` activity) AND the node's own agent has sent a snapshot observed
after the machine came back (after it stopped, from another boot; after a GPU reset: after
the Slurm check) that shows the expected GPU count, no fault seen since, every InfiniBand
port healthy, and none of the incident's faults. Snapshots reach the incident through the
`health_evidence` update (the API forwards them); the gate waits for a fresh healthy one up
to the policy's `agent_report_timeout_s`, and fails at once when a fresh one still shows a
fault of the incident. Judging is `core.evidence.judge`: pure, so deterministic.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.evidence import EvidenceAck, HealthSnapshot, Judgement, judge
    from autoclusters.core.models import (
        HealthGateInput,
        HealthReport,
        IncidentState,
        RepairResult,
        Waiting,
    )

from autoclusters.workflows.incident import Incident

KEEP_SNAPSHOTS = 30  # the latest ones; older ones cannot be fresh for a gate still to come
KEEP_BOOTS = 20
GATE_CALL = timedelta(minutes=2)


class Evidence:
    """What the node's agent sent: the latest snapshots, and every boot id seen with when
    it was first seen (a machine's identity)."""

    def __init__(self, state: IncidentState) -> None:
        self.state = state
        self.snapshots: list[HealthSnapshot] = []
        self.boots: dict[str, datetime] = {}

    def is_news(self, snap: HealthSnapshot) -> bool:
        """Worth a place in the history: anything while the gate waits for it; otherwise
        only what changes the picture (another boot, GPUs, fault kinds, ports). Agents
        send every few seconds; an incident held for days must not record each one."""
        waiting = self.state.waiting_for
        if waiting is not None and waiting.kind == "agent_report":
            return True
        ev = self.snapshots
        return not ev or _gist(snap) != _gist(ev[-1])

    def take(self, snap: HealthSnapshot) -> EvidenceAck:
        ev, req = self.snapshots, self.state.request
        kept = snap.node == req.node and all(s.snapshot_id != snap.snapshot_id for s in ev)
        if kept:
            ev.append(snap)
            del ev[:-KEEP_SNAPSHOTS]
            boots = self.boots
            if snap.boot_id and (
                snap.boot_id not in boots or snap.observed_at < boots[snap.boot_id]
            ):
                boots[snap.boot_id] = snap.observed_at
                for old in sorted(boots, key=boots.__getitem__)[:-KEEP_BOOTS]:
                    del boots[old]
        return EvidenceAck(incident_id=req.incident_id, kept=kept, snapshots=len(ev))

    def boot_before(self, since: datetime) -> str | None:
        """The boot the agent reported from before the machine stopped (None: unknown)."""
        before = [(first, b) for b, first in self.boots.items() if first < since]
        return max(before)[1] if before else None


async def health_gate(inc: Incident, evidence: Evidence, done: RepairResult) -> HealthReport:
    """The gate after the repair `done`: Slurm's side, then the agent's evidence."""
    s = inc.state
    node = inc.node

    async def gate() -> HealthReport:
        slurm: HealthReport = await inc.steps.call(
            contracts.health_gate,
            HealthGateInput(node=node),
            f"health gate {node}: slurmd with all its GPUs",
            timeout=GATE_CALL,
        )
        if done.stopped_at is not None:
            since = datetime.fromtimestamp(done.stopped_at, UTC)
            old_boot = evidence.boot_before(since)
        else:  # a GPU reset: the machine stayed up; evidence from after the reset
            at = slurm.checked_at
            since = datetime.fromtimestamp(at, UTC) if at is not None else workflow.now()
            old_boot = None
        faults = [f.fault for f in s.faults]

        def now() -> Judgement:
            return judge(
                evidence.snapshots,
                since=since,
                old_boot_id=old_boot,
                expected_gpus=slurm.expected_gpus,
                incident_faults=faults,
            )

        timeout = inc.policy.agent_report_timeout_s
        if slurm.passed and now().verdict == "waiting":
            s.waiting_for = Waiting(
                kind="agent_report",
                step="health_gate",
                detail=f"a healthy report from {node}'s agent, up to {timeout:.0f}s",
                since=workflow.now(),
            )
            try:
                await workflow.wait_condition(
                    lambda: now().verdict != "waiting", timeout=timedelta(seconds=timeout)
                )
            except TimeoutError:
                pass
            finally:
                s.waiting_for = None
        j = now()
        agent = j.checks
        if slurm.passed and j.verdict == "waiting":
            waited = f"{agent[0].detail} (waited {timeout:.0f}s)"
            agent = [agent[0].model_copy(update={"detail": waited}), *agent[1:]]
        checks = [*slurm.checks, *agent]
        return HealthReport(
            node=node,
            passed=slurm.passed and j.verdict == "passed",
            checks=checks,
            checked_at=slurm.checked_at,
            expected_gpus=slurm.expected_gpus,
        )

    return await inc.steps.step(
        "health_gate",
        gate,
        detail=lambda r: "passed" if r.passed else f"FAILED: {r.failures()}",
    )


def _gist(snap: HealthSnapshot) -> tuple[object, ...]:
    """What a snapshot says about the machine, without when it said it."""
    ib = tuple(sorted((p.hca, p.port, p.healthy) for p in snap.infiniband or []))
    return (
        snap.boot_id,
        snap.gpu_count,
        snap.expected_gpus,
        tuple(sorted({f.fault for f in snap.faults})),
        tuple(sorted(set(snap.firing))),
        ib,
    )
