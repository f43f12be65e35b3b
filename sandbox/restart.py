"""`sandbox restart COMPONENT`: stop one process of a running sandbox by its recorded PID
(SIGTERM, or SIGKILL: a crash), wait until that PID has exited, start it again with the
same command line and environment, and wait until it is ready. Jobs, drains, incidents and
the emulated clouds' worlds are left as they are:

- slurmctld comes back from its saved state (without `-c`, which would forget the jobs);
  slurmstepd runs the jobs' steps outside it, so they keep running;
- the Temporal dev server comes back on the same SQLite file, only after the old PID exited
  (it holds that file);
- the emulators come back on their state files, which they rewrite after every change
  (sandbox/runtime/config.py `emulator_state`): what a request changed before the stop is there,
  even one answered a moment before the signal;
- on CMK an agent is its DaemonSet's pod: SIGTERM deletes the pod (the DaemonSet makes a
  new one, whose process is the new agent), SIGKILL crashes its container (the kubelet
  starts it again in the same pod): sandbox/slinky/agent_pods.py.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from autoclusters.core.process_start import start_ticks
from autoclusters.integrations.tls import default_verify
from autoclusters.sandbox import cluster, monitoring
from autoclusters.sandbox.crusoe import cloud_api
from autoclusters.sandbox.inference import launch as inference_sandbox
from autoclusters.sandbox.runtime import daemons
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.runtime.daemons import SandboxError
from autoclusters.sandbox.runtime.processes import ProcessRecord, ProcessTable, _signal
from autoclusters.sandbox.slinky import agent_pods
from autoclusters.sandbox.slinky import kubernetes_mode as slinky

SLURMD_PREFIX = "slurmd-"
AGENT_PREFIX = "agent-"


@dataclass
class Restarted:
    name: str
    old_pid: int
    new_pid: int
    signal: str  # what stopped the old process


@dataclass
class _Spec:
    env: dict[str, str]
    ready: Callable[[], bool]


def components(cfg: SandboxConfig) -> list[str]:
    """What can be restarted: every process the sandbox recorded, in start order."""
    recorded = {r.name for r in ProcessTable(cfg.state_dir).records()}
    order = cluster._order(cfg)
    return [n for n in order if n in recorded] + sorted(recorded - set(order))


def _node_responding(cfg: SandboxConfig, node: str) -> bool:
    return any(n.name == node and n.responding for n in cluster.sinfo(cfg))


def _spec(cfg: SandboxConfig, name: str) -> _Spec:
    """The environment `sandbox up` gave the process, and when it is ready again."""
    worker_env = daemons.worker_env(cfg)
    fixed: dict[str, _Spec] = {
        "munged": _Spec({}, lambda: daemons.munge_ready(cfg)),
        "temporal": _Spec({}, lambda: daemons.temporal_ready(cfg)),
        "slurmctld": _Spec(daemons.slurm_env(cfg), lambda: bool(cluster.sinfo(cfg))),
        cluster.WORKER: _Spec(worker_env, lambda: cluster._worker_polling(cfg)),
        cluster.API: _Spec(worker_env, lambda: _answers(f"{cfg.api_url}/healthz")),
        cluster.SLACK: _Spec({}, lambda: daemons.port_open(cfg.slack_port)),
        slinky.K8S_EMULATOR: _Spec({}, lambda: slinky.k8s_answers(cfg)),
        # Both come back on their data dirs (Prometheus's TSDB, Alertmanager's silences).
        monitoring.PROMETHEUS: _Spec({}, lambda: monitoring.ready(cfg.prometheus_url)),
        monitoring.ALERTMANAGER: _Spec({}, lambda: monitoring.ready(cfg.alertmanager_url)),
        # The kubelet finds its pods' servers again by PID (the process table); the gateway
        # re-reads the Ready pods from the emulator.
        inference_sandbox.KUBELET: _Spec({}, lambda: True),
        inference_sandbox.GATEWAY: _Spec({}, lambda: inference_sandbox.gateway_ready(cfg)),
    }
    if name in fixed:
        return fixed[name]
    if name == cloud_api.CRUSOE_EMULATOR:
        return _Spec(
            cloud_api.crusoe_emulator_env(cfg),
            lambda: cloud_api.answers(cfg.crusoe_port, "/_emulator/health"),
        )
    if name.startswith(SLURMD_PREFIX):
        node = name.removeprefix(SLURMD_PREFIX)
        return _Spec(daemons.slurm_env(cfg), lambda: _node_responding(cfg, node))
    if name.startswith(AGENT_PREFIX):
        return _Spec(daemons.agent_env(cfg), lambda: True)
    raise SandboxError(f"{name}: not a component this sandbox knows how to start")


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2, verify=default_verify()).status_code < 500
    except httpx.HTTPError:
        return False


def _argv(cfg: SandboxConfig, rec: ProcessRecord) -> list[str]:
    """The recorded command line, less what would undo the sandbox's state."""
    argv = list(rec.argv)
    if rec.name == "slurmctld":
        argv = [a for a in argv if a != "-c"]  # -c: clear all jobs (a fresh sandbox only)
    return argv


