"""The sandbox's commands, added to `autoclusters` through the `autoclusters.cli` entry
point: `sandbox up|status|down|restart|outage|hardware-fault|slack|ticket|load`, `demo` and
`chaos`. They live with the sandbox (nothing outside it imports it); they use the CLI's own
helpers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from autoclusters.clients.cli.output import console, err
from autoclusters.core.settings import DEFAULT_SANDBOX_DIR
from autoclusters.sandbox.drivers.ticket_cli import ticket_app
from autoclusters.sandbox.slack.cli import slack_app

sandbox_app = typer.Typer(no_args_is_help=True, help="The local sandbox cluster.")
sandbox_app.add_typer(slack_app, name="slack")
sandbox_app.add_typer(ticket_app, name="ticket")
commands = typer.Typer()

StateDir = Annotated[
    Path, typer.Option("--state-dir", help="Where the sandbox keeps its state, logs and PIDs.")
]


# Options whose values come from a fixed set: anything else is Typer's usage error (exit 2)
# naming the values allowed.
RepairRung = Literal["reset_gpu", "reboot", "replace"]
BrokenUntil = Literal["reboot", "replace"]
DemoMode = Literal["observe", "approve", "auto"]
Scenario = Literal["remediate", "share", "borrow", "hang", "slow", "leaf"]
JobFaultEffect = Literal["hang", "slow"]
Platform = Literal["managed-slurm", "cmk"]
JobRecovery = Literal["in-job", "requeue"]
DemoJob = Literal["auto", "stand-in"]
PLATFORM_HELP = (
    "Where Slurm runs: managed-slurm (Crusoe Managed Slurm) or cmk (Slinky on a CMK cluster, "
    "provider crusoe-cmk; Kubernetes mode)."
)
Killable = Literal["worker", "temporal", "api", "slurmctld"]
ChaosAt = Literal[
    "drain", "requeue", "wait_idle", "repair", "wait_registered", "health_gate",
    "return_to_service", "repair:before-cloud", "repair:after-cloud",
]  # fmt: skip


def register(app: typer.Typer) -> None:
    """The `autoclusters.cli` entry point: add the sandbox's commands to `app`."""
    app.add_typer(sandbox_app, name="sandbox")
    for command in commands.registered_commands:
        app.registered_commands.append(command)


# --- sandbox ------------------------------------------------------------------------------


@sandbox_app.command("up")
def sandbox_up(
    nodes: Annotated[int, typer.Option(help="Number of gpu-NN nodes.")] = 4,
    state_dir: StateDir = DEFAULT_SANDBOX_DIR,
    cluster: Annotated[str, typer.Option(help="Slurm cluster name.")] = "sandbox",
    port_base: Annotated[int, typer.Option(help="First of the sandbox's ports.")] = 17200,
    boot_delay: Annotated[float, typer.Option(help="Seconds a replacement VM takes to boot.")] = 20,
    k8s: Annotated[
        bool, typer.Option("--k8s/--no-k8s", help="Slinky-style: Kubernetes + Crusoe emulators.")
    ] = False,
    spares: Annotated[int, typer.Option(help="Hot spare nodes, kept drained until needed.")] = 0,
    platform: Annotated[Platform, typer.Option(help=PLATFORM_HELP)] = "managed-slurm",
) -> None:
    """Start Temporal, munge, Slurm (slurmctld + one slurmd per node) and a worker."""
    from autoclusters.sandbox import cluster as sb
    from autoclusters.sandbox.runtime.config import SandboxConfig
    from autoclusters.sandbox.runtime.daemons import SandboxError

    try:
        cfg = SandboxConfig(
            state_dir=state_dir.absolute(), cluster=cluster, nodes=nodes,
            port_base=port_base, boot_delay_s=boot_delay, k8s=k8s, spares=spares,
            platform=platform,
        )  # fmt: skip
        res = sb.up(cfg)
    except (SandboxError, ValidationError) as e:
        err.print(f"[red]sandbox up failed:[/red] {e}")
        raise typer.Exit(1) from None
    if res.already_running:
        console.print(f"sandbox in {state_dir} is already running; nothing to do")
    else:
        console.print(f"sandbox up: {', '.join(res.started)}")
        if res.provision_s is not None:
            console.print(f"cluster {cfg.cluster} provisioned in {res.provision_s:.1f}s")
    _print_access(cfg)


