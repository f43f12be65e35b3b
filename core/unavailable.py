"""A read that failed is "unknown", never "empty".

Every system the runbook depends on (slurmctld, the Kubernetes API, the cloud API,
Prometheus, Alertmanager) can be away for a minute: a controller restart, a failover, a
throttled API. A reader that got no trustworthy answer raises `Unavailable` (or a subclass
named `<Something>Unavailable`), never an empty list: "no jobs", "idle", "node absent",
"healthy" and "cluster size 0" are answers only a reachable system can give.

In an activity the exception reaches the workflow as an ApplicationError whose `type` is the
class name (one of OUTAGE_TYPES); `is_unavailable_type` tells the workflow to wait the
outage out (retry with the outage shown on the incident) instead of failing the step.
"""

from __future__ import annotations

# The ApplicationError type of an outage that is not one system's own subclass.
UNAVAILABLE = "Unavailable"
# Every outage type an activity can raise (a retry policy lists types by name).
OUTAGE_TYPES = (
    UNAVAILABLE,
    "SlurmUnavailable",
    "KubernetesUnavailable",
    "CrusoeUnavailable",
    "PrometheusUnavailable",
    "AlertmanagerUnavailable",
)


class Unavailable(RuntimeError):
    """`component` gave no trustworthy answer (unreachable, or answered with errors).
    Retryable: the same call can succeed once the component is back."""

    def __init__(self, component: str, message: str) -> None:
        super().__init__(f"{component} unavailable: {message}")
        self.component = component
        self.detail = message


def is_unavailable_type(error_type: str | None) -> bool:
    """Is an ApplicationError's `type` an outage? Only the types above: a refusal whose name
    happens to end the same way ("CapacityUnavailable", "ProviderUnavailable") is not."""
    return error_type in OUTAGE_TYPES


def component_of(message: str) -> str:
    """The component an outage message names ("slurmctld unavailable: ..." -> slurmctld)."""
    head, sep, _ = message.partition(" unavailable")
    return head.strip() if sep and head.strip() else "a dependency"


# Slurm before 24.11 refuses updates of a job until slurmdbd has given it its database
# index ("Job update not available right now, the DB index is being set, try again in a
# bit"); a job a controller crash left mid-way is refused for as long as it runs (docs/
# runbook.md). The Slurm client waits it out as an outage (integrations/slurm.py); the
# controller answers, so "unreachable" would send the operator to the wrong place.
DB_INDEX_REFUSAL = "try again in a bit"


def outage_said(message: str) -> str:
    """What an outage is, for the step's detail: "slurmctld unreachable", or what a
    controller that answers but will not act says."""
    who = component_of(message)
    if DB_INDEX_REFUSAL in message.lower():
        return f"{who} unavailable for this job's updates (its DB index is being set)"
    return f"{who} unreachable"
