"""Open runs survive a new worker: every recorded history in tests/histories/ replays on the
current code without nondeterminism (docs/versioning.md).

Each release records histories of every workflow type (`scripts/record-histories.py
RELEASE`), named <workflow>_<release>_<case>.json; they stay here, and replay, until no run
of that release can be open. Aspects covered:
- every history replays on the current workflows;
- the histories of the decision proofs (0.2) show the worker's checks behind their patch;
- the histories of a silent fault screened before repair (0.2) show the screen first: no
  repair before it, and a repair after it only when it failed;
- the baseline release (0.1) has a history of every workflow type and of each rung and
  mode of the runbook, and each history shows the path its case names (so a recording
  that went another way is caught, not replayed for nothing);
- every activity in every history carries a summary in the operator's words (what the
  Temporal UI shows for it), and only the step kernel (workflows/steps.py) starts activities,
  so no workflow can schedule one without a summary.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from autoclusters.workers.remediation import WORKFLOWS

# Replayed against the time-skipping lane's workflows (no server needed, but the same lane).
pytestmark = pytest.mark.workflow

HERE = Path(__file__).parents[1] / "histories"
WORKFLOWS_DIR = Path(__file__).resolve().parents[2] / "workflows"
HISTORIES = sorted(HERE.glob("*.json"))
BASELINE = "0.1"
WORKFLOW_TYPES = {
    "NodeRemediation",
    "FleetGuard",
    "ClusterProvisioning",
    "ScaleNodeSet",
    "ClusterTeardown",
    "GpuRebalance",
    "SystemicIncident",
}
# case -> activities its history must have run (the path the case is about).
BASELINE_CASES: dict[tuple[str, str], set[str]] = {
    ("remediation", "reboot_resolved"): {"drain_node", "repair_node", "return_to_service"},
    ("remediation", "reset_gpu_resolved"): {"repair_node", "health_gate", "return_to_service"},
    ("remediation", "replace_escalated"): {"repair_node", "health_gate", "return_to_service"},
    ("remediation", "repair_failed"): {"repair_node", "verify_quarantine"},
    ("remediation", "approved"): {"notify", "repair_node", "return_to_service"},
    ("remediation", "rejected"): {"verify_quarantine", "guard_release"},
    ("remediation", "hot_spare"): {"guard_claim_spare", "take_spare", "park_as_spare"},
    ("remediation", "kubernetes"): {"k8s_cordon", "k8s_evict_pods", "k8s_wait_new_node_ready"},
    ("remediation", "quarantine_recheck"): {"verify_quarantine", "drain_node", "requeue_jobs"},
    ("remediation", "returned_jobs"): {"cancel_jobs", "repair_node"},
    ("remediation", "slurm_outage"): {"wait_node_idle", "repair_node"},
    ("remediation", "held_then_admitted"): {"guard_admit_quarantine", "repair_node"},
    ("fleet_guard", "batch"): set(),
    ("fleet_guard", "hot_spare"): set(),
    ("fleet_guard", "held_then_admitted"): set(),
    ("cluster_provisioning", "ready_with_replacements"): {"cluster_create_machine"},
    ("cluster_provisioning", "quota_cleanup"): {"cluster_delete"},
    ("cluster_provisioning", "agent_gate"): {"cluster_health_gate", "cluster_delete"},
    ("cluster_ops", "scale_up_replaced"): {"cluster_wait_booted", "return_to_service"},
    ("cluster_ops", "scale_down_requeue"): {"drain_node", "requeue_jobs", "cluster_delete"},
    ("cluster_ops", "teardown"): {"drain_node", "wait_node_idle", "cluster_delete"},
    ("gpu_sharing", "lend_and_return"): {"share_k8s_lend", "share_k8s_reclaim", "health_gate"},
    ("gpu_sharing", "manual_and_rejected"): {"notify", "share_k8s_lend"},
}


# Histories of the decision proofs (from 0.2): each ran the worker's check of a forged proof
# and of a valid one (two local activities), behind its patch.
PROOF_HISTORIES = [
    "remediation_0.2_proven_decision",
    "fleet_guard_0.2_proven_reset",
    "gpu_sharing_0.2_proven_decision",
]


# Histories of the screen before repair (from 0.2, a rule's `screen_before_repair`): no
# patch, since only a rule with the flag takes the path -> whether a repair followed.
SCREEN_FIRST_HISTORIES = {
    "remediation_0.2_screened_back": False,
    "remediation_0.2_screened_then_repaired": True,
}


def _path(kind: str, case: str, release: str = BASELINE) -> Path:
    return HERE / f"{kind}_{release}_{case}.json"


def _events(path: Path) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = json.loads(path.read_text())["events"]
    return events


def _activities(path: Path) -> set[str]:
    scheduled = "activityTaskScheduledEventAttributes"
    return {e[scheduled]["activityType"]["name"] for e in _events(path) if scheduled in e}


def _summary(event: dict[str, Any]) -> str:
    """The activity's summary (a JSON string payload), "" when it has none."""
    data = event.get("userMetadata", {}).get("summary", {}).get("data")
    return str(json.loads(base64.b64decode(data))) if data else ""


