"""The outcome-driven ladder's figures (core/ladder.py) and the policy fields that use them.

Aspects covered:
- attempts, successes and median time to capacity per (fault, rung), from records: a
  failed health gate, a recurrence within the recurrence window (and one after it), a repair
  with no verdict or that itself failed (not counted), figures as of a moment;
- read from the recorded histories: the escalated case's failed reboot and working replace;
- `skip_rung_below` / `min_samples`: the reason in the operator's words, no skip below
  min_samples, at the threshold, for replace (nothing above) or with the field at 0;
- a bad value names the field (and its line) when the policy file loads;
- `stats ladder --json` on recorded histories;
- a replay of a skipping policy judges each incident on the figures before it.
"""

from __future__ import annotations

import json
import statistics
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from typer.testing import CliRunner

from autoclusters.clients.cli.app import app
from autoclusters.clients.incident_history import record_from_history
from autoclusters.core.incident_record import Admission, IncidentRecord, RepairAttempt
from autoclusters.core.ladder import choose_rung, figures_from, skip_reason
from autoclusters.core.ladder_figures import LadderFigures, RungFigures
from autoclusters.core.policy import FaultRule, Policy, PolicyError, Rung, parse_policy
from autoclusters.core.policy_replay import replay_policy

HISTORIES = Path(__file__).parents[1] / "histories"
T0 = datetime(2026, 3, 1, tzinfo=UTC)
DAY = timedelta(days=1)
XID_79 = {"XID_79": FaultRule(severity="critical", first_rung=Rung.REBOOT)}


def _rec(
    n: int,
    at: timedelta,
    repairs: list[tuple[Rung, bool | None]],
    *,
    node: str | None = None,
    returned_after: timedelta | None = timedelta(minutes=10),
    policy: Policy | None = None,
) -> IncidentRecord:
    start = T0 + at
    return IncidentRecord(
        incident_id=f"inc-{n}",
        cluster="c1",
        node=node or f"gpu-{n:02d}",
        fault="XID_79",
        faults=["XID_79"],
        started_at=start,
        closed_at=start + timedelta(minutes=15),
        status="resolved",
        policy=policy or Policy(faults=XID_79),
        repairs=[RepairAttempt(rung=r, passed=p, at=start) for r, p in repairs],
        returned_at=start + returned_after if returned_after is not None else None,
        admissions=[Admission(kind="repair", admitted=True, at=start)],
    )


def test_figures_count_attempts_successes_and_time_to_capacity() -> None:
    records = [
        _rec(1, 0 * DAY, [(Rung.REBOOT, True)], returned_after=timedelta(minutes=4)),
        _rec(2, 1 * DAY, [(Rung.REBOOT, False), (Rung.REPLACE, True)]),
        _rec(3, 2 * DAY, [(Rung.REBOOT, True)], returned_after=timedelta(minutes=8)),
        _rec(4, 3 * DAY, [(Rung.REBOOT, None)]),  # no verdict: not counted
    ]
    failed_repair = _rec(5, 4 * DAY, [(Rung.REBOOT, False)])
    failed_repair.repairs[0].repair_failed = True  # the cloud failed: says nothing of reboot
    figures = figures_from([*records, failed_repair])
    reboot = figures.of("XID_79", "reboot")
    replace = figures.of("XID_79", "replace")
    assert reboot is not None and replace is not None
    assert (reboot.attempts, reboot.successes) == (3, 2)
    assert reboot.median_capacity_s == statistics.median([240, 480])
    assert (replace.attempts, replace.successes, replace.median_capacity_s) == (1, 1, 600)
    assert figures.incidents == 5


def test_a_recurrence_within_the_window_is_not_a_success() -> None:
    fixed = _rec(1, 0 * DAY, [(Rung.REBOOT, True)], node="gpu-01")
    again = _rec(2, DAY / 2, [(Rung.REPLACE, True)], node="gpu-01")  # within 1 day
    reboot = figures_from([fixed, again]).of("XID_79", "reboot")
    assert reboot is not None and (reboot.attempts, reboot.successes) == (1, 0)
    later = _rec(2, 3 * DAY, [(Rung.REPLACE, True)], node="gpu-01")  # after the window
    reboot = figures_from([fixed, later]).of("XID_79", "reboot")
    assert reboot is not None and (reboot.attempts, reboot.successes) == (1, 1)
    # As of before the recurrence, it still counts as a success.
    reboot = figures_from([fixed, again], as_of=T0 + DAY / 4).of("XID_79", "reboot")
    assert reboot is not None and reboot.successes == 1


def test_figures_from_recorded_histories() -> None:
    path = HISTORIES / "remediation_0.2_replace_escalated.json"
    rec = record_from_history(WorkflowHistory.from_json(path.stem, path.read_text()))
    figures = figures_from([rec])
    reboot, replace = figures.of("XID_79", "reboot"), figures.of("XID_79", "replace")
    assert reboot is not None and (reboot.attempts, reboot.successes) == (1, 0)
    assert replace is not None and (replace.attempts, replace.successes) == (1, 1)
    assert rec.returned_at is not None
    assert replace.median_capacity_s == (rec.returned_at - rec.started_at).total_seconds()


