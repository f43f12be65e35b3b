"""What `autoclusters demo` prints (sandbox/cli.py `_print_summary`) from its summary:
the burn-in screen's line (passed or failed, with or without a neighbour, its bandwidth),
and no such line when the incident ran no screen."""

from __future__ import annotations

import io

from rich.console import Console

from autoclusters.sandbox.cli import _print_summary
from autoclusters.sandbox.drivers.demo import DemoSummary, ScreenSummary


def _summary(screen: ScreenSummary | None) -> DemoSummary:
    return DemoSummary(
        incident_id="inc-1", node="gpu-03", fault="XID_79", mode="auto", status="resolved",
        rung="replace", job_id=2, detect_s=0.4, detected_by="agent", alert_path_detect_s=None,
        job_recovery_s=0.9, capacity_recovery_s=45.9, job_restarts=0, job="in-job",
        resumed_from_step=10, last_step=30, job_nodes_before=["gpu-01"],
        job_nodes_after=["gpu-02"], node_state_before="MIXED", node_state_after="IDLE",
        kubernetes=True, old_vm_id="a", new_vm_id="b", health_gates=[False, True],
        spare_node=None, screen=screen, planned_steps=[], boot_delay_s=20, provision_s=30,
        temporal_ui="http://127.0.0.1:1/ui", steps=[],
    )  # fmt: skip


def _printed(summary: DemoSummary) -> str:
    out = io.StringIO()
    _print_summary(summary, Console(file=out, width=200))
    return out.getvalue()


def _screen(passed: bool, neighbour: str | None) -> ScreenSummary:
    return ScreenSummary(
        passed=passed, seconds=8.66, neighbour=neighbour, backend="gloo", allreduce_s=0.025,
        algbw_gbps=0.334, busbw_gbps=0.334, diag={"gpu-03": "pass"}, screens=2,
    )  # fmt: skip


def test_the_screen_line() -> None:
    text = _printed(_summary(_screen(True, "gpu-04")))
    line = "passed in 8.7 s with gpu-04 (gloo all-reduce, 0.334 GB/s bus; screens run: 2)"
    assert f"screen             {line}" in text
    failed = _printed(_summary(_screen(False, None)))
    assert "screen             FAILED in 8.7 s alone (no idle neighbour)" in failed
    assert "screen  " not in _printed(_summary(None))
