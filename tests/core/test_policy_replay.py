"""Policy replay over incident records read from recorded NodeRemediation histories
(tests/histories: real histories of real runs of the runbook), and `policy replay|apply`.

Aspects covered:
- each recorded history reads back as the incident its case is about (rungs and their
  verdicts, approvals, the guard's hold, the end);
- a policy replayed over the incidents it ran itself changes nothing;
- a policy that raises XID_79 straight to replace shows, per incident, the rung and the
  repairs it changes (a reboot avoided where the reboot failed), and leaves the other
  faults' incidents alone; a rung the incident never tried has an unknown outcome;
- recounted decisions: a longer recurrence window, a breaker that trips on fewer opens, a
  guard that holds a repair while another runs; approvals asked, and a rejection kept;
- `policy replay --json` and the printed diff; `policy apply` refuses (exit 3, the file
  untouched) without --accept-changes and writes the policy file with it; a policy that
  changes nothing applies; an unreadable history refuses the apply and is named.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from temporalio.client import WorkflowHistory
from typer.testing import CliRunner

from autoclusters.clients.cli.app import app
from autoclusters.clients.incident_history import (
    UnreadableHistory,
    parse_since,
    read_history_files,
    record_from_history,
)
from autoclusters.core.incident_record import Admission, IncidentRecord, RepairAttempt
from autoclusters.core.policy import FaultRule, GuardPolicy, Policy, Rung
from autoclusters.core.policy_replay import replay_policy

HISTORIES = Path(__file__).parents[1] / "histories"
REMEDIATION = sorted(HISTORIES.glob("remediation_*.json"))
# The runbook tests' cases, all opened under one policy (the raised-XID_79 candidates
# below change only XID_79 there). A systemic member's history was opened under a policy
# with systemic incidents on: a candidate without them repairs it on its own (its own test).
NODE_BY_NODE = [p for p in REMEDIATION if "systemic" not in p.stem]


def _record(case: str, release: str = "0.2") -> IncidentRecord:
    path = HISTORIES / f"remediation_{release}_{case}.json"
    return record_from_history(WorkflowHistory.from_json(path.stem, path.read_text()))


def _records() -> list[IncidentRecord]:
    return [
        record_from_history(WorkflowHistory.from_json(p.stem, p.read_text())) for p in NODE_BY_NODE
    ]


def _live() -> Policy:
    """The policy the cases ran under: the runbook tests' (reboot_resolved's), with the rules
    of the silent faults that screen before repair (screened_back's, from 0.2)."""
    base = _record("reboot_resolved").policy
    silent = _record("screened_back").policy.faults
    return base.model_copy(update={"faults": {**base.faults, **silent}})


def _raised(policy: Policy) -> Policy:
    """`policy` with XID_79 straight to replace."""
    faults = {**policy.faults, "XID_79": FaultRule(severity="critical", first_rung=Rung.REPLACE)}
    return policy.model_copy(update={"faults": faults})


# --- reading the histories -------------------------------------------------------------------


@pytest.mark.parametrize("release", ["0.1", "0.2"])
def test_recorded_histories_read_back_as_their_cases(release: str) -> None:
    escalated = _record("replace_escalated", release)
    assert (escalated.status, escalated.fault, escalated.rung) == ("resolved", "XID_79", "reboot")
    assert [(a.rung, a.passed) for a in escalated.repairs] == [
        (Rung.REBOOT, False),
        (Rung.REPLACE, True),
    ]
    assert escalated.returned_at is not None and escalated.returned_at > escalated.started_at
    rejected = _record("rejected", release)
    assert (rejected.status, rejected.repairs) == ("rejected", [])
    assert rejected.approvals_asked == ["reboot"] and rejected.decisions == [("reboot", False)]
    approved = _record("approved", release)
    assert approved.decisions == [("reboot", True)]
    assert [(a.rung, a.passed) for a in approved.repairs] == [(Rung.REBOOT, True)]
    failed = _record("repair_failed", release)
    assert failed.status == "failed"
    assert [(a.passed, a.repair_failed) for a in failed.repairs] == [(False, True)]
    held = _record("held_then_admitted", release)
    assert held.held and [a.admitted for a in held.admissions][-1]
    assert _record("reset_gpu_resolved", release).repairs[0].rung == Rung.RESET_GPU
    assert _record("hot_spare", release).returned_at is not None


def test_another_workflow_type_is_not_an_incident() -> None:
    path = HISTORIES / "fleet_guard_0.2_batch.json"
    with pytest.raises(UnreadableHistory, match="FleetGuard, not an incident"):
        record_from_history(WorkflowHistory.from_json(path.stem, path.read_text()))


# --- replaying ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", REMEDIATION, ids=[p.stem for p in REMEDIATION])
def test_an_incident_replayed_under_its_own_policy_changes_nothing(path: Path) -> None:
    rec = record_from_history(WorkflowHistory.from_json(path.stem, path.read_text()))
    report = replay_policy(rec.policy, [rec])
    assert not report.changes_outcomes, report.incidents[0].changes


def test_raising_xid_79_to_replace_shows_the_diff() -> None:
    records = _records()
    base = _live()
    report = replay_policy(_raised(base), records)
    case_of = {r.incident_id: p.stem for p, r in zip(NODE_BY_NODE, records, strict=True)}
    by_case = {case_of[d.incident_id]: d for d in report.incidents}

    escalated = by_case["remediation_0.2_replace_escalated"]
    assert escalated.changes == [
        "rung: reboot -> replace",
        "repairs: reboot, replace -> replace",
    ]
    resolved = by_case["remediation_0.2_reboot_resolved"]
    assert resolved.changes == ["rung: reboot -> replace", "repairs: reboot -> replace"]
    # The replace never ran in this incident: its history cannot say how it would end.
    failed = by_case["remediation_0.2_repair_failed"]
    assert "outcome: failed -> unknown" in failed.changes
    assert failed.candidate.outcome == "unknown" and failed.notes
    # Other faults keep their rungs.
    for case in ("reset_gpu_resolved", "hot_spare", "kubernetes"):
        d = by_case[f"remediation_0.2_{case}"]
        assert d.fault != "XID_79" and d.live.rung == d.candidate.rung
    sm = report.summary
    xid79 = [d for d in report.incidents if d.fault == "XID_79"]
    assert sm.incidents == len(records) and sm.changed >= len(xid79)
    reboots = sum(d.live.repairs.count("reboot") for d in xid79)
    assert sm.avoided["reboot"] == reboots
    assert sm.repairs_candidate < sm.repairs_live + sum(1 for d in xid79 if not d.live.repairs)


T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _rec(
    n: int,
    at: timedelta,
    *,
    node: str = "gpu-01",
    repairs: list[tuple[Rung, bool | None]] | None = None,
    policy: Policy | None = None,
    **fields: object,
) -> IncidentRecord:
    start = T0 + at
    repairs = [(Rung.REBOOT, True)] if repairs is None else repairs
    return IncidentRecord(
        incident_id=f"inc-{n}",
        cluster="c1",
        node=node,
        fault="XID_79",
        faults=["XID_79"],
        started_at=start,
        closed_at=start + timedelta(minutes=10),
        status="resolved",
        policy=policy
        or Policy(faults={"XID_79": FaultRule(severity="critical", first_rung=Rung.REBOOT)}),
        rung=repairs[0][0].value if repairs else "reboot",
        recent_on_node=0,
        repairs=[
            RepairAttempt(rung=r, passed=p, at=start + timedelta(minutes=1)) for r, p in repairs
        ],
        returned_at=start + timedelta(minutes=9),
        admissions=[Admission(kind="repair", admitted=True, at=start + timedelta(minutes=1))],
        **fields,
    )


def test_a_longer_recurrence_window_is_recounted() -> None:
    first = _rec(1, timedelta(0))
    # Two days later: outside the live window (1 day), so the live incident opened on reboot.
    second = _rec(2, timedelta(days=2), repairs=[(Rung.REBOOT, False), (Rung.REPLACE, True)])
    cand = first.policy.model_copy(update={"recurrence_window_s": 3 * 86400})
    report = replay_policy(cand, [first, second])
    assert not report.incidents[0].changed
    assert report.incidents[1].changes == [
        "rung: reboot -> replace",
        "repairs: reboot, replace -> replace",
    ]


def test_a_breaker_that_trips_on_fewer_opens_is_recounted() -> None:
    records = [_rec(i, timedelta(minutes=i), node=f"gpu-{i:02d}") for i in range(1, 5)]
    cand = records[0].policy.model_copy(
        update={"guard": GuardPolicy(breaker_threshold=2, breaker_threshold_fraction=0)}
    )
    report = replay_policy(cand, records, cluster_nodes=100)
    # More than 2 opens within the window from the third on: tripped, so repairs are held.
    assert [d.candidate.breaker for d in report.incidents] == [False, False, True, True]
    assert report.incidents[2].changes == [
        "fleet guard: admitted -> held",
        "breaker: not tripped -> tripped",
    ]
    assert (report.summary.breaker_live, report.summary.breaker_candidate) == (0, 2)


def test_a_guard_allowing_one_repair_holds_the_second() -> None:
    one = _rec(1, timedelta(0), node="gpu-01")
    two = _rec(2, timedelta(minutes=3), node="gpu-02")  # while gpu-01's repair runs
    cand = one.policy.model_copy(update={"guard": GuardPolicy(max_concurrent_repairs=1)})
    report = replay_policy(cand, [one, two], cluster_nodes=10)
    assert [d.candidate.guard for d in report.incidents] == ["admitted", "held"]


def test_approvals_asked_and_a_rejection_kept() -> None:
    rejected = _rec(
        1, timedelta(0), repairs=[], approvals_asked=["reboot"], decisions=[("reboot", False)]
    )
    rejected.status = "rejected"
    rejected.policy = rejected.policy.model_copy(update={"mode": "approve"})
    plain = _rec(2, timedelta(days=3), node="gpu-02")
    cand = rejected.policy  # approve mode: every repair asks
    report = replay_policy(cand, [rejected, plain])
    assert not report.incidents[0].changed  # asked, rejected again
    assert report.incidents[1].changes == ["approval asked for: none -> reboot"]
    assert report.incidents[1].notes == [
        "nobody decided on reboot in this incident: taken as approved"
    ]


def test_observe_mode_repairs_nothing() -> None:
    rec = _rec(1, timedelta(0))
    report = replay_policy(rec.policy.model_copy(update={"mode": "observe"}), [rec])
    d = report.incidents[0]
    assert (d.candidate.repairs, d.candidate.outcome) == ([], "observed")
    assert report.summary.avoided == {"reboot": 1}


def test_since_is_parsed_or_refused() -> None:
    assert parse_since("30d") == timedelta(days=30)
    assert parse_since("12h") == timedelta(hours=12)
    assert parse_since("all") is None
    for bad in ("30", "0d", "1w", "-3d"):
        with pytest.raises(ValueError, match="--since"):
            parse_since(bad)


# --- the commands ------------------------------------------------------------------------------


def _policy_file(tmp_path: Path, policy: Policy, name: str) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(policy.model_dump(mode="json", exclude={"ladder"})))
    return path


