"""The burn-in screen before return (issue 23, item 3).

Aspects covered:
- the runbook (time-skipping server, the fakes of tests/workflows/test_remediation_workflow.py):
with
  `burn_in.enabled` a repaired node that passed its gate is screened before it returns; a
  screen that passes returns it (the result on the incident, a check on the gate's report);
  a failed screen is a failed gate: one rung up, then the next repair is screened again; a
  screen with no neighbour is said on the timeline; off (the default) nothing is screened;
- the activity's pure parts: the neighbour chosen from what Slurm shows, the job's output
  read, the verdict (diagnostic, all-reduce, bandwidth floor), reservations parsed, a failed
  read unknown, not "no reservation";
- against the real Slurm of the session's sandbox: the reservation, the job in it (gloo
  all-reduce with a neighbour, the fake backend's active diagnostic), the node drained
  again under the incident and the reservation gone; a latent fault the passive checks do
  not see (GPU_MARGINAL) fails the screen; a node screened alone;
- a whole incident on the sandbox (its worker): a marginal GPU passes the reboot's gate,
  fails its screen, and the ladder climbs to replace, whose screen passes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from temporalio import activity
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from autoclusters.activities.screen import (
    ScreenActivities,
    healthy_idle,
    judge,
    parse_gemm,
    parse_output,
    reservation_name,
)
from autoclusters.clients.agent import fake_backend
from autoclusters.core.models import ScreenInput, ScreenResult, SlurmNode, drain_reason
from autoclusters.core.policy import BurnInScreen, Rung
from autoclusters.core.settings import Settings
from autoclusters.integrations.slurm import SlurmUnavailable
from autoclusters.integrations.slurm_reservations import (
    SlurmReservationCli,
    parse_reservations,
)
from autoclusters.sandbox.machines.hardware import Hardware, HardwareFault
from autoclusters.sandbox.machines.vms import VmRegistry
from autoclusters.sandbox.runtime.config import SandboxConfig
from tests.fakes.systems import FakeCloud
from tests.helpers import fresh_policy, resolve_incident
from tests.workflows.test_remediation_workflow import _fleet, _policy

ON = BurnInScreen(enabled=True, timeout_s=120)

# --- the runbook, with a fake screen ---------------------------------------------------------


def _fake_screen(
    cloud: list[FakeCloud], passes_from: Rung, neighbour: str | None = "gpu-03"
) -> tuple[Callable[..., object], list[ScreenInput]]:
    """A screen that passes once the node's latest repair was `passes_from` or higher."""
    calls: list[ScreenInput] = []
    ladder = [Rung.RESET_GPU, Rung.REBOOT, Rung.REPLACE]

    @activity.defn(name="burn_in_screen")
    async def burn_in_screen(inp: ScreenInput) -> ScreenResult:
        calls.append(inp)
        last = [r for n, r, _ in cloud[0].repair_calls if n == inp.node][-1]
        ok = ladder.index(last) >= ladder.index(passes_from)
        return ScreenResult(
            node=inp.node, passed=ok, seconds=12.5, reservation=reservation_name(inp.node),
            job_id=40 + len(calls), neighbour=neighbour, allreduce_s=0.004, algbw_gbps=16.7,
            busbw_gbps=16.7, backend="gloo",
            diag={inp.node: "pass" if ok else "GPU 0: memory stress test failed"},
            detail="passed" if ok else f"diagnostic on {inp.node}: GPU 0: memory stress",
        )  # fmt: skip

    return burn_in_screen, calls


async def test_a_passing_screen_returns_the_node(env: WorkflowEnvironment) -> None:
    cloud: list[FakeCloud] = []
    screen, calls = _fake_screen(cloud, Rung.REBOOT)
    async with _fleet(env, fixed_by=Rung.REBOOT, extra_activities=[screen]) as f:
        cloud.append(f.cloud)
        req = f.request(policy=_policy(burn_in=ON))
        result = await (await f.start(req)).result()

    assert result.status == "resolved" and not f.slurm.node_now("gpu-01").drained
    assert len(calls) == 1 and calls[0].key == f"{req.incident_id}:1"
    assert calls[0].drain_reason == drain_reason(req.incident_id, "XID_79")
    (screened,) = result.screens
    assert screened.passed and screened.busbw_gbps == 16.7 and screened.neighbour == "gpu-03"
    assert result.health[-1].passed
    assert result.health[-1].checks[-1].name == "burn_in_screen"
    names = [s.name for s in result.steps]
    assert names.index("health_gate") < names.index("burn_in_screen")
    assert names.index("burn_in_screen") < names.index("return_to_service")
    step = result.step("burn_in_screen")
    assert step is not None and step.detail.startswith("passed; with gpu-03, job 41")