def _print_access(cfg: Any) -> None:
    from autoclusters.sandbox import provision

    console.print(f"Temporal UI: {cfg.temporal_ui_url}")
    console.print(f"console:     {cfg.api_url}/ui/  (open on loopback)")
    console.print(f"settings:    export AUTOCLUSTERS_CONFIG={cfg.settings_file}")
    console.print(f"slurm:       export SLURM_CONF={cfg.slurm_conf}")
    console.print(
        f"login:       ssh -i {provision.ssh_key(cfg)} -p {cfg.login_port} root@127.0.0.1"
    )
    if cfg.k8s:
        console.print(f"kubectl:     KUBECONFIG={cfg.kubeconfig} kubectl get nodes")


@sandbox_app.command("status")
def sandbox_status(state_dir: StateDir = DEFAULT_SANDBOX_DIR) -> None:
    """Show the sandbox's processes and Slurm nodes."""
    from autoclusters.sandbox import cluster as sb
    from autoclusters.sandbox.runtime.daemons import SandboxError

    try:
        cfg = sb.load(state_dir.absolute())
    except SandboxError as e:
        err.print(str(e))
        raise typer.Exit(1) from None
    procs, nodes = sb.status(cfg)
    t = Table("process", "pid", "state")
    for p in procs:
        t.add_row(p.name, str(p.pid), "running" if p.alive else "[red]dead[/red]")
    console.print(t)
    if nodes:
        nt = Table("node", "state", "reason")
        for n in nodes:
            nt.add_row(n.name, n.display_state, n.reason)
        console.print(nt)
    _print_access(cfg)


