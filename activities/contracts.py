"""The activities as the workflows see them: name, input and result, and nothing else.

Workflows call these stubs, so importing a workflow loads no client library (Kubernetes,
Slack, HTTP) and replays stay cheap. The worker registers the implementations
(the classes next to this module) under the same names; `tests/activities/test_contracts.py` checks
that every stub has an implementation with the same input and result types.
"""

from __future__ import annotations

from temporalio import activity

from autoclusters.core.cluster import (
    AcceptanceCall,
    AcceptanceResult,
    BootResult,
    ClusterRef,
    DeleteCall,
    Machine,
    MachineCall,
    NodeGateCall,
    Placement,
    ProviderCall,
    Resource,
    SlurmConfigCall,
    SlurmConfigResult,
    TopologyCall,
    UsersCall,
    UsersResult,
)
from autoclusters.core.cluster_ops import (
    IncidentProbe,
    Inventory,
    NodeLoad,
    NodeLoadCall,
    WorkflowProbe,
)
from autoclusters.core.guard import (
    Admission,
    AdmitCall,
    GuardContext,
    GuardStatus,
    RegisterCall,
    Registration,
    ReleaseCall,
    SlurmView,
    SlurmViewCall,
    SpareCall,
    SpareClaim,
)
from autoclusters.core.handoff import HandoffCall, HandoffSent
from autoclusters.core.kubernetes import (
    CordonNodeInput,
    CordonNodeResult,
    EvictPodsInput,
    EvictPodsResult,
    NodeIdentity,
    NodeIdentityInput,
    SetNodeConditionInput,
    SetNodeConditionResult,
    UncordonNodeInput,
    UncordonNodeResult,
    WaitNewNodeInput,
)
from autoclusters.core.models import (
    CancelJobsInput,
    CancelJobsResult,
    CheckpointInput,
    CheckpointJobsResult,
    ControllerCheck,
    ControllerFacts,
    DrainInput,
    DrainResult,
    HealthGateInput,
    HealthReport,
    LiftSilenceInput,
    Notification,
    PlanRepairInput,
    ProofCheck,
    ProofVerdict,
    RepairInput,
    RepairPlan,
    RepairResult,
    ReplaceInput,
    ReplaceResult,
    RequeueInput,
    RequeueResult,
    ReturnInput,
    ReturnResult,
    ScreenInput,
    ScreenResult,
    SilenceInput,
    SilenceResult,
    SlurmNode,
    SpareInput,
    WaitIdleInput,
    WaitIdleResult,
    WaitRegisteredInput,
)
from autoclusters.core.quarantine import QuarantineStatus, VerifyQuarantineInput
from autoclusters.core.recovery_history import RecoveryFiguresCall, RecoveryFiguresRead
from autoclusters.core.recovery_loss import MeasureRecoveryInput, MeasureRecoveryResult
from autoclusters.core.sharing import (
    CheckpointResult,
    Demand,
    DemandCall,
    MoveCall,
    RegrowResult,
    StepOutcome,
    YieldCall,
    YieldResult,
)
from autoclusters.core.systemic import CloseSystemicCall, JoinAck, JoinCall


def _stub() -> NotImplementedError:
    return NotImplementedError("a contract: the worker runs the implementation")


# --- Slurm ----------------------------------------------------------------------------------


@activity.defn(name="drain_node")
async def drain_node(inp: DrainInput) -> DrainResult:
    raise _stub()


@activity.defn(name="requeue_jobs")
async def requeue_jobs(inp: RequeueInput) -> RequeueResult:
    raise _stub()


@activity.defn(name="checkpoint_jobs")
async def checkpoint_jobs(inp: CheckpointInput) -> CheckpointJobsResult:
    raise _stub()


@activity.defn(name="controller_facts")
async def controller_facts(inp: ControllerCheck) -> ControllerFacts:
    raise _stub()


@activity.defn(name="check_decision_proof")
async def check_decision_proof(c: ProofCheck) -> ProofVerdict:
    raise _stub()


@activity.defn(name="silence_node_alerts")
async def silence_node_alerts(inp: SilenceInput) -> SilenceResult:
    raise _stub()


@activity.defn(name="lift_silence")
async def lift_silence(inp: LiftSilenceInput) -> str:
    raise _stub()


@activity.defn(name="wait_node_idle")
async def wait_node_idle(inp: WaitIdleInput) -> WaitIdleResult:
    raise _stub()


@activity.defn(name="wait_node_registered")
async def wait_node_registered(inp: WaitRegisteredInput) -> SlurmNode:
    raise _stub()