def _workflow_type(path: Path) -> str:
    return str(_events(path)[0]["workflowExecutionStartedEventAttributes"]["workflowType"]["name"])


def test_the_baseline_has_every_workflow_type_and_case() -> None:
    missing = [_path(*c).name for c in BASELINE_CASES if not _path(*c).exists()]
    assert not missing, missing
    # Every workflow the worker hosts (a new one needs its histories recorded here).
    assert len(WORKFLOWS) == len(WORKFLOW_TYPES)
    assert {_workflow_type(p) for p in HISTORIES} == WORKFLOW_TYPES


@pytest.mark.parametrize("case", sorted(BASELINE_CASES), ids=lambda c: "_".join(c))
def test_each_baseline_history_shows_its_case(case: tuple[str, str]) -> None:
    ran = _activities(_path(*case))
    assert BASELINE_CASES[case] <= ran, sorted(ran)


def test_the_handoff_history_shows_the_handoff() -> None:
    """The hand-off to the provider (from 0.2, docs/handoff.md): the ladder's repairs, the
    webhook, then the gate and the return after the provider's `fixed`."""
    ran = _activities(HERE / "remediation_0.2_handoff_fixed.json")
    assert {"repair_node", "send_handoff", "health_gate", "return_to_service"} <= ran, ran


@pytest.mark.parametrize("name", PROOF_HISTORIES)
def test_each_proof_history_shows_the_checks(name: str) -> None:
    markers = [
        e["markerRecordedEventAttributes"]["markerName"]
        for e in _events(HERE / f"{name}.json")
        if "markerRecordedEventAttributes" in e
    ]
    assert "core_patch" in markers and markers.count("core_local_activity") == 2, markers


@pytest.mark.parametrize("name", sorted(SCREEN_FIRST_HISTORIES))
def test_each_screen_first_history_screens_before_any_repair(name: str) -> None:
    scheduled = "activityTaskScheduledEventAttributes"
    order = [
        e[scheduled]["activityType"]["name"]
        for e in _events(HERE / f"{name}.json")
        if scheduled in e
    ]
    first = order.index("burn_in_screen")
    assert "requeue_jobs" in order[:first] and "repair_node" not in order[:first], order
    assert ("repair_node" in order) == SCREEN_FIRST_HISTORIES[name], order
    assert "return_to_service" in order, order


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
def test_every_activity_has_a_summary(path: Path) -> None:
    """Each ActivityTaskScheduled names what it acts on in the operator's words
    (`drain gpu-04 (SCALE_DOWN)`), never nothing or the bare activity type."""
    scheduled = "activityTaskScheduledEventAttributes"
    events = [e for e in _events(path) if scheduled in e]
    bare = [
        f"event {e['eventId']} {e[scheduled]['activityType']['name']}: {_summary(e)!r}"
        for e in events
        if _summary(e).strip() in ("", e[scheduled]["activityType"]["name"])
    ]
    assert not bare, bare


def test_only_the_step_kernel_starts_activities() -> None:
    """Every activity runs through `Steps.call` (workflows/steps.py): the workflow's standard
    timeout, heartbeat and retry, and a summary, which the histories above show."""
    callers = [
        str(p.relative_to(WORKFLOWS_DIR))
        # Every module, the workflows' parts in subpackages too (workflows/sharing/).
        for p in sorted(WORKFLOWS_DIR.rglob("*.py"))
        if "workflow.execute_activity(" in p.read_text() or "start_activity(" in p.read_text()
    ]
    assert callers == ["steps.py"], callers


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_history_replays(path: Path) -> None:
    # debug_mode: no 2 s deadlock timer on an activation (the sandbox stays). The replay
    # checks what the code decides, not how fast: in `make test` (seven workers on two
    # cores) a first activation, which imports the workflows into the sandbox, once took
    # longer and failed the replay as a "deadlock".
    replayer = Replayer(
        workflows=WORKFLOWS, data_converter=pydantic_data_converter, debug_mode=True
    )
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure
