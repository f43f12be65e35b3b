"""Per-job thresholds of the silent-fault rules, set in the cluster policy.

The agent judges every job's progress with its own settings (hang floor and k, slow ratio
and window: clients/agent/settings.py); the policy's `job_thresholds` overrides them for
the jobs an entry matches, by the Slurm job's name, partition or account (shell-style
patterns, `fnmatch`, case-sensitive as Slurm is). The first entry that matches wins; a
field an entry leaves out keeps the agent's value. A job's own `hang_floor_s`
(`JobProgress(hang_floor_s=...)`) still applies: the larger floor of the job's and the
policy's. A job whose name, partition or account the agent does not know (a rank file
without them) matches no entry that asks for it.
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase

from pydantic import BaseModel, ConfigDict, Field, model_validator

# The agent's own figures, as bounded as a policy's: a week of floor, sane multiples.
MAX_FLOOR_S = 7 * 86400


class JobThresholds(BaseModel):
    """One entry: which jobs (every pattern given must match) and what they get."""

    # A typo in a policy file must fail the load, not silently fall back to a default.
    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(default=None, min_length=1, max_length=128)
    partition: str | None = Field(default=None, min_length=1, max_length=128)
    account: str | None = Field(default=None, min_length=1, max_length=128)
    # No step for max(hang_floor_s, hang_k x the job's step-time tail): a hang.
    hang_floor_s: float | None = Field(default=None, gt=0, le=MAX_FLOOR_S, allow_inf_nan=False)
    hang_k: float | None = Field(default=None, gt=0, le=1000, allow_inf_nan=False)
    # A node at >= slow_ratio x the others' busy time per step for slow_window steps.
    slow_ratio: float | None = Field(default=None, gt=1, le=100, allow_inf_nan=False)
    slow_window: int | None = Field(default=None, ge=2, le=256)

    @model_validator(mode="after")
    def _says_something(self) -> JobThresholds:
        if self.name is None and self.partition is None and self.account is None:
            raise ValueError("name the jobs: at least one of name, partition, account")
        if all(
            v is None for v in (self.hang_floor_s, self.hang_k, self.slow_ratio, self.slow_window)
        ):
            raise ValueError("set at least one of hang_floor_s, hang_k, slow_ratio, slow_window")
        return self

    def matches(self, *, name: str | None, partition: str | None, account: str | None) -> bool:
        return all(
            pattern is None or (value is not None and fnmatchcase(value, pattern))
            for pattern, value in (
                (self.name, name),
                (self.partition, partition),
                (self.account, account),
            )
        )


def thresholds_for(
    entries: Iterable[JobThresholds],
    *,
    name: str | None,
    partition: str | None,
    account: str | None,
) -> JobThresholds | None:
    """The first entry that matches the job; None: the agent's own settings apply."""
    return next(
        (e for e in entries if e.matches(name=name, partition=partition, account=account)), None
    )
