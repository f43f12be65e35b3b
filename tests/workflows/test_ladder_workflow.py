"""The outcome-driven ladder inside the runbook (time-skipping server): a policy with
`skip_rung_below` and the ladder's figures in its snapshot skips a rung that rarely works
for the fault, says why (the opening or escalation notice, a `skip_rung` timeline entry)
and never runs it; with too few samples, or no figures, the ladder is the plain one.

Aspects covered:
- at open: XID_79 whose reboot fixed it in 1 of 14 cases opens on replace, one repair;
- on escalation: XID_46's reset_gpu fails its health gate, reboot fixed XID_46 in 2 of 12
  cases, so the incident climbs straight to replace;
- below min_samples the same rate skips nothing (reboot, then replace).
"""

from __future__ import annotations

from datetime import UTC, datetime

from temporalio.testing import WorkflowEnvironment

from autoclusters.core.ladder_figures import LadderFigures, RungFigures
from autoclusters.core.policy import Rung
from tests.workflows.test_remediation_workflow import RUNBOOK, _fleet, _policy


def _figures(*rows: tuple[str, str, int, int]) -> LadderFigures:
    return LadderFigures(
        as_of=datetime(2026, 1, 5, tzinfo=UTC),
        incidents=sum(r[2] for r in rows),
        rows=[RungFigures(fault=f, rung=r, attempts=n, successes=k) for f, r, n, k in rows],
    )


async def test_a_rung_that_rarely_works_is_skipped_at_open(env: WorkflowEnvironment) -> None:
    policy = _policy(
        skip_rung_below=0.2,
        min_samples=10,
        ladder=_figures(("XID_79", "reboot", 14, 1), ("XID_79", "replace", 6, 6)),
    )
    async with _fleet(env, fixed_by=Rung.REBOOT) as f:
        req = f.request(fault="XID_79", policy=policy)
        result = await (await f.start(req)).result()

    why = "reboot fixed XID_79 in 1 of 14 cases: going to replace"
    assert result.status == "resolved"
    # Reboot would have fixed this node, but the figures say it rarely does: never tried.
    assert [(r, k) for _, r, k in f.cloud.repair_calls] == [
        (Rung.REPLACE, f"{req.incident_id}:1:replace")
    ]
    assert (result.rung, result.repair_attempts) == ("replace", 1)
    skipped = [s for s in result.steps if s.name == "skip_rung"]
    assert [s.detail for s in skipped] == [why]
    assert [s.name for s in result.steps if s.name != "skip_rung"] == RUNBOOK
    opened = f.notes()[0]
    assert opened.event == "opened"
    assert "plan replace" in opened.text and why in opened.text


async def test_a_rarely_working_rung_is_skipped_on_the_way_up(env: WorkflowEnvironment) -> None:
    policy = _policy(
        skip_rung_below=0.2,
        min_samples=10,
        ladder=_figures(("XID_46", "reset_gpu", 3, 3), ("XID_46", "reboot", 12, 2)),
    )
    async with _fleet(env, fixed_by=Rung.REPLACE) as f:
        req = f.request(fault="XID_46", policy=policy)
        result = await (await f.start(req)).result()

    why = "reboot fixed XID_46 in 2 of 12 cases: going to replace"
    assert result.status == "resolved"
    # reset_gpu (it worked in 3 of 3) is tried and fails; reboot is skipped.
    assert [r for _, r, _ in f.cloud.repair_calls] == [Rung.RESET_GPU, Rung.REPLACE]
    assert [h.passed for h in result.health] == [False, True]
    assert [s.detail for s in result.steps if s.name == "skip_rung"] == [why]
    escalated = [n for n in f.notes() if n.event == "escalated"]
    assert len(escalated) == 1
    assert "next: replace" in escalated[0].text and why in escalated[0].text


async def test_too_few_samples_skip_nothing(env: WorkflowEnvironment) -> None:
    policy = _policy(
        skip_rung_below=0.2, min_samples=10, ladder=_figures(("XID_79", "reboot", 9, 0))
    )
    async with _fleet(env, fixed_by=Rung.REPLACE) as f:
        req = f.request(fault="XID_79", policy=policy)
        result = await (await f.start(req)).result()

    assert result.status == "resolved"
    assert [r for _, r, _ in f.cloud.repair_calls] == [Rung.REBOOT, Rung.REPLACE]
    assert not [s for s in result.steps if s.name == "skip_rung"]