@sandbox_app.command("down")
def sandbox_down(state_dir: StateDir = DEFAULT_SANDBOX_DIR) -> None:
    """Stop every process the sandbox started, by its recorded PID."""
    from autoclusters.sandbox import cluster as sb
    from autoclusters.sandbox.runtime.daemons import SandboxError

    try:
        cfg = sb.load(state_dir.absolute())
    except SandboxError as e:
        err.print(str(e))
        raise typer.Exit(1) from None
    stopped = sb.down(cfg)
    console.print(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")


@sandbox_app.command("restart")
def sandbox_restart(
    component: Annotated[
        str,
        typer.Argument(
            help="worker, api, temporal, slurmctld, an agent (agent-gpu-02), a slurmd "
            "(slurmd-gpu-02), k8s-emulator, crusoe-emulator, slack-emulator, munged."
        ),
    ],
    kill: Annotated[
        bool, typer.Option("--kill", help="SIGKILL (a crash) instead of SIGTERM.")
    ] = False,
    timeout_s: Annotated[float, typer.Option(help="How long it may take to be ready.")] = 60,
    state_dir: StateDir = DEFAULT_SANDBOX_DIR,
) -> None:
    """Restart one process of a running sandbox; jobs, drains and incidents stay as they are."""
    from autoclusters.sandbox import cluster as sb
    from autoclusters.sandbox import restart as rs
    from autoclusters.sandbox.runtime.daemons import SandboxError

    try:
        cfg = sb.load(state_dir.absolute())
        done = rs.restart(cfg, component, kill=kill, timeout_s=timeout_s)
    except SandboxError as e:
        err.print(f"[red]restart failed:[/red] {e}")
        raise typer.Exit(1) from None
    console.print(
        f"restarted {done.name}: pid {done.old_pid} ({done.signal}) -> pid {done.new_pid}, ready"
    )


@sandbox_app.command("outage")
def sandbox_outage(
    component: Annotated[
        str,
        typer.Argument(
            help="slurmctld, k8s, crusoe, slack, temporal, prometheus, alertmanager or api."
        ),
    ],
    for_s: Annotated[float, typer.Option("--for", help="Seconds it stays away.")],
    kill: Annotated[
        bool,
        typer.Option(
            "--crash", "--kill", help="SIGKILL (a crash: no clean state save) instead of SIGTERM."
        ),
    ] = False,
    after: Annotated[
        str | None,
        typer.Option(
            help="slurmctld only, with --crash and --node: crash within a second after the "
            "node's incident makes this Slurm write (drain, requeue, resume: read from "
            "slurmctld's log), when its repair starts (repair), or once its STEP has "
            "completed (after:STEP). Waits for it."
        ),
    ] = None,
    node: Annotated[
        str | None, typer.Option(help="The node whose incident --after watches.")
    ] = None,
    hold_saves: Annotated[
        bool,
        typer.Option(
            help="With --after: from now until the crash slurmctld's job state saves fail "
            "(a stalled StateSaveLocation), so the crash forgets every job change since."
        ),
    ] = False,
    wait_s: Annotated[float, typer.Option(help="How long --after waits for its moment.")] = 600,
    timeout_s: Annotated[float, typer.Option(help="How long it may take to be ready.")] = 90,
    state_dir: StateDir = DEFAULT_SANDBOX_DIR,
) -> None:
    """Take one component of a running sandbox away for a while, then start it again on the
    same state; returns once it is ready. Jobs, drains and incidents stay as they are."""
    from autoclusters.sandbox import cluster as sb
    from autoclusters.sandbox.drivers import controller_crash, outage
    from autoclusters.sandbox.runtime.daemons import SandboxError

    try:  # refuse a name before touching anything
        name = outage.process_name(component)
        if after is not None:
            controller_crash.parse_moment(after)
    except (outage.OutageError, controller_crash.CrashError) as e:
        err.print(f"[red]refused:[/red] {e}")
        raise typer.Exit(2) from None
    if for_s < 0:
        err.print("[red]refused:[/red] --for must be 0 or more seconds")
        raise typer.Exit(2)
    if after is not None and (name != "slurmctld" or not kill or node is None):
        err.print("[red]refused:[/red] --after crashes slurmctld: give --crash and --node")
        raise typer.Exit(2)
    try:
        cfg = sb.load(state_dir.absolute())
        if after is not None and node is not None:
            hold = ("job_state",) if hold_saves else ()
            report, c = asyncio.run(
                controller_crash.crash_at(cfg, after, node, for_s, hold=hold, wait_s=wait_s)
            )
            console.print(report.describe())
            console.print(
                f"slurmctld: pid {c.old_pid} crashed (SIGKILL) at {after}, away {c.down_s:.1f}s "
                f"(asked {for_s:g}s, restart included) -> pid {c.new_pid}, ready"
            )
            return
        done = outage.take_away(cfg, component, for_s, kill=kill, timeout_s=timeout_s)
    except (SandboxError, controller_crash.CrashError) as e:
        err.print(f"[red]outage failed:[/red] {e}")
        raise typer.Exit(1) from None
    console.print(
        f"{done.component}: pid {done.old_pid} stopped ({done.signal}), away {done.down_s:.1f}s "
        f"(asked {for_s:g}s, restart included) -> pid {done.new_pid}, ready"
    )


@sandbox_app.command("hardware-fault")
def sandbox_hardware_fault(
    node: Annotated[str, typer.Option(help="The sandbox node whose machine breaks.")],
    fault: Annotated[str, typer.Option(help="What the health gate will report, e.g. XID_79.")],
    fixed_by: Annotated[
        RepairRung, typer.Option(help="The cheapest repair that clears it.")
    ] = "reboot",
    effect: Annotated[
        str,
        typer.Option(
            help="What it does to the jobs on the node: crash, hang, lost, slow, none, or "
            "default (the fault's realistic effect: docs/sandbox.md)."
        ),
    ] = "default",
    state_dir: StateDir = DEFAULT_SANDBOX_DIR,
) -> None:
    """Break a sandbox machine: its health gate fails until a repair at `fixed_by` or above,
    and the jobs on it crash, hang, lose the node, slow down or notice nothing (`effect`)."""
    from autoclusters.core.policy import Rung
    from autoclusters.sandbox import cluster as sb
    from autoclusters.sandbox.machines import fault_effects
    from autoclusters.sandbox.machines import names as machine_names
    from autoclusters.sandbox.machines.hardware import HardwareFault
    from autoclusters.sandbox.runtime.daemons import SandboxError

    try:
        cfg = sb.load(state_dir.absolute())
        rung = Rung(fixed_by)
        chosen = fault_effects.parse_effect(effect, fault)
    except (SandboxError, ValueError) as e:
        err.print(f"[red]refused:[/red] {e}")
        raise typer.Exit(2) from None
    vm = machine_names.vm_of(cfg, node)
    if vm is None:
        err.print(f"[red]refused:[/red] {node} is not a node of the sandbox in {cfg.state_dir}")
        raise typer.Exit(2)
    done = fault_effects.inject(
        cfg, node, vm.vm_id, HardwareFault(fault=fault, fixed_by=rung), chosen
    )
    console.print(
        f"{node} (VM {vm.vm_id}) now has {fault}, cleared by {rung.value} or above; "
        f"effect {chosen}" + (f" ({len(done.stopped)} processes stopped)" if done.stopped else "")
    )


@sandbox_app.command("job-fault")
def sandbox_job_fault(
    node: Annotated[str, typer.Option(help="The sandbox node whose training rank fails.")],
    effect: Annotated[
        JobFaultEffect,
        typer.Option(help="hang: the rank stops, its peers wait; slow: its steps take longer."),
    ],
    factor: Annotated[
        float, typer.Option(help="slow: how many times longer each step takes (above 1).")
    ] = 2.0,
    job: Annotated[
        int | None, typer.Option(help="Only this job's ranks (default: every job's on the node).")
    ] = None,
    state_dir: StateDir = DEFAULT_SANDBOX_DIR,
) -> None:
    """A silent fault: the job's rank on the node hangs or slows down, with nothing wrong in
    the node's hardware readings (no Xid). Only the job's progress shows it (JOB_HANG,
    SLOW_NODE). Lifted once those processes are gone, or by the node's repair (docs/sandbox.md)."""
    from autoclusters.sandbox import cluster as sb
    from autoclusters.sandbox.machines import job_faults
    from autoclusters.sandbox.machines import names as machine_names
    from autoclusters.sandbox.runtime.daemons import SandboxError

    try:
        cfg = sb.load(state_dir.absolute())
        chosen = job_faults.parse_job_effect(effect)
        job_faults.parse_factor(factor)
    except (SandboxError, ValueError) as e:
        err.print(f"[red]refused:[/red] {e}")
        raise typer.Exit(2) from None
    if machine_names.vm_of(cfg, node) is None:
        err.print(f"[red]refused:[/red] {node} is not a node of the sandbox in {cfg.state_dir}")
        raise typer.Exit(2)
    try:
        done = job_faults.inject(cfg, node, chosen, factor=factor, job_id=job)
    except LookupError as e:
        err.print(f"[red]refused:[/red] {e}")
        raise typer.Exit(2) from None
    what = f"{len(done.stopped)} processes stopped" if chosen == "hang" else f"steps ~{factor:g}x"
    console.print(f"{node}: the job's rank {'hangs' if chosen == 'hang' else 'slows'} ({what})")


@sandbox_app.command("load")
def sandbox_load(
    rps: Annotated[float, typer.Option("--rps", help="Requests per second (Poisson arrivals).")],
    duration: Annotated[
        float | None, typer.Option("--for", help="Seconds to run (default: until Ctrl-C).")
    ] = None,
    state_dir: StateDir = DEFAULT_SANDBOX_DIR,
) -> None:
    """Send inference load to the sandbox's gateway (k8s mode), in the foreground; print
    what it achieved: requests per second, p50/p95 latency, errors."""
    import asyncio

    from autoclusters.sandbox import cluster as sb
    from autoclusters.sandbox.drivers.load import Load
    from autoclusters.sandbox.runtime.daemons import SandboxError

    try:
        cfg = sb.load(state_dir.absolute())
    except SandboxError as e:
        err.print(str(e))
        raise typer.Exit(1) from None
    if not cfg.k8s:
        err.print("[red]refused:[/red] the inference gateway runs in k8s mode (sandbox up --k8s)")
        raise typer.Exit(2)
    if not cfg.inference:
        err.print("[red]refused:[/red] this sandbox was started without its inference side")
        raise typer.Exit(2)
    if rps < 0:
        err.print("[red]refused:[/red] --rps must be 0 or more")
        raise typer.Exit(2)
    url = cfg.inference_gateway_url
    console.print(
        f"load: {rps:g} rps to {url}/v1/infer" + (f" for {duration:g}s" if duration else "")
    )

    async def run() -> Any:
        load = Load(url, rps)
        await load.start()
        try:
            await asyncio.sleep(duration if duration is not None else float("inf"))
        except asyncio.CancelledError:
            pass
        finally:
            stats = await load.stop(drain=duration is not None)
        return stats.summary()

    try:
        summary = asyncio.run(run())
    except KeyboardInterrupt:
        console.print("interrupted")
        return

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1000:.0f} ms"

    console.print(
        f"sent {summary['sent']} in {summary['sending_s']:.1f}s: {summary['achieved_rps']:.2f} "
        f"rps; ok {summary['ok']}, errors {summary['errors']}; p50 {ms(summary['p50_s'])}, "
        f"p95 {ms(summary['p95_s'])}; codes {summary['codes']}"
    )
    if summary["errors"]:
        raise typer.Exit(1)


