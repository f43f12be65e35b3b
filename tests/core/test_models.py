"""The shared models: what an incident request accepts, and the names derived from it.

Aspects covered:
- IncidentRequest accepts fault kinds and single node names, and rejects anything else
  with an error that names the offending field;
- the drain reason we own, and that return-to-service recognises it as ours;
- one workflow id per node, whatever the fault;
- the timeline lookup on IncidentState.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from autoclusters.core.models import (
    REASON_PREFIX,
    IncidentRequest,
    IncidentState,
    RemediationTimeouts,
    StepRecord,
    drain_reason,
    workflow_id,
)

OPENED = datetime(2026, 1, 5, 3, 0, tzinfo=UTC)


def _request(**overrides: Any) -> IncidentRequest:
    fields: dict[str, Any] = {
        "incident_id": "INC-7",
        "cluster": "prod",
        "node": "gpu-01",
        "fault": "XID_79",
        "opened_at": OPENED,
    }
    return IncidentRequest(**(fields | overrides))


@pytest.mark.parametrize("fault", ["XID_79", "XID_8", "XID_143", "GPU_FELL_OFF_BUS", "MANUAL"])
def test_fault_kinds_accepted(fault: str) -> None:
    assert _request(fault=fault).fault == fault


@pytest.mark.parametrize(
    "fault",
    [
        "xid_79",
        "Xid_79",
        "XID-79",
        "79",
        "gpu fell off",
        "X",
        "",
        "XID_79; rm -rf /",
        "XID_1234",
        "XID_",
    ],
)
def test_bad_fault_kind_rejected_naming_the_field(fault: str) -> None:
    with pytest.raises(ValidationError) as caught:
        _request(fault=fault)
    (error,) = caught.value.errors()
    assert error["loc"] == ("fault",)
    assert "fault kind" in error["msg"]


@pytest.mark.parametrize("node", ["gpu-01", "gpu01.cluster.local", "a", "n_1", "GPU-7"])
def test_node_names_accepted(node: str) -> None:
    assert _request(node=node).node == node


@pytest.mark.parametrize(
    "node",
    ["gpu-[01-02]", "gpu-01,gpu-02", "gpu 01", "", "-gpu", ".gpu", "gpu/01", "g" * 64],
)
def test_bad_node_name_rejected_naming_the_field(node: str) -> None:
    with pytest.raises(ValidationError) as caught:
        _request(node=node)
    (error,) = caught.value.errors()
    assert error["loc"] == ("node",)
    assert "single Slurm node name" in error["msg"]


def test_both_bad_fields_reported() -> None:
    with pytest.raises(ValidationError) as caught:
        _request(node="gpu-[1-2]", fault="oops")
    assert {e["loc"] for e in caught.value.errors()} == {("node",), ("fault",)}


def test_request_defaults_and_round_trip() -> None:
    req = _request()
    assert req.opened_by == "cli"
    assert req.timeouts == RemediationTimeouts()
    assert IncidentRequest.model_validate_json(req.model_dump_json()) == req


def test_drain_reason() -> None:
    reason = drain_reason("INC-7", "XID_79")
    assert reason == "autoclusters: INC-7 XID_79"
    assert reason.startswith(REASON_PREFIX)
    # return_to_service only undrains a reason that starts with our prefix and incident.
    assert reason.startswith(f"{REASON_PREFIX} INC-7 ")
    assert not drain_reason("INC-70", "XID_79").startswith(f"{REASON_PREFIX} INC-7 ")


def test_workflow_id_is_per_node_not_per_fault() -> None:
    assert workflow_id("prod", "gpu-01") == "remediation-prod-gpu-01"
    one = _request(fault="XID_79", incident_id="INC-1")
    other = _request(fault="IB_LINK_DOWN", incident_id="INC-2")
    assert workflow_id(one.cluster, one.node) == workflow_id(other.cluster, other.node)
    assert workflow_id("prod", "gpu-01") != workflow_id("prod", "gpu-02")
    assert workflow_id("prod", "gpu-01") != workflow_id("staging", "gpu-01")


def test_incident_state_step_lookup() -> None:
    state = IncidentState(request=_request())
    assert state.status == "open"
    assert state.step("drain") is None
    state.steps.append(StepRecord(name="drain", started_at=OPENED, outcome="ok"))
    step = state.step("drain")
    assert step is not None and step.outcome == "ok"
