"""The remediation policy: the shipped defaults, escalation, and errors a human can act on.

Aspects covered:
- the shipped default file loads and says what the fault catalogue promises (XID buckets,
  Crusoe Unhealthy/Degraded lists, named faults, steps and timeouts);
- rung_for escalates one rung per recent incident, caps at replace, never lifts monitor;
- a malformed file gives PolicyError naming the exact line and dotted field of each problem
  (bad rung, unknown key, bad fault kind, negative timeout, YAML syntax, duplicate key, ...);
- a policy written to a file reads back equal;
- `autoclusters policy check` prints a summary, or the errors and exit code 2.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from autoclusters.clients.cli.policy import policy_app
from autoclusters.core.faults import FAULT_PATTERN
from autoclusters.core.policy import (
    DEFAULT_POLICY_FILE,
    FaultRule,
    Policy,
    PolicyError,
    Rung,
    StepPolicy,
    default_policy,
    load_policy,
)

DEFAULT_FILE = Path(__file__).parents[2] / "core" / DEFAULT_POLICY_FILE


@pytest.fixture(scope="module")
def default() -> Policy:
    return default_policy()


# --- the shipped default -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "severity", "rung"),
    [
        ("XID_79", "critical", Rung.REBOOT),
        ("ROW_REMAP_FAILURE", "critical", Rung.REPLACE),
        ("XID_43", "info", Rung.MONITOR),
        ("XID_92", "info", Rung.MONITOR),
        ("XID_137", "info", Rung.MONITOR),
        ("XID_119", "warning", Rung.RESET_GPU),
        ("XID_13", "warning", Rung.MONITOR),  # NVIDIA: restart the application
        ("XID_46", "critical", Rung.RESET_GPU),  # NVIDIA: reset the GPU
        ("XID_151", "critical", Rung.REBOOT),  # NVIDIA: restart the VM
        ("GPU_FELL_OFF_BUS", "critical", Rung.REBOOT),
        ("ROW_REMAP_PENDING", "warning", Rung.RESET_GPU),
        ("THERMAL", "warning", Rung.MONITOR),
        ("IB_LINK_DOWN", "critical", Rung.REBOOT),
        ("IB_LINK_DEGRADED", "warning", Rung.MONITOR),
        ("JOB_HANG", "critical", Rung.RESET_GPU),  # recover the job, reset, gate, screen
        ("SLOW_NODE", "warning", Rung.RESET_GPU),  # checkpoint first (below)
    ],
)
def test_default_maps_fault(default: Policy, fault: str, severity: str, rung: Rung) -> None:
    rule = default.rule_for(fault)
    assert (rule.severity, rule.first_rung) == (severity, rung)


# Degraded, not fatal: the GPU works until its next reset, so the jobs checkpoint first.
CHECKPOINT_FIRST = {"ROW_REMAP_PENDING", "XID_156", "SLOW_NODE"}


def test_only_degraded_faults_checkpoint_before_the_requeue(default: Policy) -> None:
    first = {f for f, r in default.faults.items() if r.on_degraded == "checkpoint_then_drain"}
    assert first == CHECKPOINT_FIRST
    assert all(default.rule_for(f).first_rung != Rung.MONITOR for f in first)
    assert default.default_rule.on_degraded == "drain"
    assert (default.checkpoint_signal, default.checkpoint_budget_s) == ("USR1", 120)


@pytest.mark.parametrize("xid", [32, 48, 64, 74, 79, 95])
def test_default_crusoe_unhealthy_xids_reboot_or_worse(default: Policy, xid: int) -> None:
    rule = default.faults[f"XID_{xid}"]
    assert rule.severity == "critical"
    assert rule.first_rung in (Rung.REBOOT, Rung.REPLACE)


@pytest.mark.parametrize("xid", [119, 120, 140, 143])
def test_default_crusoe_degraded_xids_are_warnings(default: Policy, xid: int) -> None:
    assert default.faults[f"XID_{xid}"].severity == "warning"


def test_default_covers_named_faults(default: Policy) -> None:
    named = {
        "GPU_FELL_OFF_BUS",
        "GPU_COUNT_LOW",
        "ECC_DBE",
        "ROW_REMAP_PENDING",
        "ROW_REMAP_FAILURE",
        "NVLINK_DOWN",
        "GPU_RECOVERY_ACTION",
        "FABRIC_NOT_READY",
        "THERMAL",
        "IB_LINK_DOWN",
        "IB_LINK_DEGRADED",
        "HCA_FELL_OFF_BUS",
        "NODE_NOT_READY",
        "MANUAL",
    }
    assert named <= default.faults.keys()
    assert all(FAULT_PATTERN.match(k) for k in default.faults)


def test_default_unknown_fault_gets_default_rule(default: Policy) -> None:
    assert default.rule_for("XID_999") == FaultRule(severity="warning", first_rung=Rung.REBOOT)
    assert default.rule_for("SOMETHING_NEW").first_rung == Rung.REBOOT


def test_default_settings(default: Policy) -> None:
    assert default.mode == "auto"
    assert default.approvers == []
    assert default.approval_timeout_s == 3600
    assert default.approval_timeout_action == "leave_drained"
    assert default.recurrence_window_s == 86400
    assert default.max_repair_attempts == 3
    for rung in (Rung.RESET_GPU, Rung.REBOOT, Rung.REPLACE):
        assert default.steps[rung] == StepPolicy(
            needs_approval=False,
            wait_for_idle=True,
            idle_timeout_s=3600,
            on_idle_timeout="leave_drained",
        )


def test_default_file_comments_every_fault() -> None:
    """An SRE reading the file sees why each fault gets its action."""
    lines = DEFAULT_FILE.read_text().splitlines()
    rules = [ln for ln in lines if re.match(r"^\s+[A-Z][A-Z0-9_]*:\s*\{", ln)]
    assert len(rules) == len(default_policy().faults)
    assert [ln for ln in rules if "#" not in ln] == []


# --- escalation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "recent", "rung"),
    [
        ("XID_46", 0, Rung.RESET_GPU),
        ("XID_46", 1, Rung.REBOOT),
        ("XID_46", 2, Rung.REPLACE),
        ("XID_46", 3, Rung.REPLACE),
        ("XID_79", 0, Rung.REBOOT),
        ("XID_79", 1, Rung.REPLACE),
        ("XID_79", 10, Rung.REPLACE),
        ("ROW_REMAP_FAILURE", 0, Rung.REPLACE),
        ("XID_43", 0, Rung.MONITOR),
        ("XID_43", 5, Rung.MONITOR),
        ("THERMAL", 3, Rung.MONITOR),
        ("NOT_IN_THE_CATALOGUE", 1, Rung.REPLACE),
    ],
)
def test_rung_for_escalates(default: Policy, fault: str, recent: int, rung: Rung) -> None:
    assert default.rung_for(fault, recent) == rung


def test_step_defaults_when_not_configured() -> None:
    assert Policy().step(Rung.REBOOT) == StepPolicy()


# --- malformed files ---------------------------------------------------------------------


def _load_error(tmp_path: Path, text: str) -> PolicyError:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError) as e:
        load_policy(path)
    return e.value


def _where(err: PolicyError) -> list[tuple[int | None, str]]:
    return [(p.line, p.field) for p in err.problems]


BAD_RUNG = """\
mode: auto
faults:
  XID_48: {severity: critical, first_rung: reboot}
  XID_79:
    severity: critical
    first_rung: rebot
