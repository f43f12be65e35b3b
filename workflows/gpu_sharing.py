"""GpuSharing: GPU nodes lent from Slurm training to Kubernetes inference as inference
demand rises, and returned when it falls. One per cluster, long-running, continued as new.

The runbook, per evaluation (on a timer, or at once when an alert says the SLO is at risk):
settle the nodes incidents took -> a person's queued move, or: read demand (Prometheus,
Slurm, both pools) -> decide (`core.sharing.decide`: hysteresis, sustain, cooldown, min
training / max inference) -> borrow for training or give back -> at most one move.

Lend a node:   drain it in Slurm under the move's reason -> ask its jobs to checkpoint and
               requeue (their checkpoint signal; what still runs after the grace is
               requeued) -> hand it to Kubernetes (label inference, lift the pool taint) ->
               scale the inference Deployment -> wait until the replica there serves ->
               mark it lent in Slurm.
Return a node: scale the Deployment down with the node's pod marked cheapest to delete (it
               drains gracefully) -> label and taint it back to training -> health gate (the
               runbook's: Slurm with all GPUs, and a fresh healthy report from the node's
               agent) -> resume it in Slurm -> requeue narrowed jobs so they regrow.

A node runs Slurm jobs or inference pods, never both: Slurm drains it and it is idle before
Kubernetes gets it; Kubernetes has emptied it before Slurm resumes it. A node that fails the
gate stays drained, a human is paged. One owner per node: a remediation incident that opens
on a lent or moving node asks for it (`yield_node`), gets it after the move's current step,
and the move stops there. Every move, with the demand figures that justified it, is in the
history. Each part of the runbook is a module of workflows/sharing/.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from autoclusters.core.sharing import (
        SHARING_WORKFLOW,
        ClearUnhealthy,
        Move,
        MoveDecision,
        MoveRequest,
        SharePolicy,
        ShareStatus,
        SharingInput,
        YieldCall,
        YieldResult,
    )

from autoclusters.workflows.agent_gate import AgentGate
from autoclusters.workflows.sharing import manual
from autoclusters.workflows.sharing.approval import MoveApproval
from autoclusters.workflows.sharing.borrowing import Borrowing
from autoclusters.workflows.sharing.evaluation import evaluate, read_demand
from autoclusters.workflows.sharing.moves import Moves
from autoclusters.workflows.sharing.run import SharingRun
from autoclusters.workflows.sharing.yielding import hand_over, settle_yielded

# Continue as new well before the history grows large (each evaluation is ~6 events).
EVALUATIONS_PER_RUN = 500


@workflow.defn(name=SHARING_WORKFLOW)
class GpuSharing(AgentGate):
    @workflow.init
    def __init__(self, inp: SharingInput) -> None:
        self._sh = sh = SharingRun(inp)
        self._evaluate_now: str | None = None
        self._evaluations_this_run = 0
        self._approval = MoveApproval(sh)
        self._moves = Moves(sh, self._approval, self._agent_gate)
        self._borrowing = Borrowing(sh, self._moves)
        self._init_agent_gate()

    @workflow.run
    async def run(self, inp: SharingInput) -> None:
        sh, s = self._sh, self._sh.state
        while True:
            try:
                await workflow.wait_condition(
                    lambda: bool(s.queued or self._evaluate_now or s.yielded),
                    timeout=timedelta(seconds=sh.policy.evaluate_every_s),
                )
            except TimeoutError:
                pass
            await settle_yielded(sh)
            if s.queued:
                await self._moves.run(s.queued.pop(0))
            else:
                self._evaluate_now = None
                await self._evaluate()
            if (
                workflow.info().is_continue_as_new_suggested()
                or self._evaluations_this_run >= EVALUATIONS_PER_RUN
            ):
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(sh.carried())

    async def _evaluate(self) -> None:
        sh = self._sh
        demand = await read_demand(sh)
        if demand is None:
            return  # a source is away: no move, streaks unchanged
        sh.state.evaluations += 1
        self._evaluations_this_run += 1
        ev = evaluate(sh, demand)
        if ev.borrowing and await self._borrowing.turn(ev.demand, ev.verdict):
            return
        v = ev.verdict
        if v.to is None or v.node is None:
            return
        await self._moves.run(
            Move(move_id=sh.next_move_id(), node=v.node, to=v.to, reason=v.why, demand=ev.demand)
        )

    # --- what people and other workflows call ------------------------------------------

    @workflow.query
    def status(self) -> ShareStatus:
        sh, s = self._sh, self._sh.state
        return ShareStatus(
            cluster=sh.cluster,
            policy=sh.policy,
            pools=dict(s.pools),
            last_demand=s.last_demand,
            last_verdict=s.last_verdict,
            current=sh.current,
            moves=s.moves[-10:],
            queued=list(s.queued),
            evaluations=s.evaluations,
            unhealthy=list(s.unhealthy),
            borrows=s.borrows[-10:],
            lost=list(s.lost.values()),
            last_borrow_verdict=s.last_borrow_verdict,
        )

    @workflow.signal
    def evaluate_now(self, why: str) -> None:
        """An alert says the inference SLO is at risk: evaluate without waiting the timer."""
        self._evaluate_now = why or "asked"

    @workflow.signal
    def set_policy(self, policy: SharePolicy) -> None:
        self._sh.policy = policy

    @workflow.update
    def request_move(self, req: MoveRequest) -> str:
        """A person's move, run through the same steps; the move id is returned."""
        return manual.queue_move(self._sh, req)

    @request_move.validator
    def _check_move(self, req: MoveRequest) -> None:
        manual.check_move(self._sh, req)

    @workflow.update
    def clear_unhealthy(self, req: ClearUnhealthy) -> str:
        """A human looked at a node that failed its gate on return and fixed it: neither
        pool is barred from it any more. It stays drained in Slurm until they resume it;
        the sharing workflow never resumes a node it did not gate itself."""
        return manual.clear(self._sh, req)

    @clear_unhealthy.validator
    def _check_clear(self, req: ClearUnhealthy) -> None:
        manual.check_clear(self._sh, req)

    @workflow.signal
    def decide_move(self, decision: MoveDecision) -> None:
        """Kept so that a signal sent to an older run still counts there. A signal carries
        no answer and its proof could not be checked before it counts: on runs with the
        proof (DECISION_PROOF_PATCH, sharing/approval.py) it decides nothing; decide with
        `decide_waiting_move`, through the API or Slack."""
        self._approval.by_signal(decision)

    @workflow.update
    async def decide_waiting_move(self, decision: MoveDecision) -> str:
        """Approve or reject the move waiting for a human (the API, for the CLI and Slack's
        buttons); the validator refuses, with the reason, a move that is not waiting, or a
        decision without a proof of who made it. The worker checks the proof first
        (activities/decisions.py): one that does not hold fails the update (recorded in
        the history) and the move still waits. Returns what the decision did: `approved`
        or `rejected`."""
        return await self._approval.proven(decision)

    @decide_waiting_move.validator
    def _check_decision(self, decision: MoveDecision) -> None:
        self._approval.check(decision)

    @workflow.update
    async def yield_node(self, call: YieldCall) -> YieldResult:
        """An incident opened on a node this sharing workflow holds: it gets the node once the
        move's current step (if any) has finished; the move stops there."""
        return await hand_over(self._sh, call)
