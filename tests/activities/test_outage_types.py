"""Which failures the runbook waits out: outages only, never a refusal that sounds like one."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ApplicationError

from autoclusters.activities.cluster_providers.crusoe_step import refused as _refused
from autoclusters.core.cluster import CAPACITY_UNAVAILABLE
from autoclusters.core.unavailable import (
    OUTAGE_TYPES,
    component_of,
    is_unavailable_type,
    outage_said,
)
from autoclusters.integrations.crusoe.errors import CrusoeRequestError, CrusoeUnavailable
from autoclusters.integrations.slurm import SlurmUnavailable
from autoclusters.workflows.outage import outage_of


@pytest.mark.parametrize("name", OUTAGE_TYPES)
def test_every_outage_type_is_waited_out(name: str) -> None:
    assert is_unavailable_type(name)
    assert outage_of(ApplicationError("x unavailable: y", type=name)) is not None


@pytest.mark.parametrize(
    "name", [CAPACITY_UNAVAILABLE, "ProviderUnavailable", "UnknownNode", "CloudError", None]
)
def test_a_refusal_is_not_an_outage(name: str | None) -> None:
    assert not is_unavailable_type(name)
    assert outage_of(ApplicationError("no", type=name)) is None


def test_an_outage_marked_non_retryable_is_not_waited_out() -> None:
    err = ApplicationError("x", type="SlurmUnavailable", non_retryable=True)
    assert outage_of(err) is None


def test_the_component_is_named_in_the_step_detail() -> None:
    assert component_of(str(SlurmUnavailable("sinfo: Unspecified error"))) == "slurmctld"
    assert component_of("something odd") == "a dependency"


def test_provisioning_keeps_a_crusoe_outage_an_outage() -> None:
    outage = _refused(CrusoeUnavailable("503 from the API", status=503))
    assert outage.type == "CrusoeUnavailable" and not outage.non_retryable
    refused = _refused(CrusoeRequestError(400, "bad spec"))
    assert refused.type == "CloudError" and refused.non_retryable


def test_the_detail_says_unreachable_or_names_a_controller_that_refuses() -> None:
    down = SlurmUnavailable("scontrol: error: Unable to contact slurm controller (connect failure)")
    assert outage_said(str(down)) == "slurmctld unreachable"
    # Slurm < 24.11 after a crash: the controller answers, and refuses the job's updates
    # until slurmdbd has indexed it (docs/runbook.md); the operator looks there, not at
    # the network.
    refused = SlurmUnavailable(
        "scontrol: error: Job update not available right now, the DB index is being set, "
        "try again in a bit for job 12"
    )
    said = outage_said(str(refused))
    assert said.startswith("slurmctld unavailable") and "DB index is being set" in said
    assert "unreachable" not in said