# --- worker -------------------------------------------------------------------------------


@commands.command("chaos")
def chaos_cmd(
    fault: Annotated[str, typer.Option(help="The fault to inject, e.g. XID_79.")] = "XID_79",
    node: Annotated[
        str | None, typer.Option(help="The node; default: a random node of a running job.")
    ] = None,
    broken_until: Annotated[
        BrokenUntil | None,
        typer.Option(help="Make the machine's fault real until this repair."),
    ] = None,
    kill: Annotated[
        Killable | None,
        typer.Option("--kill", help="SIGKILL this and start it again at --at."),
    ] = None,
    at: Annotated[
        ChaosAt | None,
        typer.Option(
            "--at",
            help="The step: drain, requeue, wait_idle, repair, wait_registered, health_gate, "
            "return_to_service; or repair:before-cloud / repair:after-cloud (the repair's "
            "cloud call not yet / already recorded by the Crusoe emulator).",
        ),
    ] = None,
    wipe_worker_disk: Annotated[
        bool,
        typer.Option(
            "--wipe-worker-disk",
            help="Delete what the worker keeps on disk between the crash and the restart.",
        ),
    ] = False,
    kill_worker_at: Annotated[
        ChaosAt | None, typer.Option(help="Same as --kill worker --at STEP.")
    ] = None,
    restart_temporal_at: Annotated[
        ChaosAt | None, typer.Option(help="Restart the Temporal server (SIGTERM) at this step.")
    ] = None,
    effect: Annotated[
        str,
        typer.Option(
            help="What the fault does to the jobs on the node: crash, hang, lost, slow, none, "
            "or default (the fault's realistic effect: docs/sandbox.md)."
        ),
    ] = "none",
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
    state_dir: StateDir = DEFAULT_SANDBOX_DIR,
) -> None:
    """Inject a fault into the sandbox, optionally crashing a process mid-incident.

    The report counts the cloud operations the Crusoe emulator performed on the node's
    machines during the incident (one per repair: a retried repair resumes, it does not
    repeat)."""
    from autoclusters.core.policy import Rung
    from autoclusters.sandbox import cluster as sb
    from autoclusters.sandbox.drivers.chaos import ChaosError, run_chaos
    from autoclusters.sandbox.runtime.daemons import SandboxError

    try:
        cfg = sb.load(state_dir.absolute())
        rung = Rung(broken_until) if broken_until else None
        report = asyncio.run(
            run_chaos(
                cfg, fault, node=node, broken_until=rung, kill_worker_at=kill_worker_at,
                restart_temporal_at=restart_temporal_at, console=err, kill=kill, at=at,
                wipe_worker_disk_on_restart=wipe_worker_disk, effect=effect,
            )
        )  # fmt: skip
    except (SandboxError, ChaosError, ValueError) as e:
        err.print(f"[red]chaos failed:[/red] {e}")
        raise typer.Exit(1) from None
    if as_json:
        print(report.model_dump_json())
    else:
        console.print(report.model_dump())


