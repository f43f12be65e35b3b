"""`autoclusters agent run` (the per-node health agent) and `autoclusters inject` (fake faults).

Register on the main app with::

    app.add_typer(agent_app, name="agent")
    app.add_typer(inject_app, name="inject")

`python -m clients.cli.agent agent run ...` / `... inject ...` runs the same commands on
their own, which is how a GPU machine without the full CLI set-up can run the agent.

Exit codes: 0 the agent ran (with `--once`: and found no fault), 1 `--once` found a firing
fault, 2 it cannot run (NVML unavailable, bad options), 3 it stopped to start again under
the Slurm name the runbook gave its Kubernetes Node (`--slurm-name-from-node`). Errors
are one line on stderr.
"""

from __future__ import annotations

import functools
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

if TYPE_CHECKING:
    from autoclusters.clients.agent.agent import Agent, CheckResult
    from autoclusters.clients.agent.settings import AgentSettings
    from autoclusters.clients.agent.slurm_name import SlurmName

agent_app = typer.Typer(no_args_is_help=True, help="The per-node GPU and InfiniBand health agent.")
inject_app = typer.Typer(
    invoke_without_command=True, help="Make a fault appear on a node running the fake backend."
)


@agent_app.callback()
def _group() -> None:
    # Keeps `run` a named sub-command while it is the only one.
    pass


# Fixed sets are typed as such: anything else is Typer's usage error (exit 2, naming them).
Backend = Literal["nvml", "fake"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(message, err=True)
    return typer.Exit(code)


def default_fake_file(node: str) -> Path:
    """Where the sandbox's agent for `node` and `inject` meet by default."""
    from autoclusters.core.settings import DEFAULT_SANDBOX_DIR

    return DEFAULT_SANDBOX_DIR / "agent" / f"{node}.json"


@agent_app.command("run")
def run(
    node: Annotated[str, typer.Option(help="This node's name, as Slurm/Kubernetes know it.")],
    backend: Annotated[
        Backend, typer.Option(help="nvml (real GPUs) or fake (a JSON file).")
    ] = "nvml",
    fake_file: Annotated[
        Path | None,
        typer.Option(
            help="The fake backend's file (default: ~/.autoclusters/sandbox/agent/NODE.json)."
        ),
    ] = None,
    sysfs_root: Annotated[
        Path | None,
        typer.Option(
            help="Read InfiniBand from ROOT/class/infiniband "
            "(default: /sys for nvml, the fake file for fake)."
        ),
    ] = None,
    api: Annotated[
        str | None, typer.Option(help="API base URL: reports go to API/v1/reports.")
    ] = None,
    token: Annotated[
        str | None, typer.Option(help="Bearer token (better: AUTOCLUSTERS_AGENT_TOKEN).")
    ] = None,
    spool_dir: Annotated[
        Path | None,
        typer.Option(help="Unsent reports and state (default: ~/.autoclusters/agent/NODE)."),
    ] = None,
    interval: Annotated[
        float | None,
        typer.Option(help="Seconds between checks (default: 10); GPU events do not wait for one."),
    ] = None,
    snapshot_interval: Annotated[
        float | None,
        typer.Option(help="Seconds between health snapshots to the API (default: 10)."),
    ] = None,
    expected_gpus: Annotated[int | None, typer.Option(help="GPUs the node has.")] = None,
    hold_checks: Annotated[
        int | None,
        typer.Option(
            help="Checks a condition must hold before it is reported (default: 3); a port "
            "down is held in seconds instead (AUTOCLUSTERS_AGENT_LINK_HOLD_S, default 2)."
        ),
    ] = None,
    once: Annotated[
        bool, typer.Option("--once", help="One check without debounce, then exit.")
    ] = False,
    print_: Annotated[
        bool, typer.Option("--print", help="Print reports as JSON lines instead of sending them.")
    ] = False,
    show_readings: Annotated[
        bool, typer.Option("--show-readings", help="Print each check's readings (JSON).")
    ] = False,
    k8s_condition: Annotated[
        bool, typer.Option("--k8s-condition", help="Also set the node's GpuUnhealthy condition.")
    ] = False,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(help="For --k8s-condition and --slurm-name-from-node (default: in-cluster)."),
    ] = None,
    slurm_name_from_node: Annotated[
        bool,
        typer.Option(
            "--slurm-name-from-node",
            help="--node is the Kubernetes Node: report as the Slurm node Slinky runs on it "
            "(its hostname-override annotation, else its name), and stop (exit 3) to start "
            "again under a new name when the runbook names a replacement's Node.",
        ),
    ] = False,
    metrics_port: Annotated[
        int | None,
        typer.Option(help="Serve dcgm-exporter's series on /metrics on this port (default: off)."),
    ] = None,
    log_level: Annotated[
        LogLevel, typer.Option(case_sensitive=False, help="How much to log.")
    ] = "INFO",
) -> None:
    """Check this node's GPUs and InfiniBand every interval, and at once on a GPU event
    (an Xid, a recovery action, a GPU lost); report faults to the API."""
    from pydantic import ValidationError

    from autoclusters.clients.agent.settings import AgentSettings

    logging.basicConfig(
        level=log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s"
    )
    overrides: dict[str, Any] = {
        k: v
        for k, v in {
            "api_url": api, "token": token, "spool_dir": spool_dir, "interval_s": interval,
            "expected_gpus": expected_gpus, "hold_checks": hold_checks, "kubeconfig": kubeconfig,
            "snapshot_interval_s": snapshot_interval, "metrics_port": metrics_port,
        }.items()
        if v is not None
    }  # fmt: skip
    if k8s_condition:
        overrides["k8s_condition"] = True
    if once:
        overrides |= {
            "hold_checks": 1, "clear_checks": 1, "hold_checks_by_fault": {}, "link_hold_s": 0,
        }  # fmt: skip
    try:
        settings = AgentSettings(**overrides)
    except ValidationError as e:
        raise _fail(f"bad agent settings: {e}") from None
    if not print_ and not settings.api_url:
        raise _fail("say where reports go: --api URL (or AUTOCLUSTERS_AGENT_API_URL), or --print")
    kube_node, namer = node, None
    if slurm_name_from_node:
        namer = _namer(kube_node, settings)
        found = namer.wait_read(threading.Event())
        assert found is not None  # only a set event stops the wait
        node = found
        logging.getLogger(__name__).info("Kubernetes Node %s is Slurm node %s", kube_node, node)
    agent = _build(
        node, settings, backend, fake_file, sysfs_root, print_=print_, spool_dir=spool_dir,
        kube_node=kube_node,
    )  # fmt: skip
    try:
        if once:
            result = agent.check()
            if show_readings:
                _print_readings(result)
            if result.firing:
                raise typer.Exit(1)
            return
        follow = None
        if namer is not None:
            follow = functools.partial(namer.follow, node)
        if _run_forever(agent, show_readings=show_readings, follow=follow):
            raise typer.Exit(3)  # renamed: the pod starts again under the new name
    finally:
        if agent.backend is not None:
            agent.backend.close()


