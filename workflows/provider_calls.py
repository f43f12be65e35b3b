"""How the cluster workflows (ClusterProvisioning, ScaleNodeSet, ClusterTeardown) call the
provider's `cluster_*` activities: the retry policy, the timeouts, and which refusals end
the workflow instead of being retried or answered with a replacement machine.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from autoclusters.core.cluster import BOOT_FAILED, FATAL_PROVIDER_ERRORS

from autoclusters.workflows.steps import cause_of

# Provider and Slurm calls fail transiently (API busy, 429s); a refusal for quota or
# capacity, or a machine the provider says will not boot, does not.
PROVIDER_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
    non_retryable_error_types=[*FATAL_PROVIDER_ERRORS, BOOT_FAILED, "BadCredentials"],
)
CREATE_TIMEOUT = timedelta(minutes=30)
SLURM_TIMEOUT = timedelta(minutes=15)
GATE_TIMEOUT = timedelta(minutes=10)


def fatal_refusal(err: BaseException) -> ApplicationError | None:
    """The provider's quota or capacity refusal behind `err`, if that is what it is:
    another machine would be refused too, so nothing is replaced and the workflow fails."""
    cause = cause_of(err)
    if isinstance(cause, ApplicationError) and cause.type in FATAL_PROVIDER_ERRORS:
        return cause
    return None