# --- demo ---------------------------------------------------------------------------------


@commands.command("demo")
def demo(
    as_json: Annotated[
        bool, typer.Option("--json", help="End with one JSON summary line.")
    ] = False,
    keep: Annotated[bool, typer.Option(help="Leave the sandbox running afterwards.")] = False,
    state_dir: StateDir = DEFAULT_SANDBOX_DIR,
    port_base: Annotated[int, typer.Option(help="First of the sandbox's ports.")] = 17200,
    boot_delay: Annotated[float, typer.Option(help="Seconds a replacement VM takes to boot.")] = 20,
    fault: Annotated[str, typer.Option(help="The fault to inject.")] = "XID_79",
    mode: Annotated[
        DemoMode, typer.Option(help="observe (touch nothing), approve (wait for a human), auto.")
    ] = "auto",
    k8s: Annotated[
        bool,
        typer.Option("--k8s/--no-k8s", help="Slinky-style cluster: Kubernetes + Crusoe emulators."),
    ] = True,
    spares: Annotated[int, typer.Option(help="Hot spare nodes, kept drained until needed.")] = 0,
    broken_until: Annotated[
        BrokenUntil,
        typer.Option(
            help="The faulty machine's GPU is fixed only by this repair: "
            "with replace, the reboot fails the health gate and the incident escalates."
        ),
    ] = "replace",
    scenario: Annotated[
        Scenario,
        typer.Option(
            help="remediate: a GPU fault and its remediation; share: GPU nodes lent to "
            "inference as its load rises and returned when it falls; hang, slow: a training "
            "rank that hangs or slows down with no Xid, found by the job's progress; leaf: "
            "a bad InfiniBand leaf, one systemic incident for its four nodes."
        ),
    ] = "remediate",
    platform: Annotated[Platform, typer.Option(help=PLATFORM_HELP)] = "managed-slurm",
    job_recovery: Annotated[
        JobRecovery,
        typer.Option(
            help="in-job: the job holds a standby node in its allocation and the runbook has it "
            "go on without the faulty node; requeue: a 2-node job that Slurm requeues."
        ),
    ] = "in-job",
    job: Annotated[
        DemoJob,
        typer.Option(
            help="auto: the torchrun job of examples/training where torch is installed, else "
            "the stand-in; stand-in: the job that only logs progress (no in-job mode)."
        ),
    ] = "auto",
    fault_effect: Annotated[
        str | None,
        typer.Option(
            help="What the fault does to the job's rank on the node: crash, hang, lost, slow, "
            "none, or default (the fault's realistic effect; XID_79: hang). "
            "Unset: the demo's default (sandbox/drivers/demo.py, DEMO_FAULT_EFFECT)."
        ),
    ] = None,
    slow_factor: Annotated[
        float, typer.Option(help="--scenario slow: how many times longer the rank's steps take.")
    ] = 2.0,
) -> None:
    """Sandbox up, a 2-node training job, a fault on one of its nodes, the remediation, a
    summary (`--scenario share`: training and inference sharing the GPU nodes)."""
    from autoclusters.sandbox.drivers.demo import DemoError, run_demo
    from autoclusters.sandbox.runtime.config import SandboxConfig

    if scenario not in ("remediate", "share", "borrow", "hang", "slow", "leaf"):
        err.print(
            "[red]refused:[/red] --scenario must be remediate, share, borrow, hang, slow or "
            f"leaf, not {scenario!r}"
        )
        raise typer.Exit(2)
    if scenario == "leaf":  # sandbox/drivers/leaf_demo.py: a bad leaf, one systemic incident
        from autoclusters.sandbox.drivers.leaf_demo import main as leaf_demo

        raise typer.Exit(leaf_demo(as_json, keep, state_dir, port_base, boot_delay, k8s))
    # sandbox/drivers/sharing_borrow_demo.py: a node lent from inference for a repair
    if scenario == "borrow":
        from autoclusters.sandbox.drivers.sharing_borrow_demo import main as sharing_borrow_demo

        raise typer.Exit(sharing_borrow_demo(as_json, keep, state_dir, port_base, boot_delay))
    if scenario == "share":
        _sharing_demo(as_json, keep, state_dir, port_base, boot_delay)
        return
    if scenario in ("hang", "slow"):
        _silent_demo(scenario, slow_factor, as_json, keep, state_dir, port_base, boot_delay, k8s)
        return

    if mode not in ("observe", "approve", "auto"):
        err.print(f"[red]refused:[/red] --mode must be observe, approve or auto, not {mode!r}")
        raise typer.Exit(2)
    if job_recovery not in ("in-job", "requeue"):
        err.print("[red]refused:[/red] --job-recovery must be in-job or requeue")
        raise typer.Exit(2)
    if broken_until not in ("reset_gpu", "reboot", "replace"):
        err.print("[red]refused:[/red] --broken-until must be reset_gpu, reboot or replace")
        raise typer.Exit(2)
    cfg = SandboxConfig(
        state_dir=state_dir.absolute(),
        port_base=port_base,
        boot_delay_s=boot_delay,
        k8s=k8s,
        spares=spares,
        platform=platform,
    )
    from autoclusters.sandbox.machines.fault_effects import EFFECTS

    if fault_effect is not None and fault_effect not in (*EFFECTS, "default"):
        choices = ", ".join(EFFECTS)
        err.print(f"[red]refused:[/red] --fault-effect must be one of {choices} or default")
        raise typer.Exit(2)
    out = err if as_json else console
    try:
        summary = asyncio.run(
            run_demo(
                cfg,
                fault=fault,
                keep=keep,
                console=out,
                mode=mode,
                broken_until=broken_until,
                job_recovery=job_recovery,
                stand_in=job == "stand-in",
                fault_effect=fault_effect,
            )  # fmt: skip
        )
    except DemoError as e:
        err.print(f"[red]demo failed:[/red] {e}")
        raise typer.Exit(1) from None
    _print_summary(summary, err if as_json else console)
    if as_json:
        print(summary.model_dump_json())


