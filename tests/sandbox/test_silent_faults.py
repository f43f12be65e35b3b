"""The sandbox's silent faults (sandbox/machines/job_faults.py: `sandbox job-fault`) and what the
silent demos read (sandbox/drivers/silent_demo.py), without a sandbox: the choices and bounds, the
watcher that lifts a hang once its processes are gone, and the summary's pure readings."""

from __future__ import annotations

import subprocess
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from autoclusters.core.fault_evidence import FaultEvidence
from autoclusters.core.models import FaultSeen, IncidentRequest, IncidentState
from autoclusters.core.process_start import start_ticks
from autoclusters.sandbox import cli as sandbox_cli
from autoclusters.sandbox.drivers.silent_demo import (
    SilentDemoSummary,
    detection_path,
    median_step_s,
    opening_rule,
    print_silent_summary,
)
from autoclusters.sandbox.machines import fault_effects, job_faults
from autoclusters.sandbox.machines.fault_effects import NodeEffect, Proc
from autoclusters.sandbox.machines.joblog import ProgressLine
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.runtime.daemons import agent_env

T0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def test_the_effects_and_the_factor_are_bounded() -> None:
    assert job_faults.parse_job_effect("hang") == "hang"
    assert job_faults.parse_job_effect("slow") == "slow"
    with pytest.raises(ValueError, match="hang, slow"):
        job_faults.parse_job_effect("crash")  # a crash is loud: hardware-fault's
    assert job_faults.parse_factor(2.0) == 2.0
    for bad in (1.0, 0.5, -2.0, job_faults.MAX_FACTOR + 1):
        with pytest.raises(ValueError, match="factor must be above 1"):
            job_faults.parse_factor(bad)


def test_no_rank_on_the_node_is_refused_before_anything_is_done(tmp_path: Path) -> None:
    cfg = SandboxConfig(state_dir=tmp_path)
    with pytest.raises(LookupError, match="no rank of job 7 runs on gpu-02"):
        job_faults.inject(cfg, "gpu-02", "hang", job_id=7)
    assert fault_effects.recorded(cfg, "gpu-02") is None
    assert not (tmp_path / "pids").exists()  # no watcher started


def test_the_cli_refuses_an_unknown_effect_and_a_bad_factor(tmp_path: Path) -> None:
    app = typer.Typer()
    sandbox_cli.register(app)
    runner = CliRunner()
    base = ["sandbox", "job-fault", "--node", "gpu-01", "--state-dir", str(tmp_path)]
    bad_effect = runner.invoke(app, [*base, "--effect", "crash"])
    assert bad_effect.exit_code == 2 and "'hang'" in bad_effect.output, bad_effect.output
    # The sandbox is read before the factor: no sandbox there is refused too, exit 2.
    no_sandbox = runner.invoke(app, [*base, "--effect", "slow", "--factor", "3"])
    assert no_sandbox.exit_code == 2, no_sandbox.output
    scenario = runner.invoke(app, ["demo", "--scenario", "stuck", "--state-dir", str(tmp_path)])
    assert scenario.exit_code == 2 and "'hang'" in scenario.output and "'slow'" in scenario.output


def test_each_sandbox_has_its_own_progress_directory_for_its_agents(tmp_path: Path) -> None:
    one = SandboxConfig(state_dir=tmp_path / "a", port_base=21000)
    two = SandboxConfig(state_dir=tmp_path / "b", port_base=21200)
    for cfg in (one, two):
        (cfg.state_dir / "api").mkdir(parents=True)
        (cfg.state_dir / "api" / "token").write_text("t\n")
    dirs = {agent_env(cfg)["AUTOCLUSTERS_AGENT_PROGRESS_DIR"] for cfg in (one, two)}
    assert dirs == {str(one.progress_dir), str(two.progress_dir)}
    assert one.progress_dir.is_relative_to(one.state_dir)


def _record(cfg: SandboxConfig, node: str, procs: list[Proc]) -> None:
    path = cfg.state_dir / "hardware" / f"{node}.effect.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(NodeEffect(effect="hang", stopped=procs).model_dump_json())


def test_the_watcher_lifts_the_hang_once_its_processes_are_gone(tmp_path: Path) -> None:
    cfg = SandboxConfig(state_dir=tmp_path, port_base=21000)
    rank = subprocess.Popen(["sleep", "30"])
    try:
        ticks = start_ticks(rank.pid)
        assert ticks is not None
        procs = [Proc(pid=rank.pid, ticks=ticks)]
        _record(cfg, "gpu-02", procs)
        done: list[bool] = []
        watcher = threading.Thread(
            target=lambda: done.append(job_faults.release_when_gone(cfg, "gpu-02", procs))
        )
        # release_when_gone sets signal handlers: only the main thread may; patched out here.
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(job_faults.signal, "signal", lambda *_a: None)
            mp.setattr(job_faults, "RELEASE_POLL_S", 0.02)
            watcher.start()
            watcher.join(0.3)
            assert watcher.is_alive(), "lifted while its process still ran"
            assert fault_effects.recorded(cfg, "gpu-02") is not None
            rank.kill()
            rank.wait()  # reaped: gone from /proc
            watcher.join(10)
        assert done == [True]
        assert fault_effects.recorded(cfg, "gpu-02") is None
    finally:
        rank.kill()
        rank.wait()