def _history_args(paths: list[Path]) -> list[str]:
    return [a for p in paths for a in ("--from-history", str(p))]


@pytest.fixture
def live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The cluster's policy file, as the settings name it."""
    path = _policy_file(tmp_path, _live(), "live.yaml")
    monkeypatch.setenv("AUTOCLUSTERS_POLICY_FILE", str(path))
    return path


def test_replay_prints_the_diff_and_json(tmp_path: Path, live: Path) -> None:
    cand = _policy_file(tmp_path, _raised(_live()), "cand.yaml")
    runner = CliRunner()
    paths = [p for p in NODE_BY_NODE if p.stem.startswith("remediation_0.2_")]
    out = runner.invoke(app, ["policy", "replay", str(cand), *_history_args(paths)])
    assert out.exit_code == 0, out.output
    text = " ".join(out.stdout.split())
    assert "rung: reboot -> replace" in text
    assert "repairs: reboot, replace -> replace" in text
    assert "repairs avoided: " in text and " reboot; added: " in text
    out = runner.invoke(app, ["policy", "replay", str(cand), "--json", *_history_args(paths)])
    body = json.loads(out.stdout)
    assert body["summary"]["incidents"] == len(paths) and body["unreadable"] == []
    changed = [d for d in body["incidents"] if d["changed"]]
    assert changed and all(d["fault"] == "XID_79" for d in changed)
    assert {d["candidate"]["rung"] for d in changed} == {"replace"}