def _wait_exited(rec: ProcessRecord, timeout_s: float) -> bool:
    from autoclusters.sandbox.runtime.processes import _exited, wait_until

    return wait_until(lambda: _exited(rec), timeout_s, 0.05)


def stop(cfg: SandboxConfig, name: str, *, kill: bool = False, timeout_s: float = 30) -> int:
    """Stop one component by its recorded PID and wait until that PID has exited; return it.
    SIGTERM (SIGKILL after `timeout_s`), or SIGKILL at once with `kill`."""
    table = ProcessTable(cfg.state_dir)
    rec = table.get(name)
    if rec is None or start_ticks(rec.pid) != rec.start_ticks:
        raise SandboxError(
            f"{name} is not running in the sandbox in {cfg.state_dir} "
            f"(components: {', '.join(components(cfg)) or 'none'})"
        )
    if kill:
        table.kill(name)
        return rec.pid
    _signal(rec.pid, signal.SIGTERM)
    if not _wait_exited(rec, timeout_s):
        _signal(rec.pid, signal.SIGKILL)
        _wait_exited(rec, 30)
    table.stop(name)  # it has exited: this only forgets the record
    return rec.pid


def restart(
    cfg: SandboxConfig,
    name: str,
    *,
    kill: bool = False,
    timeout_s: float = 60,
    between: Callable[[], object] | None = None,
) -> Restarted:
    """Restart one component of a running sandbox; see the module's docstring. `between`
    runs once the old process has exited and before the new one starts (chaos: look at
    the world as the crash left it, wipe the worker's disk)."""
    table = ProcessTable(cfg.state_dir)
    rec = table.get(name)
    if rec is None or not table.alive(name):
        raise SandboxError(
            f"{name} is not running in the sandbox in {cfg.state_dir} "
            f"(components: {', '.join(components(cfg)) or 'none'})"
        )
    if cfg.cmk and name.startswith(AGENT_PREFIX):
        # On CMK an agent is a pod of its DaemonSet: restarted as Kubernetes restarts one
        # (the pod deleted and made again, or its crashed container started again).
        old_pid, new_pid = agent_pods.restart(
            cfg, name, kill=kill, timeout_s=timeout_s, between=between
        )
        return Restarted(name, old_pid, new_pid, "SIGKILL" if kill else "SIGTERM")
    spec = _spec(cfg, name)
    argv = _argv(cfg, rec)
    old = stop(cfg, name, kill=kill)
    if between is not None:
        between()
    result = cluster.UpResult(already_running=True)
    cluster._start(table, name, argv, spec.env, spec.ready, timeout_s, result)
    new = table.get(name)
    assert new is not None
    return Restarted(
        name=name, old_pid=old, new_pid=new.pid, signal="SIGKILL" if kill else "SIGTERM"
    )
