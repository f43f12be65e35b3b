"""Which GPU-sharing steps a worker serves: by what its Slurm client can do."""

from __future__ import annotations

from typing import Any

from temporalio.client import Client

from autoclusters.core.settings import Settings
from autoclusters.integrations.slurm import SlurmCli
from autoclusters.sandbox.standin.clients import StandInSlurm
from autoclusters.workers.remediation import sharing_activities


def _names(steps: list[Any]) -> set[str]:
    return {step.__name__ for step in steps}


def test_a_client_that_signals_jobs_gets_the_slurm_steps_and_one_that_cannot_does_not() -> None:
    client = Client.__new__(Client)  # never called: the steps are only listed
    settings = Settings()
    real = _names(sharing_activities(client, settings, SlurmCli(), None))
    standin = _names(sharing_activities(client, settings, StandInSlurm("http://127.0.0.1:9"), None))
    assert standin == {"yield_node"}
    assert real == {"yield_node", "read_demand", "drain_for_move", "checkpoint_jobs",
                    "mark_lent", "resume_training", "regrow_jobs"}  # fmt: skip