def test_apply_refuses_a_policy_that_changes_outcomes(tmp_path: Path, live: Path) -> None:
    before = live.read_text()
    cand = _policy_file(tmp_path, _raised(_live()), "cand.yaml")
    paths = [p for p in NODE_BY_NODE if p.stem.startswith("remediation_0.2_")]
    runner = CliRunner()
    out = runner.invoke(app, ["policy", "apply", str(cand), *_history_args(paths)])
    assert out.exit_code == 3, out.output
    assert "not applied" in out.stderr and "--accept-changes" in " ".join(out.stderr.split())
    assert "rung: reboot -> replace" in out.stdout
    assert live.read_text() == before

    out = runner.invoke(
        app, ["policy", "apply", str(cand), "--accept-changes", *_history_args(paths)]
    )
    assert out.exit_code == 0, out.output
    assert live.read_text() == cand.read_text()


def test_apply_takes_a_policy_that_changes_nothing(tmp_path: Path, live: Path) -> None:
    policy = _live()
    same = _policy_file(
        tmp_path, policy.model_copy(update={"approval_timeout_s": 999}), "same.yaml"
    )
    paths = [HISTORIES / "remediation_0.2_reboot_resolved.json"]
    out = CliRunner().invoke(app, ["policy", "apply", str(same), *_history_args(paths)])
    assert out.exit_code == 0, out.output
    assert live.read_text() == same.read_text()


