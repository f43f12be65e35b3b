"""Breaking the sandbox on purpose, by PID: kill the worker, restart the Temporal server.

Durable execution is the claim under test: an incident must finish correctly when its
worker dies mid-step or the workflow server restarts, with no step's effect applied twice.
The work is `sandbox/restart.py`'s; these are the chaos-shaped names for it.
"""

from __future__ import annotations

from autoclusters.sandbox import cluster, restart
from autoclusters.sandbox.config import SandboxConfig


def kill_and_restart(
    cfg: SandboxConfig, component: str, timeout_s: float = 60
) -> restart.Restarted:
    """SIGKILL one component (a crash, no graceful shutdown) and start it again."""
    return restart.restart(cfg, component, kill=True, timeout_s=timeout_s)


def restart_worker_crashed(cfg: SandboxConfig, timeout_s: float = 60) -> restart.Restarted:
    return kill_and_restart(cfg, cluster.WORKER, timeout_s)


def restart_temporal(cfg: SandboxConfig, timeout_s: float = 60) -> int:
    """Stop the Temporal dev server (SIGTERM, by PID, waiting for it to exit: it holds its
    SQLite file) and start it again on the same file; return the new PID."""
    return restart.restart(cfg, "temporal", timeout_s=timeout_s).new_pid