async def test_a_failed_screen_climbs_one_rung(env: WorkflowEnvironment) -> None:
    cloud: list[FakeCloud] = []
    screen, calls = _fake_screen(cloud, Rung.REPLACE)
    async with _fleet(env, fixed_by=Rung.REBOOT, extra_activities=[screen]) as f:
        cloud.append(f.cloud)
        req = f.request(policy=_policy(burn_in=ON))
        result = await (await f.start(req)).result()

    assert result.status == "resolved" and result.rung == Rung.REPLACE.value
    assert [r for _, r, _ in f.cloud.repair_calls] == [Rung.REBOOT, Rung.REPLACE]
    # The gate passed both times; the screen failed the first: the gate's report says so.
    assert [h.passed for h in result.health] == [False, True]
    assert "burn_in_screen" in result.health[0].failures()
    assert [s.passed for s in result.screens] == [False, True]
    assert [c.key for c in calls] == [f"{req.incident_id}:1", f"{req.incident_id}:2"]
    escalated = [n for n in f.notes() if n.event == "escalated"]
    assert escalated and "memory stress" in escalated[0].text
    assert not f.slurm.node_now("gpu-01").drained


async def test_no_neighbour_is_said_and_off_screens_nothing(env: WorkflowEnvironment) -> None:
    cloud: list[FakeCloud] = []
    screen, calls = _fake_screen(cloud, Rung.REBOOT, neighbour=None)
    async with _fleet(env, fixed_by=Rung.REBOOT, extra_activities=[screen]) as f:
        cloud.append(f.cloud)
        alone = await (await f.start(f.request(policy=_policy(burn_in=ON)))).result()
        off = await (await f.start(f.request(node="gpu-02"))).result()

    step = alone.step("burn_in_screen")
    assert step is not None and "alone (no healthy idle neighbour)" in step.detail
    assert alone.screens[0].neighbour is None and alone.status == "resolved"
    assert off.status == "resolved" and off.screens == [] and off.step("burn_in_screen") is None
    assert len(calls) == 1


# --- the activity's pure parts ---------------------------------------------------------------


def _node(name: str, state: str = "idle", flags: list[str] | None = None) -> SlurmNode:
    return SlurmNode(name=name, state=state, state_flags=flags or [])


def test_the_neighbour_is_a_healthy_idle_node() -> None:
    nodes = [
        _node("gpu-01", flags=["DRAIN"]),  # the repaired node itself
        _node("gpu-02", "allocated"),
        _node("gpu-03", flags=["DRAIN"]),
        _node("gpu-04", flags=["MAINTENANCE", "RESERVED"]),
        _node("gpu-06"),
        _node("gpu-05"),
    ]
    assert healthy_idle(nodes, "gpu-01") == "gpu-05"
    assert healthy_idle(nodes[:4], "gpu-01") is None


OUTPUT = (
    'diag node=gpu-01 result=pass method=fake detail="all GPUs passed"\n'
    'diag node=gpu-03 result=fail method=fake detail="GPU 0: memory stress test failed"\n'
    "allreduce ranks=2 nodes=gpu-01,gpu-03 backend=gloo size_mib=64 rounds=5 "
    "mean_s=0.040000 algbw_gbps=1.678 busbw_gbps=1.678 correct=1\n"
)


def test_the_output_and_the_verdict() -> None:
    allreduce, diag = parse_output(OUTPUT)
    assert allreduce is not None and allreduce["busbw_gbps"] == "1.678"
    assert diag == {"gpu-01": "pass", "gpu-03": "GPU 0: memory stress test failed"}
    inp = ScreenInput(node="gpu-01", incident_id="INC-1", key="INC-1:1", drain_reason="r")
    both = ["gpu-01", "gpu-03"]
    failed = judge(inp, nodes=both, job_state="FAILED", output=OUTPUT)
    assert not failed.passed and "diagnostic on gpu-03" in failed.detail
    assert failed.busbw_gbps == 1.678 and failed.allreduce_s == 0.04
    good = OUTPUT.replace("result=fail", "result=pass")
    assert judge(inp, nodes=both, job_state="COMPLETED", output=good).passed
    floor = inp.model_copy(update={"min_bus_gbps": 10})
    slow = judge(floor, nodes=both, job_state="COMPLETED", output=good)
    assert not slow.passed and "1.7 GB/s < 10" in slow.detail
    nothing = judge(inp, nodes=both, job_state="COMPLETED", output="")
    assert not nothing.passed and "no all-reduce result" in nothing.detail
    assert "no diagnostic from gpu-01" in nothing.detail