@activity.defn(name="return_to_service")
async def return_to_service(inp: ReturnInput) -> ReturnResult:
    raise _stub()


@activity.defn(name="burn_in_screen")
async def burn_in_screen(inp: ScreenInput) -> ScreenResult:
    raise _stub()


@activity.defn(name="take_spare")
async def take_spare(inp: SpareInput) -> ReturnResult:
    raise _stub()


@activity.defn(name="park_as_spare")
async def park_as_spare(inp: SpareInput) -> ReturnResult:
    raise _stub()


@activity.defn(name="verify_quarantine")
async def verify_quarantine(inp: VerifyQuarantineInput) -> QuarantineStatus:
    raise _stub()


@activity.defn(name="cancel_jobs")
async def cancel_jobs(inp: CancelJobsInput) -> CancelJobsResult:
    raise _stub()


# --- the cloud and the health gate ----------------------------------------------------------


@activity.defn(name="plan_repair")
async def plan_repair(inp: PlanRepairInput) -> RepairPlan:
    raise _stub()


@activity.defn(name="repair_node")
async def repair_node(inp: RepairInput) -> RepairResult:
    raise _stub()


@activity.defn(name="replace_node")
async def replace_node(inp: ReplaceInput) -> ReplaceResult:
    raise _stub()


@activity.defn(name="health_gate")
async def health_gate(inp: HealthGateInput) -> HealthReport:
    raise _stub()


# --- the fleet guard ------------------------------------------------------------------------


@activity.defn(name="guard_register")
async def guard_register(call: RegisterCall) -> Registration:
    raise _stub()


@activity.defn(name="guard_admit_quarantine")
async def guard_admit_quarantine(call: AdmitCall) -> Admission:
    raise _stub()


@activity.defn(name="guard_admit_repair")
async def guard_admit_repair(call: AdmitCall) -> Admission:
    raise _stub()


@activity.defn(name="guard_admit_held_drain")
async def guard_admit_held_drain(call: AdmitCall) -> Admission:
    raise _stub()


@activity.defn(name="guard_claim_spare")
async def guard_claim_spare(call: SpareCall) -> SpareClaim:
    raise _stub()


@activity.defn(name="guard_refill_spare")
async def guard_refill_spare(call: SpareCall) -> list[str]:
    raise _stub()


@activity.defn(name="guard_release")
async def guard_release(call: ReleaseCall) -> None:
    raise _stub()


@activity.defn(name="guard_slurm_view")
async def guard_slurm_view(call: SlurmViewCall) -> SlurmView:
    raise _stub()


# --- systemic incidents (docs/systemic.md) -----------------------------------------------


@activity.defn(name="systemic_join")
async def systemic_join(call: JoinCall) -> JoinAck:
    raise _stub()


@activity.defn(name="systemic_close")
async def systemic_close(call: CloseSystemicCall) -> list[str]:
    raise _stub()


# --- Kubernetes -----------------------------------------------------------------------------


@activity.defn(name="k8s_cordon")
async def k8s_cordon(inp: CordonNodeInput) -> CordonNodeResult:
    raise _stub()


@activity.defn(name="k8s_uncordon")
async def k8s_uncordon(inp: UncordonNodeInput) -> UncordonNodeResult:
    raise _stub()


@activity.defn(name="k8s_evict_pods")
async def k8s_evict_pods(inp: EvictPodsInput) -> EvictPodsResult:
    raise _stub()


@activity.defn(name="k8s_wait_new_node_ready")
async def k8s_wait_new_node_ready(inp: WaitNewNodeInput) -> NodeIdentity:
    raise _stub()


@activity.defn(name="k8s_set_condition")
async def k8s_set_condition(inp: SetNodeConditionInput) -> SetNodeConditionResult:
    raise _stub()


@activity.defn(name="k8s_node_identity")
async def k8s_node_identity(inp: NodeIdentityInput) -> NodeIdentity:
    raise _stub()


# --- notifications --------------------------------------------------------------------------


@activity.defn(name="notify")
async def notify(note: Notification) -> None:
    raise _stub()


# --- cluster provisioning: the provider interface (sandbox, Crusoe Managed Slurm, CMK) ------


@activity.defn(name="cluster_create_controller")
async def cluster_create_controller(call: ProviderCall) -> Resource:
    raise _stub()


@activity.defn(name="cluster_create_accounting")
async def cluster_create_accounting(call: ProviderCall) -> Resource:
    raise _stub()