def _build(
    node: str,
    settings: AgentSettings,
    backend_name: str,
    fake_file: Path | None,
    sysfs_root: Path | None,
    *,
    print_: bool,
    spool_dir: Path | None,
    kube_node: str | None = None,
) -> Agent:
    from autoclusters.clients.agent.agent import STATE_FILE, Agent
    from autoclusters.clients.agent.backend import BackendUnavailable, GpuBackend, IbSource
    from autoclusters.clients.agent.fake_backend import FakeBackend, FakeInfiniband
    from autoclusters.clients.agent.infiniband import SysfsInfiniband
    from autoclusters.clients.agent.nvml_backend import NvmlBackend
    from autoclusters.clients.agent.reporter import (
        HttpSender,
        PrintSink,
        Reporter,
        ReportSink,
        Spool,
    )

    gpu: GpuBackend
    ib: IbSource
    if backend_name == "nvml":
        gpu = NvmlBackend(timeout_s=settings.nvml_timeout_s, event_wait_ms=settings.event_wait_ms)
        ib = SysfsInfiniband(sysfs_root or "/sys")
    else:
        path = fake_file or default_fake_file(node)
        gpu = FakeBackend(path, gpus=settings.expected_gpus or 8)
        ib = SysfsInfiniband(sysfs_root) if sysfs_root else FakeInfiniband(path)
    try:
        gpu.open()
    except BackendUnavailable as e:
        raise _fail(str(e)) from None
    except Exception as e:  # whatever else opening throws: one line, not a traceback
        raise _fail(f"{backend_name} backend unavailable: {type(e).__name__}: {e}") from None
    spool = settings.spool_for(node)
    sink: ReportSink
    sender: HttpSender | None = None  # also sends the health snapshots
    if print_:
        sink = PrintSink()
    else:
        token = settings.token.get_secret_value() if settings.token else None
        assert settings.api_url is not None
        sender = HttpSender(api=settings.api_url, token=token, timeout_s=settings.request_timeout_s)
        if settings.report_faults:
            sink = Reporter(
                spool=Spool(spool),
                sender=sender,
                attempts=settings.send_attempts,
                backoff_s=settings.backoff_s,
                max_backoff_s=settings.max_backoff_s,
            )
        else:  # faults reach the API another way (Prometheus -> Alertmanager): log, send none
            sink = PrintSink(sys.stderr)
    # --print leaves no state behind unless a spool directory was named.
    state = spool / STATE_FILE if (not print_ or spool_dir is not None) else None
    return Agent(
        node=node, settings=settings, backend=gpu, infiniband=ib, sink=sink, state_file=state,
        condition=_condition(kube_node or node, settings), snapshots=sender,
    )  # fmt: skip