GEMM = (
    "gemm node=gpu-01 rank=0 dtype=bfloat16 n=8192 tflops=310.500\n"
    "gemm node=gpu-01 rank=1 dtype=bfloat16 n=8192 tflops=92.250\n"
    "gemm node=gpu-03 rank=2 dtype=bfloat16 n=8192 tflops=305.000\n"
)


def test_the_gemm_rate_and_its_floor() -> None:
    """Each node's slowest rank's rate; under the floor (a slow GPU the diagnostic passes)
    or missing while a floor is set: not passed; no floor: the rates are only reported."""
    good = OUTPUT.replace("result=fail", "result=pass")
    assert parse_gemm(GEMM) == {"gpu-01": 92.25, "gpu-03": 305.0}
    inp = ScreenInput(node="gpu-01", incident_id="INC-1", key="INC-1:0", drain_reason="r")
    both = ["gpu-01", "gpu-03"]
    no_floor = judge(inp, nodes=both, job_state="COMPLETED", output=good + GEMM)
    assert no_floor.passed and no_floor.gemm_tflops["gpu-01"] == 92.25
    floor = inp.model_copy(update={"min_gemm_tflops": 250})
    slow = judge(floor, nodes=both, job_state="COMPLETED", output=good + GEMM)
    assert not slow.passed and slow.detail == "GEMM on gpu-01 92.2 TFLOP/s < 250"
    missing = judge(floor, nodes=both, job_state="COMPLETED", output=good + GEMM.splitlines()[2])
    assert not missing.passed and "no GEMM rate from gpu-01" in missing.detail


def test_the_screen_job_prints_its_gemm_rate(capsys: pytest.CaptureFixture[str]) -> None:
    """examples/training/screen.py's GEMM on this machine's torch (CPU here)."""
    pytest.importorskip("torch")
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "examples" / "training" / "screen.py"
    spec = importlib.util.spec_from_file_location("screen_job", path)
    assert spec is not None and spec.loader is not None
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    job.gemm_rate(3, "gpu-07")
    rates = parse_gemm(capsys.readouterr().out)
    assert list(rates) == ["gpu-07"] and rates["gpu-07"] > 0


def test_reservations_read_and_a_failed_read_is_unknown() -> None:
    line = (
        "ReservationName=breakfix-gpu-01 StartTime=2026-12-02T12:00:00 "
        "EndTime=2026-12-02T12:15:00 Duration=00:15:00 Nodes=gpu-[01,03] NodeCnt=2 "
        "Flags=MAINT,IGNORE_JOBS Users=root State=ACTIVE"
    )
    found = parse_reservations(line + "\n")
    assert found["breakfix-gpu-01"]["Nodes"] == "gpu-[01,03]"
    assert parse_reservations("No reservations in the system\n") == {}
    with pytest.raises(SlurmUnavailable):
        parse_reservations("slurm_load_reservations error: Unable to contact slurm controller")


def test_the_latent_fault_shows_only_to_the_active_diagnostic(tmp_path: Path) -> None:
    from autoclusters.clients.agent import diag

    path = tmp_path / "gpu-01.json"
    fake_backend.write_node(path, fake_backend.healthy_node())
    fake_backend.inject(path, fault="GPU_MARGINAL", gpu=3)
    node = fake_backend.read_node(path)
    # The passive reads (what the agent reports) are those of a healthy node.
    assert node.gpus == fake_backend.healthy_node().gpus and node.events == []
    found = diag.fake_diag("gpu-01", path)
    assert not found.passed and "GPU 3: memory stress test failed" in found.failures[0]
    fake_backend.boot(path, healthy=False, still_broken=["GPU_MARGINAL"])  # a reboot
    assert not diag.fake_diag("gpu-01", path).passed
    fake_backend.boot(path, healthy=True)  # a new machine
    assert diag.fake_diag("gpu-01", path).passed


# --- against the sandbox's real Slurm ------------------------------------------------------------