"""


def test_bad_rung_names_line_and_field(tmp_path: Path) -> None:
    err = _load_error(tmp_path, BAD_RUNG)
    assert str(err) == (
        f"{tmp_path / 'policy.yaml'}:6: faults.XID_79.first_rung: "
        "Input should be 'monitor', 'reset_gpu', 'reboot' or 'replace'"
    )


@pytest.mark.parametrize(
    ("text", "where", "says"),
    [
        pytest.param(
            "mode: auto\nmdoe: observe\n",
            [(2, "mdoe")],
            "did you mean 'mode'?",
            id="unknown-top-level-key",
        ),
        pytest.param(
            "mode: auto\n\nguard:\n  max_concurrent_repairs: 2\n  breaker_treshold: 3\n",
            [(5, "guard.breaker_treshold")],
            "did you mean 'breaker_threshold'?",
            id="unknown-nested-key",
        ),
        pytest.param(
            "faults:\n  XID_48: {severity: critical, first_rung: reboot}\n"
            "  xid79: {severity: critical, first_rung: reboot}\n",
            [(3, "faults.xid79")],
            "did you mean 'XID_79'?",
            id="bad-fault-kind-key",
        ),
        pytest.param(
            "steps:\n  reboot:\n    needs_approval: false\n    idle_timeout_s: -60\n",
            [(4, "steps.reboot.idle_timeout_s")],
            "greater than 0",
            id="negative-idle-timeout",
        ),
        pytest.param(
            "mode: auto\napproval_timeout_s: -1\n",
            [(2, "approval_timeout_s")],
            "greater than 0",
            id="negative-approval-timeout",
        ),
        pytest.param(
            "steps:\n  reset_gpu: {}\n  rebot: {}\n",
            [(3, "steps.rebot")],
            "'monitor', 'reset_gpu', 'reboot' or 'replace'",
            id="bad-step-rung",
        ),
        pytest.param(
            "approvers:\n  - alice\n  - '  '\n",
            [(3, "approvers[1]")],
            "at least 1 character",
            id="blank-approver",
        ),
        pytest.param(
            "faults:\n  XID_79:\n    severity: critical\n",
            [(2, "faults.XID_79.first_rung")],
            "required field is missing",
            id="missing-field",
        ),
        pytest.param(
            "faults:\n  XID_79: {severity: severe, first_rung: reboot}\n",
            [(2, "faults.XID_79.severity")],
            "'info', 'warning' or 'critical'",
            id="bad-severity",
        ),
        pytest.param(
            "mode: auto\nguard: {}\nmode: observe\n",
            [(3, "mode")],
            "duplicate key (first given on line 1)",
            id="duplicate-key",
        ),
        pytest.param(
            "mode: auto\nfaults:\n  XID_79: {severity: critical, first_rung: reboot\n"
            "  XID_48: {severity: critical, first_rung: reboot}\n",
            [(4, "")],
            "YAML syntax error",
            id="yaml-unclosed-flow-mapping",
        ),
        pytest.param(
            "mode: auto\n  approvers: []\n",
            [(2, "")],
            "YAML syntax error",
            id="yaml-bad-indent",
        ),
        pytest.param("", [(1, "")], "empty", id="empty-file"),
        pytest.param("- mode\n", [(1, "")], "must be a mapping", id="not-a-mapping"),
    ],
)
def test_malformed_file_names_line_and_field(
    tmp_path: Path, text: str, where: list[tuple[int, str]], says: str
) -> None:
    err = _load_error(tmp_path, text)
    assert _where(err) == where
    assert says in str(err)
    line, field = where[0]
    prefix = f"{tmp_path / 'policy.yaml'}:{line}: " + (f"{field}: " if field else "")
    assert str(err).startswith(prefix)


def test_every_problem_is_reported(tmp_path: Path) -> None:
    err = _load_error(
        tmp_path,
        "mode: sometimes\nfaults:\n  xid79: {severity: critical, first_rung: reboot}\n"
        "steps:\n  reboot: {idle_timeout_s: 0}\n",
    )
    assert _where(err) == [(1, "mode"), (3, "faults.xid79"), (5, "steps.reboot.idle_timeout_s")]
    assert len(str(err).splitlines()) == 3


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(tmp_path / "absent.yaml")


def test_models_forbid_unknown_fields() -> None:
    with pytest.raises(ValidationError):
        StepPolicy(needs_aproval=True)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        Policy(faults={"xid79": FaultRule(severity="critical", first_rung=Rung.REBOOT)})


# --- round trip --------------------------------------------------------------------------


def test_policy_round_trips_through_a_file(tmp_path: Path) -> None:
    policy = Policy(
        mode="approve",
        approvers=["U012ALICE", "bob"],
        approval_timeout_s=1800,
        approval_timeout_action="proceed",
        recurrence_window_s=3600 * 12,
        max_repair_attempts=2,
        faults={
            "XID_79": FaultRule(severity="critical", first_rung=Rung.REBOOT),
            "THERMAL": FaultRule(severity="info", first_rung=Rung.MONITOR),
        },
        default_rule=FaultRule(severity="critical", first_rung=Rung.REPLACE),
        steps={Rung.REPLACE: StepPolicy(needs_approval=True, on_idle_timeout="force")},
        topology={"gpu-01": {"leaf": "leaf-1", "pod": "a"}},  # type: ignore[dict-item]
    )
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy.model_dump(mode="json"), sort_keys=False))
    assert load_policy(path) == policy


def test_default_round_trips_through_a_file(tmp_path: Path, default: Policy) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(default.model_dump(mode="json")))
    assert load_policy(path) == default


# --- `autoclusters policy check` ---------------------------------------------------------


def test_cli_check_prints_summary() -> None:
    result = CliRunner().invoke(policy_app, ["check", str(DEFAULT_FILE)])
    assert result.exit_code == 0, result.output
    assert "mode: auto" in result.stdout
    assert f"fault rules: {len(default_policy().faults)}" in result.stdout
    assert "approvers: (nobody: every approval is refused)" in result.stdout


def test_cli_check_reports_errors_and_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(BAD_RUNG)
    result = CliRunner().invoke(policy_app, ["check", str(path)])
    assert result.exit_code == 2
    assert f"{path}:6: faults.XID_79.first_rung:" in result.stderr