def _condition(node: str, settings: AgentSettings) -> Any:
    if not settings.k8s_condition:
        return None
    from autoclusters.clients.agent.node_condition import NodeCondition
    from autoclusters.integrations.k8s import api_client

    try:
        return NodeCondition(node=node, api_client=api_client(kubeconfig=settings.kubeconfig))
    except Exception as e:
        raise _fail(f"--k8s-condition: cannot reach Kubernetes: {e}") from None


def _namer(kube_node: str, settings: AgentSettings) -> SlurmName:
    from autoclusters.clients.agent.slurm_name import SlurmName
    from autoclusters.integrations.k8s import api_client

    try:
        return SlurmName(api_client(kubeconfig=settings.kubeconfig), kube_node)
    except Exception as e:
        raise _fail(f"--slurm-name-from-node: cannot reach Kubernetes: {e}") from None


Follow = Callable[[threading.Event, Callable[[str], None]], None]


def _run_forever(agent: Agent, *, show_readings: bool, follow: Follow | None = None) -> bool:
    """Run until SIGTERM/SIGINT, or until `follow` says the node has a new name: True then."""
    stop = threading.Event()
    renamed: list[str] = []

    def stop_now(*_: object) -> None:
        stop.set()
        agent.wake()  # ends the loop's wait at once

    def rename(name: str) -> None:
        logging.getLogger(__name__).warning(
            "this machine is Slurm node %s now, not %s: stopping, to start again as %s",
            name, agent.node, name,
        )  # fmt: skip
        renamed.append(name)
        stop_now()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop_now)
    if follow is not None:
        threading.Thread(target=follow, args=(stop, rename), name="slurm-name", daemon=True).start()
    if show_readings:
        check = agent.check

        def check_and_show(*, event: bool = False) -> CheckResult:
            result = check(event=event)
            _print_readings(result)
            return result

        agent.check = check_and_show  # type: ignore[method-assign]
    logging.getLogger(__name__).info(
        "agent for %s checking every %.0f s, and at once on a GPU event or a port's change "
        "(read every %g s; 0: not watched)",
        agent.node, agent.settings.interval_s, agent.settings.link_watch_s,
    )  # fmt: skip
    agent.run(stop)
    return bool(renamed)


def _print_readings(result: CheckResult) -> None:
    doc = {
        "gpus": result.gpus.model_dump(mode="json") if result.gpus else None,
        "infiniband": result.infiniband.model_dump(mode="json") if result.infiniband else None,
        "findings": {f: x.message for f, x in result.findings.items()},
        "firing": result.firing,
    }
    typer.echo(json.dumps({"readings": doc}, indent=1))


@inject_app.callback()
def inject(
    node: Annotated[str, typer.Option(help="The node whose fake file gets the fault.")],
    fault: Annotated[
        str | None, typer.Option(help="XID_<n>, ECC_DBE, IB_LINK_DOWN, ... (see --help).")
    ] = None,
    fake_file: Annotated[
        Path | None,
        typer.Option(
            help="The fake backend's file (default: ~/.autoclusters/sandbox/agent/NODE.json)."
        ),
    ] = None,
    gpu: Annotated[int, typer.Option(help="Which GPU (index) the fault is on.")] = 0,
    hca: Annotated[
        str | None, typer.Option(help="Which HCA, for IB faults (default: the first).")
    ] = None,
    clear: Annotated[bool, typer.Option("--clear", help="Make the node healthy again.")] = False,
) -> None:
    """Write FAULT into the node's fake-backend file, as NVML or sysfs would show it."""
    from autoclusters.clients.agent import fake_backend
    from autoclusters.core.faults import UnknownFaultError, check_known_fault

    path = fake_file or default_fake_file(node)
    if clear:
        fake_backend.reset(path)
        typer.echo(f"{node}: healthy ({path})")
        return
    if not fault:
        raise _fail(f"say --fault (one of: {', '.join(fake_backend.injectable())}) or --clear")
    try:
        # A kind nobody knows: one line pointing at the catalogue. A known kind the fake
        # cannot produce: the injectable ones are named below.
        check_known_fault(fault)
        fake_backend.inject(path, fault=fault, gpu=gpu, hca=hca)
    except (UnknownFaultError, fake_backend.UnknownFault) as e:
        raise _fail(str(e)) from None
    typer.echo(f"{node}: {fault} injected ({path})")


cli = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
cli.add_typer(agent_app, name="agent")
cli.add_typer(inject_app, name="inject")


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