def test_detected_by_names_the_job_progress_path_only_for_its_faults() -> None:
    assert detection_path("agent", "JOB_HANG") == "job-progress"
    assert detection_path("agent", "SLOW_NODE") == "job-progress"
    assert detection_path("agent", "XID_79") == "agent"
    assert detection_path("alertmanager", "JOB_HANG") == "alertmanager"


def _state(fault: str, faults: list[FaultSeen]) -> IncidentState:
    request = IncidentRequest(
        incident_id="inc-1", cluster="c", node="gpu-02", fault=fault, opened_at=T0,
        opened_by="agent",
    )  # fmt: skip
    return IncidentState(request=request, faults=faults)


def _seen(fault: str, readings: dict[str, object]) -> FaultSeen:
    ev = FaultEvidence.from_agent(key="k", since=T0, message="m", readings=readings)
    return FaultSeen(fault=fault, source="agent", first_at=T0, last_at=T0, evidence=[ev])


def test_the_opening_rule_is_read_from_the_opening_faults_evidence() -> None:
    hang = _seen("JOB_HANG", {"subjects": [{"rule": "heartbeat", "rank": 1}]})
    other = _seen("XID_79", {"subjects": [{"rule": "nonsense"}]})
    assert opening_rule(_state("JOB_HANG", [other, hang])) == "heartbeat"
    assert opening_rule(_state("JOB_HANG", [_seen("JOB_HANG", {"subjects": []})])) is None
    assert opening_rule(_state("JOB_HANG", [_seen("JOB_HANG", {"subjects": "x"})])) is None
    assert opening_rule(_state("SLOW_NODE", [hang])) is None


def _line(ts: float, node: str, step: int, restart: int = 0, elastic: int = 0) -> ProgressLine:
    return ProgressLine(ts=ts, node=node, restart=restart, step=step, elastic=elastic)


def test_the_step_time_is_the_median_gap_between_one_nodes_consecutive_steps() -> None:
    lines = [
        _line(100.0, "gpu-01", 1), _line(100.1, "gpu-02", 1),
        _line(101.0, "gpu-01", 2), _line(101.1, "gpu-02", 2),
        _line(103.0, "gpu-01", 3), _line(103.1, "gpu-02", 3),
        _line(105.0, "gpu-01", 4),
        # a re-formed group and a requeued run start their own sequences
        _line(140.0, "gpu-01", 4, elastic=1), _line(141.0, "gpu-01", 5, elastic=1),
        _line(190.0, "gpu-01", 3, restart=1),
    ]  # fmt: skip
    assert median_step_s(lines, 100, 106) == 2.0  # gaps 1, 2, 2 / 1, 2
    assert median_step_s(lines, 139, 200) == 1.0  # only the re-formed group's one gap
    assert median_step_s(lines, 104, 106) is None  # one line: no gap


def test_the_summary_prints_the_node_named_and_flags_a_wrong_one() -> None:
    summary = SilentDemoSummary(
        scenario="slow", incident_id="inc-1", status="resolved", rung="reset_gpu",
        node="gpu-03", named_node="gpu-03", other_nodes_named=["gpu-02"], right_node=False,
        fault="SLOW_NODE", expected_fault="SLOW_NODE", fault_effect="slow", slow_factor=2.0,
        detected_by="job-progress", rule="slow_steps", detect_s=22.0, job_recovery_s=39.1,
        recovery_path="requeue", job_id=8, job="in-job", job_restarts=1,
        resumed_from_step=22, step_s_before=1.0, step_s_faulted=1.9, step_s_after=1.0,
        job_nodes_before=["gpu-01", "gpu-02", "gpu-03"], job_nodes_after=["gpu-01", "gpu-02"],
        health_gates=[True], temporal_ui="http://ui", steps=[],
    )  # fmt: skip
    out = Console(record=True, width=200)
    print_silent_summary(summary, out)
    text = out.export_text()
    assert "named gpu-03" in text and "SLOW_NODE by job-progress, rule slow_steps" in text
    assert "also named         gpu-02" in text
    assert "22.0 s" in text and "39.1 s" in text and "1.9 s faulted" in text