def _sharing_demo(
    as_json: bool, keep: bool, state_dir: Path, port_base: int, boot_delay: float
) -> None:
    from autoclusters.sandbox.drivers.demo import DemoError
    from autoclusters.sandbox.drivers.sharing_demo import print_share_summary, run_sharing_demo
    from autoclusters.sandbox.runtime.config import SandboxConfig

    cfg = SandboxConfig(
        state_dir=state_dir.absolute(), port_base=port_base, boot_delay_s=boot_delay, k8s=True
    )
    out = err if as_json else console
    try:
        summary = asyncio.run(run_sharing_demo(cfg, keep=keep, console=out))
    except DemoError as e:
        err.print(f"[red]demo failed:[/red] {e}")
        raise typer.Exit(1) from None
    print_share_summary(summary, out)
    if as_json:
        print(summary.model_dump_json())


def _silent_demo(
    scenario: str,
    factor: float,
    as_json: bool,
    keep: bool,
    state_dir: Path,
    port_base: int,
    boot_delay: float,
    k8s: bool,
) -> None:
    from autoclusters.sandbox.drivers.demo import DemoError
    from autoclusters.sandbox.drivers.silent_demo import print_silent_summary, run_silent_demo
    from autoclusters.sandbox.machines.job_faults import parse_factor
    from autoclusters.sandbox.runtime.config import SandboxConfig

    try:
        parse_factor(factor)
    except ValueError as e:
        err.print(f"[red]refused:[/red] --slow-factor: {e}")
        raise typer.Exit(2) from None
    cfg = SandboxConfig(
        state_dir=state_dir.absolute(), port_base=port_base, boot_delay_s=boot_delay, k8s=k8s
    )
    out = err if as_json else console
    try:
        summary = asyncio.run(run_silent_demo(cfg, scenario, keep, out, factor))
    except DemoError as e:
        err.print(f"[red]demo failed:[/red] {e}")
        raise typer.Exit(1) from None
    print_silent_summary(summary, out)
    if as_json:
        print(summary.model_dump_json())
    if summary.status != "resolved" or not summary.right_node:
        raise typer.Exit(1)


