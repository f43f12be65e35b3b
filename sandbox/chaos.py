"""Breaking the sandbox on purpose, by PID: kill the worker, restart the Temporal server.

Durable execution is the claim under test: an incident must finish correctly when its
worker dies mid-step or the workflow server restarts, with no step's effect applied twice.
"""

from __future__ import annotations

from autoclusters.sandbox import cluster, daemons
from autoclusters.sandbox.config import SandboxConfig
from autoclusters.sandbox.processes import ProcessTable


def kill_worker(cfg: SandboxConfig) -> int:
    """SIGKILL the worker (no graceful shutdown: a crash); return the PID killed."""
    pid = ProcessTable(cfg.state_dir).kill(cluster.WORKER)
    if pid is None:
        raise daemons.SandboxError("the sandbox's worker is not running")
    return pid


def start_worker(cfg: SandboxConfig, timeout_s: float = 60) -> int:
    """A new worker (after a kill); return its PID."""
    table = ProcessTable(cfg.state_dir)
    cluster.start_worker(cfg, table, timeout_s, cluster.UpResult(already_running=False))
    rec = table.get(cluster.WORKER)
    assert rec is not None
    return rec.pid


def restart_temporal(cfg: SandboxConfig, timeout_s: float = 60) -> int:
    """Stop the Temporal dev server (by PID, waiting for it to exit: it holds its SQLite
    file) and start it again on the same file; return the new PID."""
    table = ProcessTable(cfg.state_dir)
    table.stop("temporal")
    cluster.start_temporal(cfg, table, timeout_s, cluster.UpResult(already_running=False))
    rec = table.get("temporal")
    assert rec is not None
    return rec.pid
