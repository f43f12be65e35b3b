"""The burn-in screen in the runbook: after a repair, and before one for a silent fault.

After a repair that passed its health gate (policy `burn_in.enabled`), the screen is one
more check of the gate: failed, the ladder climbs. Before any repair, for a fault whose rule
says `screen_before_repair` (a hung job, a straggler: as often software as hardware), the
screen decides between return and repair: a node that passes goes back unrepaired, one that
fails climbs the ladder, and every repair after that is screened again before it returns.
The screen itself is activities/screen.py: a Slurm job in a breakfix reservation on the
node, which drains the node again under the incident's reason before it ends.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.models import (
        HealthCheck,
        HealthReport,
        ScreenInput,
        ScreenResult,
        drain_reason,
    )

from autoclusters.workflows.incident import Incident
from autoclusters.workflows.kubernetes_steps import KubernetesNode

# The screen beats every 2 s: a dead worker is noticed within 10 s and the retry adopts the
# job it submitted.
SCREEN_HEARTBEAT = timedelta(seconds=10)


class BurnIn:
    """The screens of one incident: their results on its state, its timeline and Slack."""

    def __init__(self, incident: Incident, k8s: KubernetesNode | None) -> None:
        self.incident = incident
        self.k8s = k8s
        # A screen before repair failed: every repair after it is screened, whatever
        # `burn_in.enabled` says (a node that failed a screen passes one before it returns).
        self.must_pass = False

    def after_repair(self) -> bool:
        """Is a repaired node that passed its gate screened before it returns?"""
        return self.incident.policy.burn_in.enabled or self.must_pass

    async def before_repair(self) -> bool:
        """The screen of a node whose jobs are recovered, before any repair: True when it
        passed (the node goes back without one); False: the repair ladder decides."""
        inc = self.incident
        req = inc.request
        res = await self.screen()
        if res.passed:
            return True
        self.must_pass = True
        rung = inc.state.rung or "the ladder"
        await inc.notify(
            "escalated",
            f"{req.node} failed its screen after {req.fault} ({res.detail}): "
            f"not software alone; next: {rung}",
            "warning",
        )
        return False

    async def gate_check(self, report: HealthReport) -> HealthReport:
        """After a repair: the screen joins the gate's report as one more check."""
        res = await self.screen()
        check = HealthCheck(name="burn_in_screen", passed=res.passed, detail=screen_text(res))
        return report.model_copy(update={"passed": res.passed, "checks": [*report.checks, check]})

    async def screen(self) -> ScreenResult:
        """The screen in a breakfix reservation; its result is kept on the incident."""
        inc = self.incident
        req, s, b = inc.request, inc.state, inc.policy.burn_in
        if self.k8s is not None:
            # On Slinky the operator turns a cordoned Node into a drained Slurm node, where
            # the screen's job could never start: uncordoned for the screen (the breakfix
            # reservation keeps Slurm's jobs off it), cordoned again if it fails. The
            # remediation taint stays, so that no other pod lands on the node on trial.
            await self.k8s.uncordon(keep_taint=True)
        res: ScreenResult = await inc.steps.activity(
            "burn_in_screen",
            contracts.burn_in_screen,
            ScreenInput(
                node=req.node,
                incident_id=req.incident_id,
                # Before any repair: attempt 0, so each screen has its own job name.
                key=f"{req.incident_id}:{s.repair_attempts}",
                drain_reason=drain_reason(req.incident_id, req.fault),
                timeout_s=b.timeout_s,
                size_mib=b.size_mib,
                rounds=b.rounds,
                min_bus_gbps=b.min_bus_gbps,
                neighbour=b.neighbour,
                min_gemm_tflops=b.min_gemm_tflops,
            ),
            f"burn-in screen of {req.node} in a breakfix reservation",
            screen_text,
            # The job's bound, plus the reservation, the drain and the clean-up around it.
            timeout=timedelta(seconds=b.timeout_s + 120),
            heartbeat=SCREEN_HEARTBEAT,
        )
        s.screens.append(res)
        inc.publish()
        if self.k8s is not None and not res.passed:
            await self.k8s.cordon("burn-in")
        return res


def screen_text(r: ScreenResult) -> str:
    """One line for the timeline, Slack and the gate's check."""
    with_ = f"with {r.neighbour}" if r.neighbour else "alone (no healthy idle neighbour)"
    if not r.neighbour and len(r.diag) > 1:  # a systemic incident's members, together
        with_ = f"together: {', '.join(sorted(r.diag))}"
    bw = (
        f"; all-reduce {r.busbw_gbps:.2f} GB/s bus, {r.allreduce_s * 1000:.1f} ms/round"
        if r.busbw_gbps is not None and r.allreduce_s is not None
        else ""
    )
    gemm = (
        "; GEMM " + ", ".join(f"{n} {t:.1f} TFLOP/s" for n, t in sorted(r.gemm_tflops.items()))
        if r.gemm_tflops
        else ""
    )
    verdict = "passed" if r.passed else f"FAILED: {r.detail}"
    return f"{verdict}; {with_}, job {r.job_id}, {r.seconds:.1f}s{bw}{gemm}"
