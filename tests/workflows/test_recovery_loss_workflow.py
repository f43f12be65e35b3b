"""The measured loss beside the estimate, through the runbook (issue 42;
workflows/recovery_loss_steps.py): under a policy with `measure_recovery`, the incident's
close reads when the requeued job stepped again and records its actual GPU-hours lost
beside the planner's estimate, in its state, in the closing message, and in the record the
history gives (clients/incident_history.py); a policy without it adds no step."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner

from autoclusters.clients.cli.app import app
from autoclusters.clients.incident_history import record_from_history
from tests.helpers import time_skipping_env
from tests.workflows.test_remediation_workflow import RUNBOOK, _fleet, _policy


@pytest_asyncio.fixture
async def env() -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping server per test, as tests/test_remediation_workflow.py's (a fresh
    one keeps whatever one test leaves behind from locking time for the next)."""
    async with await time_skipping_env() as environment:
        yield environment


async def _until(check: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("measure", [True, False])
async def test_the_incident_records_the_actual_loss_beside_the_estimate(
    env: WorkflowEnvironment, measure: bool, tmp_path: Path
) -> None:
    async with _fleet(env, nodes=4) as f:  # gpu-04 is free: job 101 restarts at once
        saved = time.time() - 30
        f.slurm.set_comment(101, f"ckpt_at={saved:.0f}")
        req = f.request(policy=_policy(measure_recovery=measure, measure_recovery_s=30))
        req = req.model_copy(update={"opened_at": datetime.now(UTC)})
        handle = await f.start(req)
        if measure:
            # The job's new run: Slurm starts it on healthy nodes, its rank 0 says it steps.
            await _until(lambda: f.slurm.job_now(101).restart_cnt == 1, "the requeue")
            f.slurm.run_again(101, nodes="gpu-[03-04]")
            stepped = time.time()
            f.slurm.set_comment(101, f"ckpt_at={saved:.0f} resumed_at={stepped:.3f}")
        result = await handle.result()
        history = await handle.fetch_history()
        notes = f.notes("gpu-01")

    assert result.status == "resolved", result.error
    plan = next(p for p in result.recovery_plans if p.job_id == 101)
    assert plan.chosen == "requeue"
    if not measure:
        assert [s.name for s in result.steps] == RUNBOOK and result.recovery_losses == []
        return
    assert [s.name for s in result.steps] == [*RUNBOOK[:-1], "measure_recovery", RUNBOOK[-1]]
    (loss,) = [x for x in result.recovery_losses if x.job_id == 101]
    estimate = plan.estimate("requeue")
    assert estimate is not None and loss.estimate_gpu_hours == estimate.gpu_hours
    opened = req.opened_at.timestamp()
    assert loss.resume_s == pytest.approx(stepped - opened, abs=0.01)
    assert loss.redo_s == pytest.approx(opened - float(f"{saved:.0f}"), abs=0.01)
    assert loss.actual_gpu_hours == pytest.approx(
        plan.gpus * (loss.resume_s + loss.redo_s) / 3600  # type: ignore[operator]
    )
    closing = next(n for n in notes if n.event == "resolved")
    assert "estimated against measured" in closing.text and "job 101 (requeue)" in closing.text
    # The record read back from the history carries both, as the fleet page reads them.
    record = record_from_history(history)
    assert record.recovery_losses == result.recovery_losses
    # `autoclusters stats recovery` reads the same from the exported history.
    exported = tmp_path / "incident.json"
    exported.write_text(history.to_json())
    out = CliRunner().invoke(app, ["stats", "recovery", "--json", "--from-history", str(exported)])
    assert out.exit_code == 0, out.output
    body = json.loads(out.stdout)
    assert body["paths"] == [
        {"path": "requeue", "measured": 1, "median_resume_s": round(loss.resume_s, 2),
         "median_redo_s": round(loss.redo_s, 2)}  # type: ignore[arg-type]
    ]  # fmt: skip
    assert body["estimates"]["measured"] == 1 and body["incidents"] == 1
