"""GpuRebalance: GPU nodes lent from Slurm training to Kubernetes inference as inference
demand rises, and returned when it falls. One per cluster, long-running, continued as new.

The runbook, per evaluation (on a timer, or at once when an alert says the SLO is at risk):
read demand (Prometheus, Slurm, both pools) -> decide (`core.sharing.decide`: hysteresis,
sustain, cooldown, min training / max inference) -> at most one move.

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
history.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.borrowing import BorrowVerdict, decide_borrow, note_lost
    from autoclusters.core.models import HealthGateInput, Notification, ProofCheck, StepRecord
    from autoclusters.core.sharing import (
        MOVE_APPROVAL_STEP,
        REBALANCE_FAULT,
        REBALANCE_WORKFLOW,
        Borrow,
        ClearUnhealthy,
        Demand,
        DemandCall,
        Move,
        MoveCall,
        MoveDecision,
        MoveRecord,
        MoveRequest,
        MoveStep,
        Pool,
        RebalanceInput,
        RebalanceState,
        SharePolicy,
        ShareStatus,
        Verdict,
        YieldCall,
        YieldResult,
        decide,
        move_subject,
    )

from autoclusters.workflows.agent_gate import AgentGate
from autoclusters.workflows.outage import outage_of
from autoclusters.workflows.steps import (
    NOTIFY_RETRY,
    Defaults,
    Steps,
    Unrecorded,
    cause_of,
)

T = TypeVar("T")

RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
    non_retryable_error_types=["UnknownNode", "NodeNotOurs"],
)
STEP_TIMEOUT = timedelta(minutes=5)
KEEP_MOVES = 50
KEEP_BORROWS = 20
# docs/versioning.md: a return also waits for the request rate to fall (core/sharing.py decide).
RETURN_WAITS_FOR_THE_RATE = "gpu_rebalance-0.2-return-waits-for-the-rate"
# docs/versioning.md: a decision on a move counted on the name it gave (by the update, or the
# `decide_move` signal); now the worker checks the API's proof of who decided
# (`check_decision_proof`, a local activity) first, and the signal decides nothing.
DECISION_PROOF_PATCH = "gpu_rebalance-0.2-decision-proof"
# What each step of a move does to its node, as the Temporal UI shows it.
MOVE_SUMMARIES = {
    "drain": "drain {node} in Slurm to lend it to inference",
    "checkpoint_and_requeue": "checkpoint and requeue the jobs on {node}",
    "k8s_lend": "hand {node} to Kubernetes inference (label, lift the pool taint)",
    "scale_up_inference": "scale inference up onto {node}",
    "wait_serving": "wait until the inference replica on {node} serves",
    "mark_lent": "mark {node} lent in Slurm",
    "scale_down_inference": "scale inference down off {node}",
    "k8s_reclaim": "give {node} back to the training pool in Kubernetes",
    "health_gate": "health-gate {node} before it returns to training",
    "resume_in_slurm": "resume {node} in Slurm",
    "regrow_jobs": "requeue the narrowed training jobs so they regrow onto {node}",
}
# Continue as new well before the history grows large (each evaluation is ~6 events).
EVALUATIONS_PER_RUN = 500


class MoveStopped(Exception):
    """The move ends early: an incident took the node, or a human said no."""


class _MoveLog:
    """The StepLog of a move: its steps are MoveSteps on the move's record, and the step
    running now is what a yielding incident waits for."""

    def __init__(self, wf: GpuRebalance, rec: MoveRecord) -> None:
        self._wf, self._rec = wf, rec
        self._open: dict[int, MoveStep] = {}

    @property
    def current_step(self) -> str | None:
        return self._wf._running_step

    @current_step.setter
    def current_step(self, name: str | None) -> None:
        self._wf._running_step = name

    def begin(self, name: str) -> StepRecord:
        step = MoveStep(name=name, started_at=workflow.now().timestamp())
        self._rec.steps.append(step)
        rec = StepRecord(name=name, started_at=workflow.now())
        self._open[id(rec)] = step
        return rec

    def end(self, rec: StepRecord) -> None:
        step = self._open.pop(id(rec))
        step.ok, step.detail = rec.outcome == "ok", rec.detail
        step.finished_at = workflow.now().timestamp()


@workflow.defn(name=REBALANCE_WORKFLOW)
class GpuRebalance(AgentGate):
    @workflow.init
    def __init__(self, inp: RebalanceInput) -> None:
        self._cluster = inp.cluster
        self._policy = inp.policy
        self._s = inp.state or RebalanceState()
        self._evaluate_now: str | None = None
        self._decisions: dict[str, MoveDecision] = {}
        self._current: MoveRecord | None = None
        self._running_step: str | None = None
        self._evaluations_this_run = 0
        # The rebalancer's activities outside a move; a move's steps are on its record.
        self._steps = Steps(Unrecorded(), Defaults(STEP_TIMEOUT, RETRY))
        self._init_agent_gate()

    @workflow.run
    async def run(self, inp: RebalanceInput) -> None:
        while True:
            try:
                await workflow.wait_condition(
                    lambda: bool(self._s.queued or self._evaluate_now or self._s.yielded),
                    timeout=timedelta(seconds=self._policy.evaluate_every_s),
                )
            except TimeoutError:
                pass
            await self._settle_yielded()
            if self._s.queued:
                await self._run_move(self._s.queued.pop(0))
            else:
                self._evaluate_now = None
                await self._evaluate()
            if (
                workflow.info().is_continue_as_new_suggested()
                or self._evaluations_this_run >= EVALUATIONS_PER_RUN
            ):
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(
                    RebalanceInput(cluster=self._cluster, policy=self._policy, state=self._s)
                )

    # --- what people and other workflows call ------------------------------------------

    @workflow.query
    def status(self) -> ShareStatus:
        return ShareStatus(
            cluster=self._cluster,
            policy=self._policy,
            pools=dict(self._s.pools),
            last_demand=self._s.last_demand,
            last_verdict=self._s.last_verdict,
            current=self._current,
            moves=self._s.moves[-10:],
            queued=list(self._s.queued),
            evaluations=self._s.evaluations,
            unhealthy=list(self._s.unhealthy),
            borrows=self._s.borrows[-10:],
            lost=list(self._s.lost.values()),
            last_borrow_verdict=self._s.last_borrow_verdict,
        )

    @workflow.signal
    def evaluate_now(self, why: str) -> None:
        """An alert says the inference SLO is at risk: evaluate without waiting the timer."""
        self._evaluate_now = why or "asked"

    @workflow.signal
    def set_policy(self, policy: SharePolicy) -> None:
        self._policy = policy

    @workflow.update
    def request_move(self, req: MoveRequest) -> str:
        """A person's move, run through the same steps; the move id is returned."""
        move = Move(
            move_id=self._next_move_id(),
            node=req.node,
            to=req.to,
            reason=f"asked by {req.requested_by}",
            requested_by=req.requested_by,
        )
        self._s.queued.append(move)
        return move.move_id

    @request_move.validator
    def _check_move(self, req: MoveRequest) -> None:
        known = self._s.last_demand.nodes if self._s.last_demand else []
        node = next((n for n in known if n.name == req.node), None)
        if node is None:
            raise ValueError(f"{req.node} is not a GPU node this rebalancer can move")
        pool = self._s.pools.get(req.node, node.pool)
        want = Pool.INFERENCE if req.to == "inference" else Pool.TRAINING
        if pool == want:
            raise ValueError(f"{req.node} is already in the {want.value} pool")
        if pool == Pool.MOVING or any(m.node == req.node for m in self._s.queued):
            raise ValueError(f"{req.node} is already moving")
        if node.in_incident or req.node in self._s.yielded:
            raise ValueError(f"{req.node} is in a remediation incident")
        lent = next((b for b in self._s.borrows if b.active and b.node == req.node), None)
        if lent is not None:
            raise ValueError(
                f"{req.node} is lent to training while {lent.for_node} is repaired (incident "
                f"{lent.incident_id}); it goes back to inference on its own"
            )

    @workflow.update
    def clear_unhealthy(self, req: ClearUnhealthy) -> str:
        """A human looked at a node that failed its gate on return and fixed it: neither
        pool is barred from it any more. It stays drained in Slurm until they resume it;
        the rebalancer never resumes a node it did not gate itself."""
        self._s.unhealthy.remove(req.node)
        workflow.logger.info("%s cleared by %s", req.node, req.by)
        return f"{req.node} cleared by {req.by}"

    @clear_unhealthy.validator
    def _check_clear(self, req: ClearUnhealthy) -> None:
        if not req.by.strip():
            raise ValueError("clearing a node needs the name of who cleared it")
        if req.node not in self._s.unhealthy:
            listed = ", ".join(self._s.unhealthy) or "none"
            raise ValueError(
                f"{req.node} is not listed as failed its health gate (listed: {listed})"
            )

    @workflow.signal
    def decide_move(self, decision: MoveDecision) -> None:
        """Kept so that a signal sent to an older run still counts there. A signal carries
        no answer and its proof could not be checked before it counts: on runs with the
        proof (DECISION_PROOF_PATCH) it decides nothing; decide with `decide_waiting_move`,
        through the API or Slack."""
        if workflow.patched(DECISION_PROOF_PATCH):
            workflow.logger.warning(
                "decision on move %s by %s ignored: a decision is an update with the API's "
                "proof of who decided (`autoclusters share approve`, Slack)",
                decision.move_id,
                decision.by,
            )
            return
        self._decisions[decision.move_id] = decision

    @workflow.update
    async def decide_waiting_move(self, decision: MoveDecision) -> str:
        """Approve or reject the move waiting for a human (the API, for the CLI and Slack's
        buttons); the validator refuses, with the reason, a move that is not waiting, or a
        decision without a proof of who made it. The worker checks the proof first
        (activities/decisions.py): one that does not hold fails the update (recorded in
        the history) and the move still waits. Returns what the decision did: `approved`
        or `rejected`."""
        # Runs started before proofs took a decision on its name alone; their replays must
        # issue no check (docs/versioning.md).
        if workflow.patched(DECISION_PROOF_PATCH):
            verdict = await workflow.execute_local_activity(
                contracts.check_decision_proof,
                ProofCheck(
                    proof=decision.proof,
                    subject=move_subject(self._cluster, decision.move_id),
                    step=MOVE_APPROVAL_STEP,
                    approver=decision.by,
                    approve=decision.approve,
                ),
                start_to_close_timeout=timedelta(seconds=10),
            )
            try:
                if not verdict.ok:
                    raise ValueError(verdict.reason)
                self._check_decision_state(decision)  # again: it may have moved on meanwhile
            except ValueError as e:
                workflow.logger.warning(
                    "decision on move %s by %s refused: %s", decision.move_id, decision.by, e
                )
                raise ApplicationError(str(e), type="DecisionRefused", non_retryable=True) from None
        self._decisions[decision.move_id] = decision
        return "approved" if decision.approve else "rejected"

    @decide_waiting_move.validator
    def _check_decision(self, decision: MoveDecision) -> None:
        self._check_decision_state(decision)
        if not decision.proof:
            raise ValueError(
                "no proof of who decides: decide through the API (`autoclusters share "
                "approve|reject` with your operator token) or Slack's buttons"
            )

    def _check_decision_state(self, decision: MoveDecision) -> None:
        if not decision.by.strip():
            raise ValueError("a decision needs the name of who decides")
        cur = self._current
        if cur is not None and cur.move.move_id == decision.move_id:
            if cur.status != "waiting_approval":
                raise ValueError(
                    f"move {decision.move_id} is not waiting for approval: {cur.status}"
                )
            if decision.move_id in self._decisions:
                raise ValueError(f"move {decision.move_id} is already decided")
            if cur.move.node in self._s.yielded:
                raise ValueError(
                    f"move {decision.move_id} is stopping: incident "
                    f"{self._s.yielded[cur.move.node]} took {cur.move.node}"
                )
            return
        past = next(
            (m for m in reversed(self._s.moves) if m.move.move_id == decision.move_id), None
        )
        if past is None:
            queued = any(m.move_id == decision.move_id for m in self._s.queued)
            if queued:
                raise ValueError(f"move {decision.move_id} is queued, not waiting for approval")
            raise ValueError(f"no move {decision.move_id} on cluster {self._cluster}")
        by = f" by {past.approved_by}" if past.approved_by else ""
        why = f" ({past.error})" if past.error else ""
        raise ValueError(
            f"move {decision.move_id} is not waiting for approval: {past.status}{by}{why}"
        )

    @workflow.update
    async def yield_node(self, call: YieldCall) -> YieldResult:
        """An incident opened on a node this rebalancer holds: it gets the node once the
        move's current step (if any) has finished; the move stops there."""
        pool = self._s.pools.get(call.node)
        if pool not in (Pool.INFERENCE, Pool.MOVING) and call.node not in self._s.yielded:
            return YieldResult(held=False, pool_before=pool)
        self._s.yielded[call.node] = call.incident_id
        waited = None
        if self._current is not None and self._current.move.node == call.node:
            waited = self._running_step
        await workflow.wait_condition(
            lambda: self._current is None or self._current.move.node != call.node
        )
        return YieldResult(held=True, pool_before=pool, waited_for_step=waited)

    # --- the runbook -----------------------------------------------------------------------

    async def _evaluate(self) -> None:
        try:
            demand = await self._steps.call(
                contracts.share_read_demand,
                DemandCall(cluster=self._cluster, policy=self._policy, pools=dict(self._s.pools)),
                f"read inference and training demand on cluster {self._cluster}",
                timeout=timedelta(minutes=1),
            )
        except ActivityError as err:
            if outage_of(err) is None:
                raise
            # Prometheus, Slurm or Kubernetes away: no figure is not a calm figure. Hold
            # this evaluation (no move, streaks unchanged) and look again next interval.
            workflow.logger.warning("rebalancer holds: demand unreadable (%s)", cause_of(err))
            return
        self._s.evaluations += 1
        self._evaluations_this_run += 1
        if self._s.unhealthy:
            # A node that failed its gate on the way back is drained, idle and labelled
            # training: to the figures, the cheapest node to lend. It is a human's until
            # they clear it; neither pool may take it meanwhile.
            demand = demand.model_copy(
                update={
                    "nodes": [
                        n.model_copy(update={"in_incident": True})
                        if n.name in self._s.unhealthy
                        else n
                        for n in demand.nodes
                    ]
                }
            )
        for n in demand.nodes:
            self._s.pools.setdefault(n.name, n.pool)
        # Borrowed from inference: only a policy that allows it, or a borrow still out,
        # reaches this (no command before a borrow: older histories replay as they were).
        borrowing = self._policy.borrow_from_inference or any(b.active for b in self._s.borrows)
        if borrowing:
            self._s.lost = note_lost(
                self._s.last_demand,
                demand,
                self._s.lost,
                at=workflow.now().timestamp(),
                borrowed={b.node for b in self._s.borrows if b.active},
            )
        since = (
            None
            if self._s.last_move_end is None
            else workflow.now().timestamp() - self._s.last_move_end
        )
        # 0.1 returned on a calm latency alone, whatever the request rate.
        rate_guard = workflow.patched(RETURN_WAITS_FOR_THE_RATE)
        verdict = decide(
            demand,
            self._policy,
            breach_streak=self._s.breach_streak,
            calm_streak=self._s.calm_streak,
            seconds_since_last_move=since,
            lend_rps=self._last_lend_rps() if rate_guard else None,
        )
        self._s.breach_streak, self._s.calm_streak = verdict.breach_streak, verdict.calm_streak
        self._s.last_demand, self._s.last_verdict = demand, verdict
        if borrowing and await self._borrowing(demand, verdict):
            return
        if verdict.to is None or verdict.node is None:
            return
        await self._run_move(
            Move(
                move_id=self._next_move_id(),
                node=verdict.node,
                to=verdict.to,
                reason=verdict.why,
                demand=demand,
            )
        )

    def _last_lend_rps(self) -> float | None:
        """The request rate that needed the latest lend the rebalancer made."""
        for rec in reversed(self._s.moves):
            if rec.move.to == "inference" and rec.status == "done":
                return rec.move.demand.inference_rps if rec.move.demand else None
        return None

    async def _run_move(self, move: Move, *, approval: bool = True) -> MoveRecord:
        rec = MoveRecord(move=move, started_at=workflow.now().timestamp())
        self._current = rec
        self._s.moves.append(rec)
        del self._s.moves[:-KEEP_MOVES]
        before = self._s.pools.get(move.node, Pool.TRAINING)
        self._s.pools[move.node] = Pool.MOVING
        asked = approval and self._policy.needs_approval and move.requested_by == "rebalancer"
        try:
            if asked:
                await self._approval(rec)
            rec.status = "running"
            if move.to == "inference":
                await self._lend(rec)
                self._s.pools[move.node] = Pool.INFERENCE
            else:
                passed = await self._return(rec)
                self._s.pools[move.node] = Pool.TRAINING if passed else Pool.MOVING
                if not passed:
                    rec.status = "failed"
                    self._s.unhealthy.append(move.node)
                    self._s.pools.pop(move.node, None)
            if rec.status == "running":
                rec.status = "done"
        except MoveStopped as e:
            rec.error = str(e)
            if move.node in self._s.yielded:
                rec.status = "yielded"
            else:
                rec.status = "rejected"
                self._s.pools[move.node] = before
        except ActivityError as e:
            rec.status = "failed"
            rec.error = str(cause_of(e))
            # Where the node is now is read again at the next evaluation.
            self._s.pools.pop(move.node, None)
            await self._notify(move, "move_failed", f"{move.node}: {rec.error}", "warning")
        finally:
            rec.finished_at = workflow.now().timestamp()
            self._s.last_move_end = rec.finished_at
            self._current = None
            self._running_step = None
            if move.node in self._s.yielded:
                self._s.pools.pop(move.node, None)
        # People were asked about this move: its message says how it ended (and loses its
        # buttons: a decision on another channel, or none in time, leaves none to click).
        # A failure has told them already.
        if asked and rec.status != "failed":
            await self._notify_outcome(rec)
        return rec

    async def _notify_outcome(self, rec: MoveRecord) -> None:
        move = rec.move
        if rec.status == "done":
            by = f", approved by {rec.approved_by}" if rec.approved_by else ""
            text = f"move {move.move_id}: {move.node} is now in {move.to}{by}."
            await self._notify(move, "move_done", text, "info")
        else:
            text = f"move {move.move_id}: {move.node} stays where it was: {rec.error}."
            await self._notify(move, "move_stopped", text, "info")

    async def _approval(self, rec: MoveRecord) -> None:
        move = rec.move
        rec.status = "waiting_approval"
        await self._notify(
            move,
            "approval_needed",
            f"move {move.move_id}: {move.node} to {move.to} ({move.reason}) needs approval. "
            f"Approve or reject with the buttons, or `autoclusters share approve "
            f"{move.move_id}` / `autoclusters share reject {move.move_id}`.",
            "warning",
        )
        try:
            await workflow.wait_condition(
                lambda: move.move_id in self._decisions or move.node in self._s.yielded,
                timeout=timedelta(seconds=self._policy.approval_timeout_s),
            )
        except TimeoutError:
            raise MoveStopped("nobody approved in time") from None
        if move.node in self._s.yielded:
            raise MoveStopped(f"incident {self._s.yielded[move.node]} took the node")
        decision = self._decisions.pop(move.move_id)
        if not decision.approve:
            raise MoveStopped(f"rejected by {decision.by}")
        rec.approved_by = decision.by

    async def _lend(self, rec: MoveRecord) -> None:
        call = self._call(rec.move)
        await self._move_step(rec, "drain", contracts.share_drain_for_move, call)
        left = await self._move_step(
            rec, "checkpoint_and_requeue", contracts.share_checkpoint_jobs, call
        )
        # Remember how wide each job ran, to regrow it when a node comes back.
        for job_id, width in left.widths.items():
            self._s.narrowed.setdefault(job_id, width)
        await self._move_step(rec, "k8s_lend", contracts.share_k8s_lend, call)
        grown = call.model_copy(update={"replicas": self._inference_count() + 1})
        await self._move_step(rec, "scale_up_inference", contracts.share_scale_inference, grown)
        await self._move_step(
            rec,
            "wait_serving",
            contracts.share_wait_serving,
            call,
            timeout=timedelta(seconds=self._policy.ready_timeout_s + 60),
        )
        await self._move_step(rec, "mark_lent", contracts.share_mark_lent, call)

    async def _return(self, rec: MoveRecord) -> bool:
        call = self._call(rec.move)
        # The node is already `moving` (out of the inference count): the others keep theirs.
        shrunk = call.model_copy(update={"replicas": self._inference_count()})
        await self._move_step(
            rec,
            "scale_down_inference",
            contracts.share_k8s_release,
            shrunk,
            timeout=timedelta(seconds=self._policy.ready_timeout_s + 60),
        )
        await self._move_step(rec, "k8s_reclaim", contracts.share_k8s_reclaim, call)
        since = workflow.now()
        report = await self._move_step(
            rec, "health_gate", contracts.health_gate, HealthGateInput(node=rec.move.node)
        )
        checks = report.checks
        if report.passed:
            checks = await self._agent_gate(
                rec.move.node,
                since,
                report.expected_gpus or 0,
                self._policy.ready_timeout_s,
            )
        failed = [c for c in checks if not c.passed]
        rec.steps.append(
            MoveStep(
                name="health_verdict",
                started_at=since.timestamp(),
                finished_at=workflow.now().timestamp(),
                ok=report.passed and not failed,
                detail="; ".join(f"{c.name}: {c.detail}" for c in failed) or "healthy",
            )
        )
        if not report.passed or failed:
            await self._notify(
                rec.move,
                "health_gate_failed",
                f"{rec.move.node} failed its health gate on its way back from inference; "
                f"left drained: {report.failures() or rec.steps[-1].detail}",
                "critical",
            )
            return False
        await self._move_step(rec, "resume_in_slurm", contracts.share_resume_training, call)
        if self._policy.regrow_training_jobs:
            regrow = call.model_copy(update={"regrow": dict(self._s.narrowed)})
            grown = await self._move_step(rec, "regrow_jobs", contracts.share_regrow_jobs, regrow)
            for job_id in grown.requeued + grown.settled:
                self._s.narrowed.pop(job_id, None)
        return True

    async def _settle_yielded(self) -> None:
        """A node an incident took is no longer lent: its Kubernetes side goes back to the
        training pool and the Deployment no longer counts it (the incident cordons it and
        evicts its pod; this keeps the pod from being recreated there)."""
        for node, incident in list(self._s.yielded.items()):
            if self._current is not None and self._current.move.node == node:
                continue
            # A node yielded while lent (no move to end) is out of the inference pool too:
            # the Deployment keeps a replica per node still lent, not one for this node.
            self._s.pools.pop(node, None)
            call = MoveCall(
                cluster=self._cluster,
                node=node,
                move_id=f"yield-{incident}",
                policy=self._policy,
                replicas=self._inference_count(),
            )
            try:
                await self._steps.call(
                    contracts.share_scale_inference,
                    call,
                    f"scale inference to {call.replicas} without {node} (incident {incident})",
                )
                await self._steps.call(
                    contracts.share_k8s_reclaim,
                    call,
                    f"give {node} back to the training pool (incident {incident})",
                )
            except ActivityError as e:
                workflow.logger.warning("settling %s after incident %s: %s", node, incident, e)
                return  # tried again at the next turn
            del self._s.yielded[node]

    # --- borrowed from inference (core/borrowing.py) -----------------------------------------

    async def _borrowing(self, demand: Demand, verdict: Verdict) -> bool:
        """Lend an inference node to a training job an incident narrowed, or give one
        back; True when a node moved (the evaluation's move)."""
        b = decide_borrow(
            demand,
            self._policy,
            lost=self._s.lost,
            borrows=self._s.borrows,
            barred=set(self._s.unhealthy) | set(self._s.yielded),
            inference_breached=(
                verdict.to == "inference" or verdict.breach_streak >= self._policy.sustain
            ),
            now=workflow.now().timestamp(),
        )
        self._s.last_borrow_verdict = b.why
        if b.action is None or b.node is None or b.for_node is None:
            return False
        if b.action == "borrow":
            await self._borrow(demand, b)
            return True
        out = next(x for x in self._s.borrows if x.status == "lent" and x.node == b.node)
        if b.action == "taken":
            out.status, out.ended_why = "taken", b.why
            await self._tell_incident(out, "borrow_ended", f"{b.why}.", "warning")
            return False
        await self._give_back(demand, out, b.why)
        return True

    async def _borrow(self, demand: Demand, b: BorrowVerdict) -> None:
        """The inference node goes to training through a return's steps: scaled off, back
        in the training pool, the health gate (a node is never lent sick), resumed, and
        the lost node's jobs regrown onto it from their checkpoint (pending ones start)."""
        assert b.node is not None and b.for_node is not None
        lost = self._s.lost[b.for_node]
        move = Move(
            move_id=self._next_move_id(),
            node=b.node,
            to="training",
            reason=f"borrowed for {b.for_node}: {b.why}",
            demand=demand,
        )
        out = Borrow(
            node=b.node,
            for_node=b.for_node,
            incident_id=lost.incident_id,
            fault=lost.fault,
            jobs=dict(lost.jobs),
            why=b.why,
            started_at=workflow.now().timestamp(),
            move_id=move.move_id,
        )
        self._s.borrows.append(out)
        del self._s.borrows[:-KEEP_BORROWS]
        for job_id, width in lost.jobs.items():
            self._s.narrowed.setdefault(job_id, width)
        rec = await self._run_move(move)
        jobs = ", ".join(str(j) for j in sorted(out.jobs))
        if rec.status == "done":
            out.status, out.lent_at = "lent", rec.finished_at
            await self._tell_incident(
                out,
                "borrowed_from_inference",
                f"{b.node} lent from inference to training while {b.for_node} is repaired "
                f"(move {move.move_id}): job(s) {jobs} keep their width. It goes back to "
                f"inference once {b.for_node} is in service again. Why: {b.why}.",
                "info",
            )
        else:
            out.status, out.ended_why = "failed", rec.error or rec.status
            await self._tell_incident(
                out,
                "borrow_failed",
                f"no node borrowed from inference for {b.for_node}: move {move.move_id} "
                f"{rec.status}{': ' + rec.error if rec.error else ''}.",
                "warning",
            )

    async def _give_back(self, demand: Demand, out: Borrow, why: str) -> None:
        """The borrowed node goes back to inference through a lend's steps: its jobs are
        asked to checkpoint and requeue (they start again at full width on the repaired
        node), then it serves again. It needs no approval: the borrow was the decision."""
        move = Move(
            move_id=self._next_move_id(),
            node=out.node,
            to="inference",
            reason=f"give back the node borrowed for {out.for_node}: {why}",
            demand=demand,
        )
        out.status, out.give_back_move = "giving_back", move.move_id
        rec = await self._run_move(move, approval=False)
        if rec.status == "done":
            out.status, out.returned_at = "returned", rec.finished_at
            await self._tell_incident(
                out,
                "borrow_returned",
                f"{out.node} given back to inference (move {move.move_id}): {why}; its "
                f"training job(s) requeued from their checkpoint onto the cluster's free nodes.",
                "info",
            )
        else:
            out.status, out.ended_why = (
                "taken" if rec.status == "yielded" else "failed",
                rec.error or rec.status,
            )
            await self._tell_incident(
                out,
                "borrow_failed",
                f"{out.node} not given back to inference (move {move.move_id} {rec.status}"
                f"{': ' + rec.error if rec.error else ''}).",
                "warning",
            )

    async def _tell_incident(self, out: Borrow, event: str, text: str, severity: str) -> None:
        """A borrow is told in the incident's own Slack thread (its id), not a move's."""
        await self._send(
            Notification(
                incident_id=out.incident_id,
                cluster=self._cluster,
                node=out.for_node,
                fault=out.fault or "unknown",
                event=event,
                text=text,
                severity=severity,
            )
        )

    # --- helpers ---------------------------------------------------------------------------

    def _inference_count(self) -> int:
        return sum(1 for p in self._s.pools.values() if p == Pool.INFERENCE)

    def _next_move_id(self) -> str:
        self._s.seq += 1
        return f"{self._cluster}-move-{self._s.seq}"

    def _call(self, move: Move) -> MoveCall:
        return MoveCall(
            cluster=self._cluster, node=move.node, move_id=move.move_id, policy=self._policy
        )

    async def _move_step(
        self,
        rec: MoveRecord,
        name: str,
        fn: Callable[..., Awaitable[T]],
        arg: Any,
        *,
        timeout: timedelta = STEP_TIMEOUT,
    ) -> T:
        """One step of a move, recorded on it (the step kernel); an incident that took the
        node meanwhile stops the move before the next step starts."""
        if rec.move.node in self._s.yielded:
            raise MoveStopped(f"incident {self._s.yielded[rec.move.node]} took the node")
        steps = Steps(_MoveLog(self, rec), self._steps.defaults)
        what = MOVE_SUMMARIES.get(name, name.replace("_", " ") + " {node}")
        summary = f"{what.format(node=rec.move.node)} (move {rec.move.move_id})"
        return await steps.activity(
            name,
            fn,
            arg,
            summary,
            lambda out: str(getattr(out, "detail", "") or ""),
            timeout=max(timeout, STEP_TIMEOUT),
        )

    async def _notify(self, move: Move, event: str, text: str, severity: str) -> None:
        await self._send(
            Notification(
                incident_id=move.move_id,
                cluster=self._cluster,
                node=move.node,
                fault=REBALANCE_FAULT,
                event=event,
                text=text,
                severity=severity,
            )
        )

    async def _send(self, note: Notification) -> None:
        try:
            await self._steps.call(
                contracts.notify,
                note,
                f"notify {note.event.replace('_', ' ')}: {note.node} ({note.incident_id})",
                timeout=timedelta(seconds=30),
                heartbeat=None,
                retry=NOTIFY_RETRY,
            )
        except ActivityError as e:  # a notification never blocks a move
            workflow.logger.warning("notify failed: %s", e)