async def _screen_on_sandbox(
    cfg: SandboxConfig, node: str, incident: str, **changes: object
) -> tuple[ScreenResult, SlurmNode, dict[str, dict[str, str]]]:
    slurm = SlurmReservationCli(cfg.slurm_conf)
    reason = drain_reason(incident, "XID_79")
    await slurm.drain(node, reason)
    acts = ScreenActivities(slurm, cfg.state_dir / "screens", fake_dir=cfg.state_dir / "agent")
    inp = ScreenInput(
        node=node, incident_id=incident, key=f"{incident}:1", drain_reason=reason,
        timeout_s=240, size_mib=8, rounds=3, poll_s=0.5,
    ).model_copy(update=changes)  # fmt: skip
    try:
        res = await acts.screen(inp)
        after = await slurm.node(node)
        assert after is not None
        return res, after, await slurm.reservations()
    finally:
        await slurm.resume(node)


@pytest.mark.integration
async def test_the_screen_on_real_slurm(sandbox: SandboxConfig) -> None:
    node, agent_file = "gpu-04", sandbox.agent_file("gpu-04")
    res, after, held = await _screen_on_sandbox(sandbox, node, "INC-screen-ok")
    assert res.passed, res.detail
    assert res.neighbour is not None and res.neighbour != node
    assert res.backend == "gloo" and res.busbw_gbps and res.busbw_gbps > 0
    assert res.allreduce_s and res.allreduce_s > 0 and res.seconds > 0
    assert res.diag == {node: "pass", res.neighbour: "pass"}
    # Drained again under the incident (the runbook returns it), the reservation gone.
    assert after.drained and after.reason == drain_reason("INC-screen-ok", "XID_79")
    assert reservation_name(node) not in held

    # A latent fault: the passive checks see nothing, the active diagnostic does.
    await asyncio.to_thread(fake_backend.inject, agent_file, fault="GPU_MARGINAL")
    try:
        bad, after, held = await _screen_on_sandbox(sandbox, node, "INC-screen-bad")
    finally:
        await asyncio.to_thread(fake_backend.reset, agent_file)
    assert not bad.passed and f"diagnostic on {node}: GPU 0: memory stress" in bad.detail
    assert bad.busbw_gbps is not None  # the all-reduce still ran: its figures are kept
    assert after.drained and reservation_name(node) not in held

    alone, _, _ = await _screen_on_sandbox(sandbox, node, "INC-screen-alone", neighbour=False)
    assert alone.passed and alone.neighbour is None, alone.detail
    assert "screened alone" in alone.detail and alone.diag == {node: "pass"}


@pytest.mark.integration
async def test_a_failed_screen_climbs_the_ladder_on_the_sandbox(
    sandbox: SandboxConfig, sandbox_settings: Settings, sandbox_client: Client
) -> None:
    """A marginal GPU that a reboot does not fix and no passive check sees: the reboot passes
    its health gate, the screen's active diagnostic fails it, the runbook replaces the
    machine, whose screen passes; the node is returned."""
    node = "gpu-03"
    vm = VmRegistry(sandbox.state_dir).get(node)
    assert vm is not None
    Hardware(sandbox.state_dir).inject(
        node, vm.vm_id, HardwareFault(fault="GPU_MARGINAL", fixed_by=Rung.REPLACE)
    )
    burn_in = BurnInScreen(enabled=True, timeout_s=180, size_mib=8, rounds=3)
    state = await resolve_incident(
        sandbox_client, sandbox_settings, node, "XID_79", fresh_policy(burn_in=burn_in)
    )

    assert state.status == "resolved", state.error
    repairs = [s.detail.split(":")[0] for s in state.steps if s.name == "repair"]
    assert repairs == ["reboot", "replace"] and state.rung == "replace"
    assert [h.passed for h in state.health] == [False, True]
    gate = {c.name: c for c in state.health[0].checks}
    assert gate["slurmd"].passed and gate["agent_report"].passed  # the passive checks passed
    assert not gate["burn_in_screen"].passed
    assert "memory stress test failed" in gate["burn_in_screen"].detail
    failed, passed = state.screens
    assert not failed.passed and passed.passed and passed.neighbour is not None
    assert passed.busbw_gbps is not None and passed.busbw_gbps > 0
    slurm = SlurmReservationCli(sandbox.slurm_conf)
    back = await slurm.node(node)
    assert back is not None and back.display_state == "IDLE"
    assert reservation_name(node) not in await slurm.reservations()