def test_an_unreadable_history_refuses_the_apply(tmp_path: Path, live: Path) -> None:
    before = live.read_text()
    broken = tmp_path / "broken.json"
    broken.write_text('{"events": []}')
    paths = [HISTORIES / "remediation_0.2_reboot_resolved.json", broken]
    assert read_history_files(paths).unreadable
    same = _policy_file(tmp_path, _live(), "same.yaml")
    out = CliRunner().invoke(app, ["policy", "apply", str(same), *_history_args(paths)])
    assert out.exit_code == 3, out.output
    assert "broken.json" in out.stderr and "could not be read" in out.stderr
    assert live.read_text() == before


def test_a_systemic_member_replayed_without_systemic_incidents_is_repaired_alone() -> None:
    rec = _record("systemic_member")
    assert rec.systemic is not None and rec.systemic.endswith("-leaf-01")
    assert rec.systemic_verdict == "returned" and rec.repairs == [] and rec.status == "resolved"
    off = rec.policy.guard.model_copy(
        update={"systemic": rec.policy.guard.systemic.model_copy(update={"enabled": False})}
    )
    report = replay_policy(rec.policy.model_copy(update={"guard": off}), [rec])
    [d] = report.incidents
    assert d.candidate.repairs == ["reboot"] and d.candidate.outcome == "unknown"
    assert any("systemic incident" in n for n in d.notes)