def _figures(attempts: int, successes: int, rung: str = "reboot") -> LadderFigures:
    return LadderFigures(
        rows=[RungFigures(fault="XID_79", rung=rung, attempts=attempts, successes=successes)]
    )


def _skipping(**fields: object) -> Policy:
    return Policy(faults=XID_79, skip_rung_below=0.2, min_samples=10, **fields)  # type: ignore[arg-type]


def test_skip_reason_in_the_operators_words() -> None:
    p = _skipping()
    assert (
        skip_reason(p, "XID_79", Rung.REBOOT, _figures(14, 1))
        == "reboot fixed XID_79 in 1 of 14 cases: going to replace"
    )
    assert skip_reason(p, "XID_79", Rung.REBOOT, _figures(9, 0)) == ""  # below min_samples
    assert skip_reason(p, "XID_79", Rung.REBOOT, _figures(10, 2)) == ""  # 0.2 is not below
    assert skip_reason(p, "XID_79", Rung.REBOOT, None) == ""  # no figures
    assert skip_reason(p, "XID_48", Rung.REBOOT, _figures(14, 1)) == ""  # another fault's
    # Nothing above replace: it is never skipped.
    assert skip_reason(p, "XID_79", Rung.REPLACE, _figures(14, 1, "replace")) == ""
    off = Policy(faults=XID_79, min_samples=10)
    assert skip_reason(off, "XID_79", Rung.REBOOT, _figures(14, 1)) == ""


def test_choose_rung_skips_with_the_snapshot_figures() -> None:
    choice = choose_rung(_skipping(ladder=_figures(14, 1)), ["XID_79"], recent=0)
    assert choice.rung == Rung.REPLACE
    assert choice.skipped == ["reboot fixed XID_79 in 1 of 14 cases: going to replace"]
    assert choose_rung(_skipping(), ["XID_79"], recent=0).rung == Rung.REBOOT


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("skip_rung_below: 1.5", "skip_rung_below"),
        ("skip_rung_below: -0.1", "skip_rung_below"),
        ("skip_rung_below: .nan", "skip_rung_below"),
        ("min_samples: 0", "min_samples"),
        ("min_samples: many", "min_samples"),
    ],
)
def test_a_bad_value_names_the_field(line: str, field: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(f"mode: auto\n{line}\n", "p.yaml")
    assert str(caught.value).startswith(f"p.yaml:2: {field}: ")


def test_the_fields_load() -> None:
    p = parse_policy("skip_rung_below: 0.2\nmin_samples: 14\n")
    assert (p.skip_rung_below, p.min_samples, p.ladder) == (0.2, 14, None)
    assert (Policy().skip_rung_below, Policy().min_samples) == (0, 10)


def test_stats_ladder_json_from_recorded_histories() -> None:
    paths = sorted(HISTORIES.glob("remediation_0.2_*.json"))
    args = [a for p in paths for a in ("--from-history", str(p))]
    out = CliRunner().invoke(app, ["stats", "ladder", "--json", *args])
    assert out.exit_code == 0, out.output
    body = json.loads(out.stdout)
    records = [record_from_history(WorkflowHistory.from_json(p.stem, p.read_text())) for p in paths]
    assert body["incidents"] == len(records)
    rows = {(r["fault"], r["rung"]): r for r in body["rows"]}
    tries = sum(
        1 for r in records if r.fault == "XID_79" for a in r.repairs
        if a.rung == Rung.REBOOT and a.passed is not None and not a.repair_failed
    )  # fmt: skip
    assert rows[("XID_79", "reboot")]["attempts"] == tries
    assert rows[("XID_79", "reboot")]["successes"] < tries  # the escalated case's reboot failed
    assert 0 < rows[("XID_79", "reboot")]["success_rate"] < 1
    out = CliRunner().invoke(app, ["stats", "ladder", *args])
    assert out.exit_code == 0 and "XID_79" in out.stdout and "reboot" in out.stdout


def test_a_replay_judges_each_incident_on_the_figures_before_it() -> None:
    # Twelve reboots of XID_79 that failed, then a thirteenth incident.
    failing = [
        _rec(i, i * 2 * DAY, [(Rung.REBOOT, False), (Rung.REPLACE, True)]) for i in range(1, 13)
    ]
    last = _rec(13, 30 * DAY, [(Rung.REBOOT, False), (Rung.REPLACE, True)])
    report = replay_policy(_skipping(), [*failing, last])
    # Until ten tries are known, the reboot is tried; from the eleventh incident on, skipped.
    skipped = [bool(d.candidate.skipped) for d in report.incidents]
    assert skipped == [False] * 10 + [True] * 3
    assert report.incidents[-1].changes == [
        "rung: reboot -> replace (reboot fixed XID_79 in 0 of 12 cases: going to replace)",
        "repairs: reboot, replace -> replace",
    ]
    assert report.summary.avoided == {"reboot": 3}