def _print_summary(summary: Any, out: Console) -> None:
    def secs(v: float | None) -> str:
        return f"{v:.1f} s" if v is not None else "n/a"

    out.print()
    out.print(
        f"[bold]incident[/bold]           {summary.incident_id} ({summary.status}; "
        f"mode {summary.mode}, rung {summary.rung})"
    )
    out.print(
        f"node / fault       {summary.node} / {summary.fault} (effect on the job: "
        f"{summary.fault_effect})"
    )
    out.print(
        f"[bold]provisioning[/bold]       {secs(summary.provision_s)}  "
        "(cluster spec → cluster ready, ClusterProvisioning)"
    )
    out.print(
        f"[bold]detection[/bold]          {secs(summary.detect_s)}  (GPU fault → incident, "
        f"by {summary.detected_by})"
    )
    out.print(
        f"alert path         {secs(summary.alert_path_detect_s)}  "
        "(GPU fault → Prometheus → Alertmanager → the API; n/a: not before the summary)"
    )
    out.print(
        f"[bold]job recovery[/bold]       {secs(summary.job_recovery_s)}  "
        "(fault → the job logs progress again)"
    )
    out.print(
        f"[bold]capacity recovery[/bold]  {secs(summary.capacity_recovery_s)}  "
        f"(fault → node back in service; boot delay {summary.boot_delay_s:.0f} s)"
    )
    out.print(
        f"job {summary.job_id}             restarts {summary.job_restarts}: "
        f"{', '.join(summary.job_nodes_before)} → {', '.join(summary.job_nodes_after)}"
        + (f" ({summary.recovery_path})" if summary.recovery_path else "")
    )
    if summary.resumed_from_step is not None:
        out.print(
            f"training           resumed from step {summary.resumed_from_step}, "
            f"reached step {summary.last_step}, {summary.steps_recomputed} steps done again "
            f"({summary.job})"
        )
    out.print(f"node before/after  {summary.node_state_before} / {summary.node_state_after}")
    out.print(f"machine            {summary.old_vm_id} → {summary.new_vm_id}")
    if summary.spare_node:
        out.print(f"hot spare          {summary.spare_node} serves; {summary.node} is the spare")
    if summary.silence_id:
        out.print(f"silence            {summary.silence_id} (the node's other alerts, lifted)")
    if (sc := summary.screen) is not None:
        with_whom = f"with {sc.neighbour}" if sc.neighbour else "alone (no idle neighbour)"
        bw = f", {sc.busbw_gbps:.3f} GB/s bus" if sc.busbw_gbps is not None else ""
        out.print(
            f"screen             {'passed' if sc.passed else 'FAILED'} in {sc.seconds:.1f} s "
            f"{with_whom} ({sc.backend or 'no'} all-reduce{bw}; screens run: {sc.screens})"
        )
    for line in summary.planned_steps:
        out.print(f"would              {line}")
    t = Table("step", "outcome", "seconds")
    for st in summary.steps:
        t.add_row(st.name, st.outcome, f"{st.duration_s:.2f}" if st.duration_s is not None else "")
    out.print(t)
    out.print(f"Temporal UI        {summary.temporal_ui}")