@activity.defn(name="cluster_create_shared_home")
async def cluster_create_shared_home(call: ProviderCall) -> Resource:
    raise _stub()


@activity.defn(name="cluster_create_login_nodes")
async def cluster_create_login_nodes(call: ProviderCall) -> Resource:
    raise _stub()


@activity.defn(name="cluster_create_machine")
async def cluster_create_machine(call: MachineCall) -> Machine:
    raise _stub()


@activity.defn(name="cluster_wait_booted")
async def cluster_wait_booted(machine: Machine) -> BootResult:
    raise _stub()


@activity.defn(name="cluster_discover_topology")
async def cluster_discover_topology(call: TopologyCall) -> list[Placement]:
    raise _stub()


@activity.defn(name="cluster_configure_slurm")
async def cluster_configure_slurm(call: SlurmConfigCall) -> SlurmConfigResult:
    raise _stub()


@activity.defn(name="cluster_health_gate")
async def cluster_health_gate(call: NodeGateCall) -> HealthReport:
    raise _stub()


@activity.defn(name="cluster_acceptance_job")
async def cluster_acceptance_job(call: AcceptanceCall) -> AcceptanceResult:
    raise _stub()


@activity.defn(name="cluster_add_users")
async def cluster_add_users(call: UsersCall) -> UsersResult:
    raise _stub()


@activity.defn(name="cluster_delete")
async def cluster_delete(call: DeleteCall) -> None:
    raise _stub()


@activity.defn(name="guard_attach_policy")
async def guard_attach_policy(guard: GuardContext) -> GuardStatus:
    raise _stub()


# --- scaling and teardown (ScaleNodeSet, ClusterTeardown) -----------------------------------


@activity.defn(name="cluster_inventory")
async def cluster_inventory(cluster: ClusterRef) -> Inventory:
    raise _stub()


@activity.defn(name="cluster_node_load")
async def cluster_node_load(call: NodeLoadCall) -> list[NodeLoad]:
    raise _stub()


@activity.defn(name="cluster_incident_open")
async def cluster_incident_open(probe: IncidentProbe) -> bool:
    raise _stub()


@activity.defn(name="cluster_workflow_running")
async def cluster_workflow_running(probe: WorkflowProbe) -> bool:
    raise _stub()


# --- sharing GPUs between training and inference (GpuSharing) ---------------------------


@activity.defn(name="share_read_demand")
async def share_read_demand(call: DemandCall) -> Demand:
    raise _stub()


@activity.defn(name="share_drain_for_move")
async def share_drain_for_move(call: MoveCall) -> StepOutcome:
    raise _stub()


@activity.defn(name="share_checkpoint_jobs")
async def share_checkpoint_jobs(call: MoveCall) -> CheckpointResult:
    raise _stub()


@activity.defn(name="share_mark_lent")
async def share_mark_lent(call: MoveCall) -> StepOutcome:
    raise _stub()


@activity.defn(name="share_resume_training")
async def share_resume_training(call: MoveCall) -> StepOutcome:
    raise _stub()


@activity.defn(name="share_regrow_jobs")
async def share_regrow_jobs(call: MoveCall) -> RegrowResult:
    raise _stub()


@activity.defn(name="share_k8s_lend")
async def share_k8s_lend(call: MoveCall) -> StepOutcome:
    raise _stub()


@activity.defn(name="share_scale_inference")
async def share_scale_inference(call: MoveCall) -> StepOutcome:
    raise _stub()


@activity.defn(name="share_wait_serving")
async def share_wait_serving(call: MoveCall) -> StepOutcome:
    raise _stub()


@activity.defn(name="share_k8s_release")
async def share_k8s_release(call: MoveCall) -> StepOutcome:
    raise _stub()


@activity.defn(name="share_k8s_reclaim")
async def share_k8s_reclaim(call: MoveCall) -> StepOutcome:
    raise _stub()


@activity.defn(name="share_yield_node")
async def share_yield_node(call: YieldCall) -> YieldResult:
    raise _stub()


# --- the hand-off to the provider -------------------------------------------------------------


@activity.defn(name="send_handoff")
async def send_handoff(call: HandoffCall) -> HandoffSent:
    raise _stub()


@activity.defn(name="measure_recovery")
async def measure_recovery(inp: MeasureRecoveryInput) -> MeasureRecoveryResult:
    raise _stub()


@activity.defn(name="recovery_figures")
async def recovery_figures(call: RecoveryFiguresCall) -> RecoveryFiguresRead:
    raise _stub()
